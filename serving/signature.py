"""What a model accepts and returns: named, typed tensors with a batch dimension first.

Every backend (SavedModel, TFLite, a remote TensorFlow Serving) describes itself with
these classes, so validation, batching and both APIs work the same whatever runs the
model. Dtypes are numpy dtypes (strings are ``object`` arrays of ``bytes``); the table
below ties each to its TensorFlow ``DataType`` number and name, which are wire formats
that never change, so this module needs no TensorFlow import.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import ml_dtypes
import numpy as np

from contracts.model_manifest import SIGNATURE_KEY

if TYPE_CHECKING:
    from tensorflow.core.protobuf.meta_graph_pb2 import SignatureDef

PREDICT_METHOD = "tensorflow/serving/predict"
# The signature a request runs when it names none: the key every export writes.
DEFAULT_SIGNATURE = SIGNATURE_KEY
STRING = np.dtype(object)

# Named tensors, as requests carry them and models take and return them.
Tensors = dict[str, np.ndarray]


@dataclass(frozen=True)
class DType:
    """One supported element type and its names in each world."""

    name: str  # TensorFlow's name, as slipway.json writes it
    numpy: np.dtype
    enum: int  # tensorflow.DataType


_DTYPES = (
    DType("float32", np.dtype(np.float32), 1),
    DType("float64", np.dtype(np.float64), 2),
    DType("int32", np.dtype(np.int32), 3),
    DType("uint8", np.dtype(np.uint8), 4),
    DType("int16", np.dtype(np.int16), 5),
    DType("int8", np.dtype(np.int8), 6),
    DType("string", STRING, 7),
    DType("complex64", np.dtype(np.complex64), 8),
    DType("int64", np.dtype(np.int64), 9),
    DType("bool", np.dtype(np.bool_), 10),
    DType("bfloat16", np.dtype(ml_dtypes.bfloat16), 14),
    DType("uint16", np.dtype(np.uint16), 17),
    DType("complex128", np.dtype(np.complex128), 18),
    DType("float16", np.dtype(np.float16), 19),
    DType("uint32", np.dtype(np.uint32), 22),
    DType("uint64", np.dtype(np.uint64), 23),
)
_BY_NAME = {d.name: d for d in _DTYPES}
_BY_NAME |= {
    "half": _BY_NAME["float16"],
    "double": _BY_NAME["float64"],
    "float": _BY_NAME["float32"],
}
_BY_ENUM = {d.enum: d for d in _DTYPES}
_BY_NUMPY = {d.numpy: d for d in _DTYPES}


def dtype_info(dtype: np.dtype | str | int) -> DType:
    """The table entry for a numpy dtype, a TensorFlow name or a ``DataType`` number.

    A string is read as TensorFlow's name first (``"float"`` is float32, as in
    TensorFlow's messages), then as a numpy type string (``"<f4"``).

    Numpy byte/unicode string dtypes count as ``string`` since they convert losslessly
    to the object arrays of ``bytes`` the gateway uses. Raises ``ValueError`` for types
    the gateway does not carry (resources, variants, quantized types).
    """
    if isinstance(dtype, np.dtype) and (found := _BY_NUMPY.get(dtype)) is not None:
        return found  # the request path's case: a native-order numpy dtype, one lookup
    if isinstance(dtype, (int, np.integer)) and not isinstance(dtype, bool):
        found = _BY_ENUM.get(int(dtype))
        if found is None:
            raise ValueError(f"unsupported DataType {int(dtype)}")
        return found
    if isinstance(dtype, str) and dtype in _BY_NAME:
        return _BY_NAME[dtype]
    try:
        numpy_dtype = np.dtype(dtype)
    except TypeError:
        raise ValueError(f"unsupported dtype {dtype!r}") from None
    if numpy_dtype.kind in "SU":
        return _BY_NUMPY[STRING]
    found = _BY_NUMPY.get(numpy_dtype.newbyteorder("=")) or _BY_NUMPY.get(numpy_dtype)
    if found is None:
        raise ValueError(f"unsupported dtype {numpy_dtype}")
    return found


def dtype_name(dtype: np.dtype) -> str:
    """TensorFlow's name for a numpy dtype (``object`` -> ``string``), for messages."""
    try:
        return dtype_info(dtype).name
    except ValueError:
        return str(dtype)


# TensorFlow's ``DataTypeString`` differs from its Python names for three types.
_TF_TYPE_STRING = {1: "float", 2: "double", 19: "half"}


def tf_type_name(dtype: np.dtype) -> str:
    """TensorFlow's C++ name for a dtype (``float``, ``double``, ``int32``), as its own
    messages print it; TensorFlow Serving's errors quote these."""
    try:
        info = dtype_info(dtype)
    except ValueError:
        return str(dtype)
    return _TF_TYPE_STRING.get(info.enum, info.name)


def shape_text(shape: tuple[int | None, ...] | None) -> str:
    """``[-1, 8, 8, 1]``: a shape as TensorFlow Serving and slipway.json print it."""
    if shape is None:
        return "[?]"
    return "[" + ", ".join("-1" if d is None else str(d) for d in shape) + "]"


