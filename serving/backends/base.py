"""The one interface every way of running a model offers the gateway.

Batching, validation and both APIs only see ``Backend``: a SavedModel in this process,
a TFLite interpreter, or a TensorFlow Serving server across the network all take a
batch of named numpy arrays and return one. ``run`` blocks (the batcher calls it from
its thread pool) and must be safe to call from several threads at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

import numpy as np

from serving.errors import DeadlineExceeded, NotFound
from serving.signature import Signature


@runtime_checkable
class Backend(Protocol):
    """A loaded model: its signatures, batch-in/batch-out execution, and release."""

    signatures: dict[str, Signature]

    def run(
        self, signature_name: str, inputs: dict[str, np.ndarray], timeout: float | None = None
    ) -> dict[str, np.ndarray]:
        """Outputs for validated ``inputs``; ``timeout`` is the seconds left to the deadline."""
        ...

    def close(self) -> None:
        """Release the model; ``run`` must not be called afterwards."""
        ...


def find_signature(signatures: Mapping[str, Signature], name: str) -> Signature:
    """The signature called ``name``, or ``NotFound`` listing the ones that exist."""
    try:
        return signatures[name]
    except KeyError:
        available = ", ".join(sorted(signatures)) or "none"
        raise NotFound(f"signature {name!r} not found; available signatures: {available}") from None


def check_deadline(timeout: float | None) -> None:
    """Refuse to start work whose deadline has already passed (it cannot be interrupted)."""
    if timeout is not None and timeout <= 0:
        raise DeadlineExceeded("deadline exceeded before the model ran")
