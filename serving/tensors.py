"""Tensors on the wire <-> numpy arrays: ``TensorProto`` for gRPC, JSON for REST.

The gateway is compared against a server that does no work at all, so these
conversions avoid per-element Python where they can: numeric protos go through
``tensor_content`` and ``np.frombuffer`` (no copy), JSON lists through one ``np.array``
call. The semantics are TensorFlow Serving's: typed ``*_val`` fields with fewer values
than the shape broadcast their last value, ``{"b64": ...}`` carries binary strings, and
output tensors whose names end in ``_bytes`` are written back as ``{"b64": ...}``. Every
malformed input raises ``InvalidArgument`` naming the tensor.

A proto's declared shape is judged before its values are read: against the signature
when the caller passes it (``protos_to_inputs``), and always against what numpy can
hold. Repeating a few values to fill a shape is capped at ``MAX_TENSOR_BYTES`` (the
largest message the server accepts); one repeated value is a broadcast view that
costs nothing until ``validate_inputs`` has checked it against the signature. JSON
numbers take the signature's dtype as ``json_tensor.cc`` gives it to them.

Importing the ``TensorProto`` class loads the ``tensorflow`` package (the protos live
in it); nothing else from TensorFlow runs here.
"""

from __future__ import annotations

import base64
import binascii
import math
import sys
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from tensorflow.core.framework.tensor_pb2 import TensorProto

from serving.errors import InvalidArgument
from serving.signature import STRING, Signature, TensorSpec, dtype_info, dtype_name
from serving.validation import (
    MAX_TENSOR_BYTES,
    check_declared,
    check_names,
    check_size,
)

BYTES_SUFFIX = "_bytes"
_LITTLE_ENDIAN = sys.byteorder == "little"
# The most dimensions a numpy array can have (TensorFlow allows 254).
MAX_RANK = 64
_LARGEST_INDEX = np.iinfo(np.intp).max  # the largest size numpy can address

# DataType -> the TensorProto field TensorFlow stores its values in when not packed.
_VALUE_FIELD = {
    1: "float_val",
    2: "double_val",
    3: "int_val",
    4: "int_val",
    5: "int_val",
    6: "int_val",
    17: "int_val",
    7: "string_val",
    8: "scomplex_val",
    18: "dcomplex_val",
    9: "int64_val",
    10: "bool_val",
    14: "half_val",
    19: "half_val",
    22: "uint32_val",
    23: "uint64_val",
}
_COMPLEX_PART = {8: np.dtype(np.float32), 18: np.dtype(np.float64)}


def _label(name: str | None, kind: str = "input") -> str:
    return f"{kind} {name!r}" if name else "tensor"


# -- TensorProto ------------------------------------------------------------------------


def protos_to_inputs(
    protos: Mapping[str, TensorProto],
    signature: Signature,
    *,
    max_bytes: int = MAX_TENSOR_BYTES,
) -> dict[str, np.ndarray]:
    """A Predict request's inputs, each checked against ``signature`` before it is decoded.

    Names, shapes (rank and fixed dimensions) and dtypes are judged from the protos'
    headers, so a request that declares a huge tensor and sends one value is refused
    before anything is allocated; ``max_bytes`` (the server's largest message) caps
    what the values a request does send may be repeated to fill.
    """
    check_names(protos, signature)
    args = signature.argument_numbers
    return {
        name: tensor_proto_to_numpy(
            protos[name], name, spec=spec, arg=args[name], max_bytes=max_bytes
        )
        for name, spec in signature.inputs.items()
    }


