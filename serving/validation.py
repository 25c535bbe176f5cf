"""Check request tensors against a signature before they reach a model or a batch.

A bad request must fail alone with a message that says what was expected; caught
here, it never joins a batch where it would fail the other requests with it.

Types are matched exactly, as TensorFlow Serving matches them: a tensor whose dtype is
not the signature's is refused with TensorFlow's own message (``Expects arg[0] to be
float but int32 is provided``) rather than cast, so a float64 is never rounded to a
float32 and an integer never becomes a bool. The argument number is TensorFlow's: the
position of the input among the signature's graph tensor names in sorted order (its
key when the backend knows no tensor name). Only the spelling of a type may differ:
numpy byte or unicode strings for a string input, or the other byte order.

The REST API is not affected: JSON numbers have no type of their own, so
``serving.tensors`` converts them to the signature's dtype before they get here.

A tensor a request declares much larger than it sends (a proto whose few values repeat
to fill its shape) is checked before it is expanded: the shape against the signature,
then the expanded size against ``max_bytes``, the largest message the server accepts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from serving.errors import InvalidArgument
from serving.signature import (
    STRING,
    Signature,
    TensorSpec,
    dtype_info,
    dtype_name,
    shape_text,
    tf_type_name,
)

# The largest tensor a request may expand by repetition, unless the server accepts larger
# messages: no more than a message could carry written out in full. It is also
# serving.config's default ``max_message_bytes``.
MAX_TENSOR_BYTES = 64 << 20


def validate_inputs(
    inputs: Mapping[str, np.ndarray],
    signature: Signature,
    *,
    max_bytes: int = MAX_TENSOR_BYTES,
) -> dict[str, np.ndarray]:
    """``inputs`` as the model takes them, or ``InvalidArgument`` saying why not.

    Names must match exactly; each shape must fit its spec (``None`` dims match any
    size) and each dtype must be the spec's. Inputs need not agree on their first
    dimension (TF Serving's columnar format allows it; the model decides, and the
    batcher runs such a request alone). Arrays that repeat one value over their shape
    (read-only broadcast views, as decoded protos give them) are written out here,
    once they are known to fit, and only if they are at most ``max_bytes``.
    """
    check_names(inputs, signature)
    args = signature.argument_numbers
    checked = {}
    for name, spec in signature.inputs.items():
        array = np.asarray(inputs[name])
        check_declared(spec, array.dtype, array.shape, args[name])
        checked[name] = _settled(spec, array, max_bytes)
    return checked


def check_names(names: Iterable[str], signature: Signature) -> None:
    """The request names exactly the signature's inputs."""
    given = set(names)
    if given == signature.inputs.keys():
        return
    missing = [name for name in signature.inputs if name not in given]
    if missing:
        raise InvalidArgument(
            f"missing input {missing[0]!r}; signature {signature.name!r} takes "
            f"{signature.describe_inputs()}"
        )
    unknown = sorted(name for name in given if name not in signature.inputs)
    if unknown:
        raise InvalidArgument(
            f"unknown input {unknown[0]!r}; signature {signature.name!r} takes "
            f"{', '.join(signature.inputs)}"
        )


def check_declared(spec: TensorSpec, dtype: np.dtype, shape: tuple[int, ...], arg: int) -> None:
    """A tensor of ``dtype`` and ``shape`` fits ``spec``, judged before any value is read.

    The shape comes first (rank and every fixed dimension), then the type, which must
    be the spec's exactly.
    """
    if not spec.accepts_shape(shape):
        raise InvalidArgument(_mismatch(spec, dtype, shape))
    if not _same_type(spec.dtype, dtype):
        raise InvalidArgument(
            f"Expects arg[{arg}] to be {tf_type_name(spec.dtype)} but {tf_type_name(dtype)} "
            f"is provided ({_mismatch(spec, dtype, shape)})"
        )


def check_size(
    label: str, dtype: np.dtype, shape: tuple[int, ...], max_bytes: int = MAX_TENSOR_BYTES
) -> None:
    """``InvalidArgument`` if a tensor expanded to ``shape`` would exceed ``max_bytes``."""
    size = int(np.prod(shape, dtype=object)) * max(np.dtype(dtype).itemsize, 1)
    if size > max_bytes:
        raise InvalidArgument(
            f"{label}: shape {list(shape)} {dtype_name(dtype)} is larger than {max_bytes} "
            "bytes, the largest message this server accepts; send fewer elements"
        )


def _same_type(want: np.dtype, got: np.dtype) -> bool:
    if got == want:
        return True
    if want == STRING:
        return got.kind in "OSU"
    try:
        return dtype_info(got).enum == dtype_info(want).enum
    except ValueError:
        return False


def _settled(spec: TensorSpec, array: np.ndarray, max_bytes: int) -> np.ndarray:
    """The array in the spec's exact dtype, with repeated values written out."""
    if array.size > 1 and 0 in array.strides:
        check_size(f"input {spec.name!r}", array.dtype, array.shape, max_bytes)
        array = np.ascontiguousarray(array)
    if spec.dtype == STRING:
        return _to_bytes(spec, array)
    if array.dtype != spec.dtype:
        return array.astype(spec.dtype)  # the same type in the other byte order
    return array


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


def _mismatch(spec: TensorSpec, dtype: np.dtype, shape: tuple[int, ...]) -> str:
    return (
        f"input {spec.name!r}: expected {spec.describe()}, "
        f"got {dtype_name(dtype)} {shape_text(shape)}"
    )
