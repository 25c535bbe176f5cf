"""Remove from a TFLite flatbuffer what LiteRT never reads when it runs the model.

The converter writes, beside the graph and its weights, a name for every tensor,
calibration ranges (``min``/``max``) next to the scales and zero points kernels use, an
empty quantization table on every float tensor, a shape signature equal to the shape
on every constant, a model description and conversion metadata. None of it changes
what the model computes, and in a small int8 model it is a large part of the file:
the weights shrink fourfold, the bookkeeping does not.

What is kept is everything a client or the interpreter reads: the ``serving_default``
signature with its input and output keys, the names of the tensors behind them (shown
as input and output details and by the gateway's model metadata), shapes whose
signature differs from them (a free batch dimension), and every buffer in the
16-byte alignment the converter gives it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flatbuffers
import numpy as np
from ai_edge_litert import schema_py_generated as schema
from ai_edge_litert.tools import flatbuffer_utils

# The converter aligns every buffer to 16 bytes, which SIMD kernels may rely on.
_BUFFER_ALIGNMENT = 16
_FILE_IDENTIFIER = b"TFL3"


class _SharingBuilder(flatbuffers.Builder):
    """A builder that writes each distinct small vector and table once and points every
    table that holds it there (flatbuffers offsets may share a target), as it already
    does for vtables: activations repeat the same shapes, zero points and quantization,
    operators the same options, tensor after tensor."""

    def __init__(self) -> None:
        super().__init__(1024)
        self._written: dict[Any, int] = {}

    def once(self, key: Any, write: Callable[[], int]) -> int:
        """The offset of what ``write`` writes, written only the first time ``key`` is seen."""
        if key not in self._written:
            self._written[key] = write()
        return self._written[key]

    def CreateNumpyVector(self, x: np.ndarray) -> int:
        write = super().CreateNumpyVector
        return self.once((x.dtype.str, x.tobytes()), lambda: write(x))


class _Shared:
    """A table (quantization, operator options) packed once per distinct content."""

    def __init__(self, table: Any) -> None:
        self.table = table

    def Pack(self, builder: _SharingBuilder) -> int:
        content = tuple(
            (field, value.tobytes() if isinstance(value, np.ndarray) else repr(value))
            for field, value in sorted(vars(self.table).items())
        )
        return builder.once((type(self.table), content), lambda: self.table.Pack(builder))


class _AlignedBuffer:
    """A buffer that packs its bytes 16-byte aligned (the generated ``BufferT`` packs them
    with no alignment beyond one byte)."""

    def __init__(self, data: np.ndarray | bytes | None) -> None:
        self.data = None if data is None else np.frombuffer(bytes(data), dtype=np.uint8)

    def Pack(self, builder: flatbuffers.Builder) -> int:
        offset = None
        if self.data is not None:
            builder.Prep(_BUFFER_ALIGNMENT, len(self.data))  # pads so the bytes start aligned
            # Written as they are, never shared: each weight keeps its own aligned bytes.
            offset = flatbuffers.Builder.CreateNumpyVector(builder, self.data)
        schema.BufferStart(builder)
        if offset is not None:
            schema.BufferAddData(builder, offset)
        return schema.BufferEnd(builder)


def strip_for_serving(flatbuffer: bytes) -> bytes:
    """``flatbuffer`` without names, ranges, metadata and redundant shape signatures.

    The result computes exactly what the input does, through the same signatures.
    """
    model = flatbuffer_utils.read_model_from_bytearray(bytearray(flatbuffer))
    model.description = None
    model.metadata = None
    model.metadataBuffer = None
    kept_names = _signature_tensors(model)
    for index, subgraph in enumerate(model.subgraphs):
        subgraph.name = None
        for tensor_index, tensor in enumerate(subgraph.tensors):
            if (index, tensor_index) not in kept_names:
                tensor.name = None
            _strip_tensor(tensor)
    _drop_unused_buffers(model)
    return _pack(model)


def _signature_tensors(model: Any) -> set[tuple[int, int]]:
    """(subgraph, tensor) of every signature input and output: their names stay."""
    kept = set()
    for signature in model.signatureDefs or []:
        for entry in (signature.inputs or []) + (signature.outputs or []):
            kept.add((signature.subgraphIndex, entry.tensorIndex))
    return kept


def _strip_tensor(tensor: Any) -> None:
    """Drop a tensor's calibration ranges, empty quantization and copied shape."""
    quantization = tensor.quantization
    if quantization is not None:
        unquantized = quantization.scale is None or len(quantization.scale) == 0
        if unquantized and quantization.details is None:
            tensor.quantization = None
        else:
            quantization.min = None
            quantization.max = None
    # Without a signature the interpreter takes the shape as the signature.
    if tensor.shapeSignature is not None and list(tensor.shapeSignature) == list(tensor.shape):
        tensor.shapeSignature = None


def _drop_unused_buffers(model: Any) -> None:
    """Keep buffer 0 (the empty one every activation points at) and those tensors use."""
    used = sorted(
        {tensor.buffer for subgraph in model.subgraphs for tensor in subgraph.tensors} - {0}
    )
    renumbered = {old: new for new, old in enumerate(used, start=1)}
    model.buffers = [model.buffers[0]] + [model.buffers[old] for old in used]
    for subgraph in model.subgraphs:
        for tensor in subgraph.tensors:
            tensor.buffer = renumbered.get(tensor.buffer, 0)


def _pack(model: Any) -> bytes:
    """The model's bytes, weights aligned and repeated shapes and parameters shared."""
    model.buffers = [_AlignedBuffer(buffer.data) for buffer in model.buffers]
    for subgraph in model.subgraphs:
        for tensor in subgraph.tensors:
            # Numpy vectors are what the generated code packs through CreateNumpyVector.
            tensor.shape = _int32_vector(tensor.shape)
            tensor.shapeSignature = _int32_vector(tensor.shapeSignature)
            if tensor.quantization is not None:
                tensor.quantization = _Shared(tensor.quantization)
        for operator in subgraph.operators:
            if operator.builtinOptions is not None:
                operator.builtinOptions = _Shared(operator.builtinOptions)
    builder = _SharingBuilder()
    builder.Finish(model.Pack(builder), file_identifier=_FILE_IDENTIFIER)
    return bytes(builder.Output())


def _int32_vector(values: Any) -> np.ndarray | None:
    return None if values is None else np.asarray(values, dtype=np.int32)