def tensor_proto_to_numpy(
    proto: TensorProto,
    name: str | None = None,
    *,
    kind: str = "input",
    spec: TensorSpec | None = None,
    arg: int = 0,
    max_bytes: int = MAX_TENSOR_BYTES,
) -> np.ndarray:
    """The array a ``TensorProto`` describes; ``kind`` and ``name`` ("input 'image'")
    only label error messages.

    With ``spec``, the declared shape and dtype must fit it (``arg`` numbers the input
    in TensorFlow's dtype message), checked before any value is read. A proto with
    fewer values than its shape repeats its last one (TensorFlow's rule) only up to
    ``max_bytes`` in all; a single repeated value, or none, is a read-only broadcast
    view that costs no memory until ``validate_inputs`` writes it out.

    Numeric arrays built from ``tensor_content`` are read-only views of the request
    bytes (no copy); copy before writing into them.
    """
    label = _label(name, kind)
    try:
        info = dtype_info(proto.dtype)
    except ValueError:
        raise InvalidArgument(f"{label}: unsupported dtype {_enum_text(proto.dtype)}") from None
    shape = _declared_shape(proto, info.numpy, label)
    if spec is not None:
        check_declared(spec, info.numpy, shape, arg)
    count = math.prod(shape)
    if info.numpy == STRING:
        if proto.tensor_content:
            raise InvalidArgument(f"{label}: string tensors cannot use tensor_content")
        _check_expansion(len(proto.string_val), count, info.numpy, shape, label, max_bytes)
        return _strings_from_values(proto.string_val, count, shape, label)
    if proto.tensor_content:
        content = proto.tensor_content
        expected = count * info.numpy.itemsize
        if len(content) != expected:
            raise InvalidArgument(
                f"{label}: tensor_content has {len(content)} bytes but shape {list(shape)} "
                f"{info.name} needs {expected}"
            )
        array = np.frombuffer(content, dtype=info.numpy)
        if not _LITTLE_ENDIAN:
            array = array.byteswap()
        return array.reshape(shape)
    given = len(getattr(proto, _VALUE_FIELD[info.enum]))
    if info.enum in _COMPLEX_PART:
        given //= 2
    _check_expansion(given, count, info.numpy, shape, label, max_bytes)
    return _numbers_from_values(proto, info.enum, info.numpy, count, shape, label)


def _declared_shape(proto: TensorProto, dtype: np.dtype, label: str) -> tuple[int, ...]:
    """The proto's shape, if an array can have it: known rank, at most ``MAX_RANK``
    dimensions, none negative, and a size numpy can address (even when another
    dimension is 0, numpy refuses shapes whose other dimensions overflow)."""
    if proto.tensor_shape.unknown_rank:
        raise InvalidArgument(f"{label}: the shape must be known (unknown_rank is set)")
    dims = proto.tensor_shape.dim
    if len(dims) > MAX_RANK:
        raise InvalidArgument(
            f"{label}: the shape has {len(dims)} dimensions; at most {MAX_RANK} are supported"
        )
    shape = tuple(d.size for d in dims)
    if any(d < 0 for d in shape):
        raise InvalidArgument(f"{label}: negative dimension in shape {list(shape)}")
    addressable = math.prod(d for d in shape if d) * max(dtype.itemsize, 1)
    if addressable > _LARGEST_INDEX:
        raise InvalidArgument(
            f"{label}: shape {list(shape)} is too large: its dimensions multiply to more "
            "than an array can address"
        )
    return shape


def _check_expansion(
    given: int,
    count: int,
    dtype: np.dtype,
    shape: tuple[int, ...],
    label: str,
    max_bytes: int,
) -> None:
    """Refuse, before allocating, a proto whose values would be repeated to fill more
    than ``max_bytes``. Values a request sends in full are already in memory."""
    if given < count:
        check_size(label, dtype, shape, max_bytes)


def _enum_text(enum: int) -> str:
    from tensorflow.core.framework import types_pb2

    return types_pb2.DataType.Name(enum) if enum in types_pb2.DataType.values() else str(enum)


