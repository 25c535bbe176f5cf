"""Check request tensors against a signature before they reach a model or a batch.

A bad request must fail alone with a message that says what was expected; caught
here, it never joins a batch where it would fail the other requests with it. Casts are
allowed only where no value can change (int8 -> int32, any int -> float, as TensorFlow
Serving's REST API accepts integers for float inputs); float -> int, float64 -> float32
and bool <-> number are refused rather than silently rounded or reinterpreted.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from serving.errors import InvalidArgument
from serving.signature import STRING, Signature, TensorSpec, dtype_name, shape_text


def validate_inputs(
    inputs: Mapping[str, np.ndarray], signature: Signature
) -> dict[str, np.ndarray]:
    """``inputs`` cast to the signature's dtypes, or ``InvalidArgument`` saying why not.

    Names must match exactly; each shape must fit its spec (``None`` dims match any
    size); inputs whose first dimension is the free batch dimension must agree on it.
    """
    missing = [name for name in signature.inputs if name not in inputs]
    if missing:
        raise InvalidArgument(
            f"missing input {missing[0]!r}; signature {signature.name!r} takes "
            f"{signature.describe_inputs()}"
        )
    unknown = sorted(name for name in inputs if name not in signature.inputs)
    if unknown:
        raise InvalidArgument(
            f"unknown input {unknown[0]!r}; signature {signature.name!r} takes "
            f"{', '.join(signature.inputs)}"
        )
    checked = {name: _check(spec, inputs[name]) for name, spec in signature.inputs.items()}
    _check_batch(checked, signature)
    return checked


def _check(spec: TensorSpec, value: np.ndarray) -> np.ndarray:
    array = np.asarray(value)
    if not spec.accepts_shape(array.shape):
        raise InvalidArgument(_mismatch(spec, array))
    if spec.dtype is STRING:
        if array.dtype.kind not in "OSU":
            raise InvalidArgument(_mismatch(spec, array))
        return _to_bytes(spec, array)
    if array.dtype == spec.dtype:
        return array
    if _safe_cast(array.dtype, spec.dtype):
        return array.astype(spec.dtype)
    raise InvalidArgument(_mismatch(spec, array))


def _safe_cast(source: np.dtype, target: np.dtype) -> bool:
    if source.kind in "iu" and target.kind == "f":
        return True
    if source.kind in "bOSUV" or target.kind in "bOSUV":
        return False  # bools are not numbers to a signature, nor numbers bools
    return bool(np.can_cast(source, target, casting="safe"))


def _to_bytes(spec: TensorSpec, array: np.ndarray) -> np.ndarray:
    """Strings as an object array of ``bytes`` (``str`` encoded as UTF-8)."""
    items = array.ravel().tolist()
    if array.dtype.kind == "O" and all(type(item) is bytes for item in items):
        return array
    converted = []
    for item in items:
        if isinstance(item, str):
            item = item.encode("utf-8")
        elif not isinstance(item, bytes):
            raise InvalidArgument(
                f"input {spec.name!r}: expected {spec.describe()}, got an element of type "
                f"{type(item).__name__}"
            )
        converted.append(item)
    out = np.empty(len(converted), dtype=object)
    out[:] = converted
    return out.reshape(array.shape)


def _mismatch(spec: TensorSpec, array: np.ndarray) -> str:
    return (
        f"input {spec.name!r}: expected {spec.describe()}, "
        f"got {dtype_name(array.dtype)} {shape_text(array.shape)}"
    )


def _check_batch(inputs: Mapping[str, np.ndarray], signature: Signature) -> None:
    sizes = {
        name: inputs[name].shape[0]
        for name, spec in signature.inputs.items()
        if spec.shape and spec.shape[0] is None
    }
    if len(set(sizes.values())) > 1:
        described = ", ".join(f"{name!r} has {size}" for name, size in sizes.items())
        raise InvalidArgument(f"inputs disagree on batch size: {described}")