@dataclass(frozen=True)
class TensorSpec:
    """One named tensor: dtype and shape, batch dimension first, ``None`` = any size.

    ``shape=None`` means the rank itself is unknown (a SavedModel may declare that);
    such a spec accepts any shape. ``tensor_name`` is the graph tensor behind the
    signature key when the backend knows it (reported by ``GetModelMetadata``).
    """

    name: str
    dtype: np.dtype
    shape: tuple[int | None, ...] | None
    tensor_name: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", dtype_info(self.dtype).numpy)
        if self.shape is not None:
            dims = tuple(None if d is None or int(d) < 0 else int(d) for d in self.shape)
            object.__setattr__(self, "shape", dims)

    @property
    def dtype_name(self) -> str:
        return dtype_info(self.dtype).name

    def describe(self) -> str:
        """``float32 [-1, 8, 8, 1]``, the form error messages use."""
        return f"{self.dtype_name} {shape_text(self.shape)}"

    def accepts_shape(self, shape: tuple[int, ...]) -> bool:
        if self.shape is None:
            return True
        return len(shape) == len(self.shape) and all(
            want is None or want == got for want, got in zip(self.shape, shape, strict=True)
        )

    def to_json(self) -> dict[str, Any]:
        dims = None if self.shape is None else [-1 if d is None else d for d in self.shape]
        return {"dtype": self.dtype_name, "shape": dims}

    @classmethod
    def from_json(cls, name: str, data: Mapping[str, Any]) -> TensorSpec:
        """Read a ``{"dtype": "float32", "shape": [-1, 8]}`` entry of slipway.json."""
        if not isinstance(data, Mapping) or "dtype" not in data:
            raise ValueError(f"tensor {name!r}: expected {{'dtype', 'shape'}}, got {data!r}")
        shape = data.get("shape")
        if shape is not None and (
            not isinstance(shape, list)
            or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape)
        ):
            raise ValueError(f"tensor {name!r}: shape must be a list of integers, got {shape!r}")
        return cls(name, dtype_info(data["dtype"]).numpy, None if shape is None else tuple(shape))


@dataclass(frozen=True)
class Signature:
    """A named function of a model: input specs in, output specs out."""

    name: str
    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]
    method_name: str = PREDICT_METHOD

    @functools.cached_property
    def argument_numbers(self) -> dict[str, int]:
        """Each input's argument number in TensorFlow's messages (``arg[1]``).

        TensorFlow's session sorts the tensors it is fed by name before it numbers them,
        and TensorFlow Serving feeds every input of the signature. Computed once: a
        signature is fixed for as long as its version is loaded.
        """
        keys = sorted(self.inputs, key=lambda name: self.inputs[name].tensor_name or name)
        return {name: index for index, name in enumerate(keys)}

    def describe_inputs(self) -> str:
        """``image: float32 [-1, 8, 8, 1], extra: int64 [-1, 3]`` for messages."""
        return ", ".join(f"{name}: {spec.describe()}" for name, spec in self.inputs.items())

    def to_json(self) -> dict[str, Any]:
        """The ``signature`` section of slipway.json."""
        return {
            "name": self.name,
            "inputs": {name: spec.to_json() for name, spec in self.inputs.items()},
            "outputs": {name: spec.to_json() for name, spec in self.outputs.items()},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Signature:
        if not isinstance(data, Mapping):
            raise ValueError(f"signature: expected an object, got {type(data).__name__}")
        sections = {}
        for key in ("inputs", "outputs"):
            section = data.get(key)
            if not isinstance(section, Mapping):
                raise ValueError(f"signature: {key!r} must be an object")
            sections[key] = {name: TensorSpec.from_json(name, v) for name, v in section.items()}
        return cls(
            str(data.get("name", DEFAULT_SIGNATURE)),
            sections["inputs"],
            sections["outputs"],
            str(data.get("method_name", PREDICT_METHOD)),
        )

    def to_proto(self) -> SignatureDef:
        """A ``SignatureDef`` for ``GetModelMetadata`` responses."""
        from tensorflow.core.protobuf.meta_graph_pb2 import SignatureDef

        proto = SignatureDef(method_name=self.method_name)
        for specs, target in ((self.inputs, proto.inputs), (self.outputs, proto.outputs)):
            for key, spec in specs.items():
                info = target[key]
                info.name = spec.tensor_name or f"{key}:0"
                info.dtype = dtype_info(spec.dtype).enum
                if spec.shape is None:
                    info.tensor_shape.unknown_rank = True
                else:
                    for d in spec.shape:
                        info.tensor_shape.dim.add(size=-1 if d is None else d)
        return proto

    @classmethod
    def from_proto(cls, name: str, proto: SignatureDef) -> Signature:
        """Read a ``SignatureDef`` (from a SavedModel or a remote ``GetModelMetadata``)."""

        def specs(infos: Any) -> dict[str, TensorSpec]:
            out = {}
            for key, info in infos.items():
                shape = info.tensor_shape
                dims = None if shape.unknown_rank else tuple(d.size for d in shape.dim)
                out[key] = TensorSpec(key, dtype_info(info.dtype).numpy, dims, info.name)
            return out

        return cls(name, specs(proto.inputs), specs(proto.outputs), proto.method_name)