def _broadcast(values: np.ndarray, count: int, shape: tuple[int, ...], label: str) -> np.ndarray:
    """TensorFlow's rule: missing trailing values repeat the last one; none means zeros.

    One value or none becomes a read-only broadcast view (no memory per element).
    """
    given = len(values)
    if given == count:
        return values.reshape(shape)
    if given > count:
        raise InvalidArgument(f"{label}: {given} values for a shape of {count} elements")
    if given <= 1:
        scalar = values[-1:].reshape(()) if given else np.zeros((), dtype=values.dtype)
        return np.broadcast_to(scalar, shape)
    full = np.empty(count, dtype=values.dtype)
    full[:given] = values
    full[given:] = values[-1]
    return full.reshape(shape)


def _strings_from_values(values: Any, count: int, shape: tuple[int, ...], label: str) -> np.ndarray:
    flat = np.empty(len(values), dtype=object)
    flat[:] = list(values)
    if len(values) == 0 and count:
        flat = np.array([b""], dtype=object)
    return _broadcast(flat, count, shape, label)


def _numbers_from_values(
    proto: TensorProto, enum: int, dtype: np.dtype, count: int, shape: tuple[int, ...], label: str
) -> np.ndarray:
    values = getattr(proto, _VALUE_FIELD[enum])
    if enum in _COMPLEX_PART:
        if len(values) % 2:
            raise InvalidArgument(f"{label}: complex values come in (real, imaginary) pairs")
        parts = np.fromiter(values, dtype=_COMPLEX_PART[enum], count=len(values))
        return _broadcast(parts.view(dtype), count, shape, label)
    if _VALUE_FIELD[enum] in ("int_val", "half_val"):
        # Narrow integers travel as int32, half floats as their 16 bits in an int32.
        wide = np.fromiter(values, dtype=np.int32, count=len(values))
        bits = np.uint16 if enum in (14, 19) else dtype
        limits = np.iinfo(bits)
        if len(wide) and (wide.min() < limits.min or wide.max() > limits.max):
            raise InvalidArgument(f"{label}: value out of range for {dtype_name(dtype)}")
        narrow = wide.astype(bits)
        parsed = narrow.view(dtype) if enum in (14, 19) else narrow
    else:
        parsed = np.fromiter(values, dtype=dtype, count=len(values))
    return _broadcast(parsed, count, shape, label)


def numpy_to_tensor_proto(array: Any) -> TensorProto:
    """A ``TensorProto`` for ``array``: packed ``tensor_content`` for numbers (one copy),
    ``string_val`` for strings (``bytes`` as they are, ``str`` as UTF-8)."""
    array = np.asarray(array)
    try:
        info = dtype_info(array.dtype)
    except ValueError as exc:
        raise InvalidArgument(f"tensor: {exc}") from None
    proto = TensorProto(dtype=info.enum)
    dims = proto.tensor_shape.dim
    for size in array.shape:
        dims.add(size=size)
    if info.numpy == STRING:
        proto.string_val.extend(_as_bytes(array))
    else:
        packed = np.ascontiguousarray(array, dtype=info.numpy)
        proto.tensor_content = packed.tobytes() if _LITTLE_ENDIAN else packed.byteswap().tobytes()
    return proto


def _as_bytes(array: np.ndarray) -> list[bytes]:
    items = array.ravel().tolist()
    if array.dtype.kind == "S":
        return items
    out = []
    for item in items:
        if isinstance(item, bytes):
            out.append(item)
        elif isinstance(item, str):
            out.append(item.encode("utf-8"))
        else:
            raise InvalidArgument(f"tensor: string tensor holds a {type(item).__name__}")
    return out


# -- JSON (TensorFlow Serving's REST API) ---------------------------------------------


def is_b64(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get("b64"), str)


