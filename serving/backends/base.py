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

from serving.backends.unreadable_images import unreadable_image
from serving.errors import (
    DeadlineExceeded,
    InvalidArgument,
    NotFound,
    ServingError,
    as_serving_error,
)
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


def model_failure(exc: BaseException, inputs: Mapping[str, np.ndarray]) -> ServingError:
    """What a client is told when the model itself failed on ``inputs``.

    Inputs whose first dimensions differ are allowed through (TF Serving's columnar
    format permits it, and a model may take them); when the model then fails, the cause
    is almost always that, so the answer names each input's size as TF Serving's
    batching does, instead of the graph error of whichever op met the mismatch first.
    """
    sizes = {name: array.shape[0] for name, array in inputs.items() if np.ndim(array) >= 1}
    if len(set(sizes.values())) > 1:
        listed = ", ".join(f"{name!r} has {size}" for name, size in sizes.items())
        return InvalidArgument(
            f"input tensors must have equal 0th-dimension size (the number of rows): {listed}"
        )
    image = unreadable_image(exc, inputs)
    if image:
        return InvalidArgument(image)
    return as_serving_error(exc)
