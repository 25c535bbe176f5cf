"""Deterministic train/validation/test assignment.

A record's split is a pure function of its key and the spec's seed, so the same record
lands in the same split on every run and on every runner, and duplicates (which share
their content) can never straddle train and test.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

import apache_beam as beam

from research.data import records
from research.data.quality import DISTINCT_KEYS, DISTINCT_KEYS_CAP
from research.data.records import Record
from research.data.spec import SplitSpec

SPLIT = "_split"


def split_for_key(key: bytes, ratios: Mapping[str, float], seed: str) -> str:
    """Map a key to a split by where its hash falls in the cumulative ratios."""
    digest = hashlib.sha256(seed.encode("utf-8") + b"\x00" + key).digest()
    point = int.from_bytes(digest[:8], "big") / 2**64
    cumulative = 0.0
    names = list(ratios)
    for name in names:
        cumulative += ratios[name]
        if point < cumulative:
            return name
    return names[-1]


def record_key(record: Record, key_field: str | None) -> bytes:
    """The bytes a record's split is decided by: its key field, or its whole content."""
    if key_field is None:
        return records.content_digest(record)
    return records.canonical_bytes(record.get(key_field))


class _CountDistinct(beam.CombineFn):
    """How many distinct values, up to ``cap`` (the sets stay small on every worker)."""

    def __init__(self, cap: int) -> None:
        self._cap = cap

    def create_accumulator(self) -> set[bytes]:
        return set()

    def add_input(self, seen: set[bytes], digest: bytes) -> set[bytes]:
        if len(seen) < self._cap:
            seen.add(digest)
        return seen

    def merge_accumulators(self, accumulators: Iterable[set[bytes]]) -> set[bytes]:
        merged: set[bytes] = set()
        for seen in accumulators:
            merged.update(seen)
        # Which ones are kept past the cap does not matter: only the count is used.
        return set(sorted(merged)[: self._cap])

    def extract_output(self, seen: set[bytes]) -> int:
        return len(seen)


class AssignSplit(beam.PTransform):
    """Tag every record with its split under the ``_split`` bookkeeping key.

    With a split key, also count its distinct values (``DISTINCT_KEYS``): every record
    with one key lands in one split, so a key with few values can leave a split empty.
    """

    def __init__(self, spec: SplitSpec) -> None:
        super().__init__()
        self._spec = spec

    def expand(self, pcoll: beam.PCollection) -> beam.PCollection:
        spec = self._spec

        def assign(record: Record) -> Record:
            name = split_for_key(record_key(record, spec.key), spec.ratios, spec.seed)
            records.count(f"split.{name}")
            return {**record, SPLIT: name}

        if spec.key is not None:
            _ = (
                pcoll
                | "KeyDigests"
                >> beam.Map(lambda r: hashlib.sha256(record_key(r, spec.key)).digest())
                | "DistinctKeys" >> beam.CombineGlobally(_CountDistinct(DISTINCT_KEYS_CAP))
                | "CountDistinctKeys"
                >> beam.Map(lambda n: records.count(DISTINCT_KEYS, n) if n else None)
            )
        return pcoll | "Assign" >> beam.Map(assign)