def decode_b64(value: dict[str, str], label: str) -> bytes:
    try:
        return base64.b64decode(value["b64"], validate=True)
    except (binascii.Error, ValueError):
        raise InvalidArgument(f"{label}: {{'b64': ...}} is not valid base64") from None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def json_to_inputs(
    body: Mapping[str, Any], signature: Signature
) -> tuple[dict[str, np.ndarray], bool]:
    """The inputs of a ``:predict`` request body and whether it used the row format.

    Exactly one of ``instances`` (row) and ``inputs`` (columnar) must be present; the
    answer is written in the same format (``outputs_to_predictions(..., row_format)``).
    """
    if not isinstance(body, Mapping):
        raise InvalidArgument("the request body must be a JSON object")
    has_rows, has_columns = "instances" in body, "inputs" in body
    if has_rows and has_columns:
        raise InvalidArgument("use either 'instances' or 'inputs', not both")
    if has_rows:
        return instances_to_inputs(body["instances"], signature), True
    if has_columns:
        return columnar_to_inputs(body["inputs"], signature), False
    raise InvalidArgument("missing 'inputs' or 'instances' key")


def instances_to_inputs(instances: Any, signature: Signature) -> dict[str, np.ndarray]:
    """Row format: one list element per example, stacked into a batch per input.

    Elements are objects keyed by input name, or plain values when the signature has a
    single input. All elements must give each input the same shape.
    """
    if not isinstance(instances, list):
        raise InvalidArgument("'instances' must be a list")
    if not instances:
        raise InvalidArgument("'instances' is empty")
    if not signature.inputs:
        raise InvalidArgument(f"signature {signature.name!r} has no inputs")
    names = list(signature.inputs)
    if not _is_named(instances[0]):
        if len(names) > 1:
            raise InvalidArgument(
                "'instances' is a plain list, but the signature has several inputs "
                f"({', '.join(names)}): send a list of objects keyed by input name"
            )
        for index, item in enumerate(instances):
            if _is_named(item):
                raise InvalidArgument(
                    f"instances[{index}]: expected a value or list, got an object"
                )
        spec = signature.inputs[names[0]]
        return {names[0]: _json_to_array(instances, spec, f"input {names[0]!r}", rows=True)}
    expected = set(names)
    for index, item in enumerate(instances):
        if not _is_named(item):
            raise InvalidArgument(f"instances[{index}]: expected an object keyed by input name")
        if item.keys() != expected:
            raise InvalidArgument(
                f"instances[{index}]: expected keys {sorted(expected)}, got {sorted(item)}"
            )
    return {
        name: _json_to_array([item[name] for item in instances], spec, f"input {name!r}", rows=True)
        for name, spec in signature.inputs.items()
    }


def _is_named(item: Any) -> bool:
    return isinstance(item, dict) and not is_b64(item)


def columnar_to_inputs(inputs: Any, signature: Signature) -> dict[str, np.ndarray]:
    """Columnar format: an object of whole tensors by input name, or one bare tensor
    when the signature has a single input. Inputs need not share a batch size here."""
    if not signature.inputs:
        raise InvalidArgument(f"signature {signature.name!r} has no inputs")
    if not _is_named(inputs):
        if len(signature.inputs) > 1:
            raise InvalidArgument(
                "'inputs' is a plain value or list, but the signature has several inputs "
                f"({', '.join(signature.inputs)}): send an object keyed by input name"
            )
        name, spec = next(iter(signature.inputs.items()))
        return {name: _json_to_array(inputs, spec, f"input {name!r}", rows=False)}
    unknown = sorted(set(inputs) - set(signature.inputs))
    if unknown:
        raise InvalidArgument(
            f"unknown input {unknown[0]!r}; the signature takes {', '.join(signature.inputs)}"
        )
    missing = [name for name in signature.inputs if name not in inputs]
    if missing:
        raise InvalidArgument(f"missing input {missing[0]!r} in 'inputs'")
    return {
        name: _json_to_array(inputs[name], spec, f"input {name!r}", rows=False)
        for name, spec in signature.inputs.items()
    }


