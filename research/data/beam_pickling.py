"""Beam's bz2 step of pickling, done once per distinct payload instead of once per call.

Beam pickles every DoFn and CombineFn with cloudpickle and compresses the bytes with bz2 at
level 9 (``apache_beam.internal.cloudpickle_pickler``): when a transform is applied, again
when the pipeline is translated, and in the worker, once per stage, to decompress and
sometimes compress again. Three builds of one dataset spec make about 620 compressions of
150 distinct payloads and 980 decompressions of 130; bz2 at level 9 sets up a 900 kB block
for each, however small the payload, which made it a tenth of a small build's time.

Compression and decompression are pure functions of their bytes, so a bounded memo of recent
answers returns exactly what bz2 would: the payloads Beam writes are the ones it always
wrote, and any Beam worker elsewhere (Dataflow, Flink) reads them as before. Only small
payloads are remembered, so the memo stays small whatever a pipeline's functions hold.
"""

from __future__ import annotations

import bz2
import threading
from collections import OrderedDict
from collections.abc import Callable

from apache_beam.internal import cloudpickle_pickler

MAX_ENTRIES = 512
MAX_PAYLOAD_BYTES = 256 * 1024


class _Memo:
    """The most recent answers of one pure bytes -> bytes function, least recent dropped."""

    def __init__(self, function: Callable[[bytes], bytes]) -> None:
        self._function = function
        self._answers: OrderedDict[bytes, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, data: bytes) -> bytes:
        if len(data) > MAX_PAYLOAD_BYTES:
            return self._function(data)
        with self._lock:
            answer = self._answers.get(data)
            if answer is not None:
                self._answers.move_to_end(data)
                return answer
        answer = self._function(data)
        with self._lock:
            self._answers[data] = answer
            if len(self._answers) > MAX_ENTRIES:
                self._answers.popitem(last=False)
        return answer


class MemoizedBz2:
    """What Beam's pickler asks of the ``bz2`` module, with each answer remembered."""

    def __init__(self) -> None:
        self._compressed: dict[int, _Memo] = {}
        self.decompress = _Memo(bz2.decompress)

    def compress(self, data: bytes, compresslevel: int = 9) -> bytes:
        memo = self._compressed.get(compresslevel)
        if memo is None:
            memo = self._compressed.setdefault(
                compresslevel, _Memo(lambda payload: bz2.compress(payload, compresslevel))
            )
        return memo(data)


def install() -> None:
    """Route Beam's pickler through the memo (idempotent)."""
    if not isinstance(cloudpickle_pickler.bz2, MemoizedBz2):
        cloudpickle_pickler.bz2 = MemoizedBz2()  # type: ignore[assignment]
