"""Hand-written ``TensorProto`` messages, for requests no honest client would build."""

from __future__ import annotations

from tensorflow.core.framework.tensor_pb2 import TensorProto


def proto(dtype: int, dims: list[int], **fields: object) -> TensorProto:
    """A TensorProto of ``dtype`` and ``dims`` whose fields are set (lists extended) as given,
    whether or not they agree with the declared shape."""
    message = TensorProto(dtype=dtype)
    for size in dims:
        message.tensor_shape.dim.add(size=size)
    for name, value in fields.items():
        if isinstance(value, list):
            getattr(message, name).extend(value)
        else:
            setattr(message, name, value)
    return message