def _json_to_array(value: Any, spec: TensorSpec, label: str, *, rows: bool) -> np.ndarray:
    """A JSON value as an array of the spec's dtype.

    JSON numbers carry no type, so the signature decides it, as in TensorFlow Serving
    (``json_tensor.cc``): a float input takes any number (integers too large to be
    exact lose precision, values beyond the type's range become +/-inf); an integer
    input takes integer literals only (``1.0`` is a float), in the type's range; a bool
    input takes ``true``/``false`` only, and ``true`` is not a number to any other input.
    A scalar (no list) is a tensor of shape ``[]``.
    """
    if spec.dtype == STRING:
        return _json_strings(value, label, rows)
    try:
        array = np.array(value)
    except (ValueError, OverflowError):
        raise InvalidArgument(_ragged_message(label, rows)) from None
    target = spec.dtype
    if target.kind == "c":
        raise InvalidArgument(f"{label}: {dtype_name(target)} tensors cannot be sent as JSON")
    if array.size == 0:
        return array.astype(target)
    types = _leaf_types(value)
    if target.kind == "b":
        if types != {bool}:
            raise InvalidArgument(f"{label}: expected bools, got {_first_bad(value, _is_bool)}")
        return array
    if target.kind in "iu":
        if not types <= {int}:
            raise InvalidArgument(
                f"{label}: expected integers, got {_first_bad(value, _is_integer)}"
            )
        if array.dtype.kind not in "iu":
            array = _exact_integers(value, label)
        limits = np.iinfo(target)
        if array.min() < limits.min or array.max() > limits.max:
            raise InvalidArgument(f"{label}: value out of range for {dtype_name(target)}")
        return array.astype(target)
    if not types <= {int, float}:
        raise InvalidArgument(f"{label}: expected numbers, got {_first_bad(value, _is_number)}")
    if array.dtype.kind not in "iuf":
        array = _wide_floats(value)
    with np.errstate(over="ignore"):
        return array.astype(target)


def _ragged_message(label: str, rows: bool) -> str:
    if rows:
        return f"{label}: instances give it different shapes (or a list is ragged)"
    return f"{label}: lists at the same level differ in length (a tensor must be rectangular)"


def _leaf_types(value: Any) -> set[type]:
    """The Python types of the values in nested lists (at C speed per innermost list)."""
    if not isinstance(value, list):
        return {type(value)}
    if value and isinstance(value[0], list):
        found: set[type] = set()
        for item in value:
            found |= _leaf_types(item)
        return found
    return set(map(type, value))


def _first_bad(value: Any, accept: Callable[[Any], bool]) -> str:
    """The first value a type check refuses, for the error message."""
    found = _refused(value, accept)
    return "mixed values" if found is _NOTHING else _short(found)


_NOTHING = object()


def _refused(value: Any, accept: Callable[[Any], bool]) -> Any:
    if isinstance(value, list):
        for item in value:
            found = _refused(item, accept)
            if found is not _NOTHING:
                return found
        return _NOTHING
    return _NOTHING if accept(value) else value


def _is_bool(item: Any) -> bool:
    return isinstance(item, bool)


def _is_integer(item: Any) -> bool:
    return type(item) is int


def _is_number(item: Any) -> bool:
    return type(item) in (int, float)


def _exact_integers(value: Any, label: str) -> np.ndarray:
    """Integers numpy could not keep exact: a mix of huge and negative values."""
    objects = np.array(value, dtype=object)
    try:
        return objects.astype(np.int64 if min(objects.ravel()) < 0 else np.uint64)
    except (OverflowError, ValueError):
        raise InvalidArgument(f"{label}: value out of range for 64-bit integers") from None


def _wide_floats(value: Any) -> np.ndarray:
    """Numbers numpy kept as Python objects (integers beyond 64 bits) as float64;
    an integer beyond float64's range is +/-inf, as a JSON parser reads it."""
    objects = np.array(value, dtype=object)
    flat = np.empty(objects.size, dtype=np.float64)
    for index, item in enumerate(objects.ravel().tolist()):
        try:
            flat[index] = float(item)
        except OverflowError:
            flat[index] = math.inf if item > 0 else -math.inf
    return flat.reshape(objects.shape)


def _json_strings(value: Any, label: str, rows: bool) -> np.ndarray:
    try:
        objects = np.array(value, dtype=object)
    except ValueError:
        raise InvalidArgument(_ragged_message(label, rows)) from None
    flat = objects.ravel().tolist()
    converted = np.empty(len(flat), dtype=object)
    for index, item in enumerate(flat):
        if isinstance(item, str):
            converted[index] = item.encode("utf-8")
        elif is_b64(item):
            converted[index] = decode_b64(item, label)
        elif isinstance(item, list):
            raise InvalidArgument(_ragged_message(label, rows))
        else:
            raise InvalidArgument(
                f"{label}: expected strings or {{'b64': ...}} objects, got {_short(item)}"
            )
    return converted.reshape(objects.shape)


def outputs_to_predictions(outputs: Mapping[str, np.ndarray], row_format: bool) -> dict[str, Any]:
    """The JSON response body for model outputs, shaped like the request.

    Row format: ``{"predictions": [...]}`` with one element per example (an object by
    output name, or the bare value when there is one output). Columnar format:
    ``{"outputs": ...}`` with whole tensors (an object by name, or the bare tensor).
    String outputs whose name ends in ``_bytes``, and any string that is not valid
    UTF-8, are written as ``{"b64": ...}``.
    """
    if not outputs:
        raise InvalidArgument("the model returned no outputs")
    converted = {name: _array_to_json(name, np.asarray(array)) for name, array in outputs.items()}
    if not row_format:
        if len(converted) == 1:
            return {"outputs": next(iter(converted.values()))}
        return {"outputs": converted}
    sizes = {}
    for name, array in outputs.items():
        shape = np.shape(array)
        if not shape:
            raise InvalidArgument(
                f"output {name!r} is a scalar; row format needs a batch dimension"
            )
        sizes[name] = shape[0]
    if len(set(sizes.values())) > 1:
        raise InvalidArgument(
            "outputs disagree on batch size ("
            + ", ".join(f"{n}: {s}" for n, s in sizes.items())
            + "); use the columnar 'inputs' format"
        )
    if len(converted) == 1:
        return {"predictions": next(iter(converted.values()))}
    names = list(converted)
    return {
        "predictions": [
            dict(zip(names, row, strict=True))
            for row in zip(*(converted[n] for n in names), strict=True)
        ]
    }


def _array_to_json(name: str, array: np.ndarray) -> Any:
    info = dtype_info(array.dtype)
    if info.numpy == STRING:
        encode = _b64_object if name.endswith(BYTES_SUFFIX) else _text_or_b64
        flat = np.empty(array.size, dtype=object)
        flat[:] = [encode(item) for item in _as_bytes(array)]
        return flat.reshape(array.shape).tolist()
    if info.numpy.kind == "c":
        raise InvalidArgument(f"output {name!r}: {info.name} cannot be written as JSON")
    if info.name in ("bfloat16", "float16"):
        array = array.astype(np.float32)
    if array.dtype == np.float32:
        return float32_json_values(array)
    return array.tolist()


def float32_json_value(value: float) -> float:
    """The number TF Serving writes for a float32 (``WriteDecimal`` in json_tensor.cc):
    six significant digits when they read back as the same float32, else nine, so
    ``2.1`` prints as ``2.1`` and not as its float64 widening ``2.0999999046325684``.
    The result is the float64 nearest that text, which ``json`` prints the same way."""
    if not math.isfinite(value):
        return value
    single = np.float32(value)
    text = f"{float(single):g}"
    if np.float32(text) != single:
        text = f"{float(single):.9g}"
    return float(text)


def float32_json_values(array: np.ndarray) -> Any:
    """A float32 array as nested lists of ``float32_json_value`` numbers."""
    flat = [float32_json_value(value) for value in array.ravel().tolist()]
    if array.ndim == 0:
        return flat[0]
    return np.array(flat, dtype=object).reshape(array.shape).tolist()


def _b64_object(data: bytes) -> dict[str, str]:
    return {"b64": base64.b64encode(data).decode("ascii")}


def _text_or_b64(data: bytes) -> str | dict[str, str]:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return _b64_object(data)
