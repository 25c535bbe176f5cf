"""What a TFLite flatbuffer computes, read from its op graph: op counts, attention paths
and layer norms.

Post-training int8 quantization gives every activation tensor one scale, from the range
seen during calibration. Attention breaks that: Keras adds a large negative number
(−1e9) to the scores of padded positions before the softmax, so the score tensor's
range is dominated by the mask and the real scores all round to the same int8 value;
the attention becomes uniform and accuracy drops by many points. The per-layer error
the quantization debugger reports (error over scale) cannot see this, because the
error is small *relative to that huge scale*. The score path is found structurally
instead, so selective quantization can keep exactly it in float.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from ai_edge_litert.interpreter import Interpreter

# Ops between the query-key product and the softmax: scaling and the added mask.
_SCORE_ELEMENTWISE = frozenset({"ADD", "SUB", "MUL", "DIV", "RESHAPE", "TRANSPOSE"})
# A converted LayerNormalization: the statistics, then scale and shift arithmetic.
_NORM_STATISTICS = frozenset({"MEAN", "SQUARED_DIFFERENCE", "RSQRT"})
_NORM_ARITHMETIC = frozenset({"MUL", "SUB", "ADD"})


@dataclass(frozen=True)
class Op:
    name: str  # the builtin op, e.g. "BATCH_MATMUL"
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]


@dataclass(frozen=True)
class Graph:
    """The main subgraph's ops in execution order and its tensor names by index."""

    ops: tuple[Op, ...]
    tensor_names: dict[int, str]
    inputs: tuple[int, ...] = ()  # the model's input tensors

    @classmethod
    def read(cls, flatbuffer: bytes) -> Graph:
        interpreter = Interpreter(model_content=flatbuffer)
        ops = tuple(
            Op(
                detail["op_name"],
                tuple(int(i) for i in detail["inputs"]),
                tuple(int(i) for i in detail["outputs"]),
            )
            for detail in interpreter._get_ops_details()  # the only op-level view LiteRT offers
        )
        names = {detail["index"]: detail["name"] for detail in interpreter.get_tensor_details()}
        inputs = tuple(int(detail["index"]) for detail in interpreter.get_input_details())
        return cls(ops, names, inputs)

    def producer(self, tensor: int) -> Op | None:
        return next((op for op in self.ops if tensor in op.outputs), None)

    def consumers(self, tensor: int) -> list[Op]:
        return [op for op in self.ops if tensor in op.inputs]


def op_counts(flatbuffer: bytes) -> dict[str, int]:
    """How many ops of each kind the flatbuffer runs (QUANTIZE/DEQUANTIZE show churn)."""
    return dict(sorted(Counter(op.name for op in Graph.read(flatbuffer).ops).items()))


def _score_path(graph: Graph, softmax: Op) -> Iterable[Op]:
    """The softmax, the ops before it back to the score product, and the value product."""
    yield softmax
    frontier = list(softmax.inputs)
    seen: set[int] = set()
    while frontier:
        tensor = frontier.pop()
        op = graph.producer(tensor)
        if op is None or id(op) in seen:
            continue
        seen.add(id(op))
        if op.name == "BATCH_MATMUL":
            yield op
        elif op.name in _SCORE_ELEMENTWISE:
            yield op
            frontier.extend(op.inputs)
    for tensor in softmax.outputs:
        for consumer in graph.consumers(tensor):
            if consumer.name in ("BATCH_MATMUL", "RESHAPE", "TRANSPOSE"):
                yield consumer


def attention_score_tensors(flatbuffer: bytes) -> list[str]:
    """Output tensor names of every op on an attention score path, in graph order.

    A path runs from a BATCH_MATMUL through elementwise ops (scale, mask add) into a
    SOFTMAX and on to the BATCH_MATMUL that weights the values. A softmax with no
    product before it (a classifier's output) is not attention; models without
    attention have none.
    """
    graph = Graph.read(flatbuffer)
    chosen: set[int] = set()
    for op in graph.ops:
        if op.name != "SOFTMAX":
            continue
        path = list(_score_path(graph, op))
        if any(path_op.name == "BATCH_MATMUL" for path_op in path):  # not a classifier's
            chosen.update(id(path_op) for path_op in path)
    return [
        graph.tensor_names[tensor] for op in graph.ops if id(op) in chosen for tensor in op.outputs
    ]


def layer_norm_tensors(flatbuffer: bytes) -> list[str]:
    """Output tensor names of every op of the layer norms, in graph order.

    A Keras LayerNormalization becomes its statistics (MEAN, SQUARED_DIFFERENCE, a
    second MEAN, RSQRT) and arithmetic (add epsilon, scale by gamma, subtract the scaled
    mean from beta, add): the arithmetic ops are those MUL/SUB/ADD whose computed inputs
    all come from the norm itself or from the tensor it normalises. Keeping only the
    statistics float (by op type) would leave that arithmetic int8, with a quantize and
    a dequantize between every two ops; keeping the whole norm float needs its tensors.
    A residual ADD is not part of it: one of its inputs comes from elsewhere.
    """
    graph = Graph.read(flatbuffer)
    computed = {tensor for op in graph.ops for tensor in op.outputs}
    chosen = {id(op) for op in graph.ops if op.name in _NORM_STATISTICS}
    inside = {tensor for op in graph.ops if id(op) in chosen for tensor in op.outputs}
    inside |= {op.inputs[0] for op in graph.ops if op.name == "MEAN"}  # what is normalised
    grown = True
    while grown:
        grown = False
        for op in graph.ops:
            if id(op) in chosen or op.name not in _NORM_ARITHMETIC:
                continue
            live = [tensor for tensor in op.inputs if tensor in computed]
            if live and all(tensor in inside for tensor in live):
                chosen.add(id(op))
                inside.update(op.outputs)
                grown = True
    return [
        graph.tensor_names[tensor] for op in graph.ops if id(op) in chosen for tensor in op.outputs
    ]


def feature_mix_tensors(flatbuffer: bytes) -> list[str]:
    """Output tensor names of the ops that encode several model inputs and join them.

    A CONCATENATION whose parts descend from different model inputs (a pooled text
    embedding beside standardized numbers) gives all of them one int8 scale, set by the
    widest part's range: a number whose tail reaches 7 standard deviations leaves an
    embedding of magnitude 0.1 a handful of levels. Kept float here: every op from the
    inputs up to such a concatenation, the concatenation, and the ops that read it (the
    first Dense), whose int8 input would have that one scale again. What follows (hidden
    layers, heads) stays int8.
    """
    graph = Graph.read(flatbuffer)
    origins: dict[int, frozenset[int]] = {tensor: frozenset([tensor]) for tensor in graph.inputs}
    for op in graph.ops:  # execution order: an op's inputs are settled before it
        reached = frozenset().union(*(origins.get(tensor, frozenset()) for tensor in op.inputs))
        origins.update((tensor, reached) for tensor in op.outputs)
    chosen: set[int] = set()
    for op in graph.ops:
        parts = [origins.get(tensor, frozenset()) for tensor in op.inputs]
        if op.name != "CONCATENATION" or len({part for part in parts if part}) < 2:
            continue
        chosen.add(id(op))
        chosen.update(id(ancestor) for ancestor in _ancestors(graph, op))
        chosen.update(id(reader) for tensor in op.outputs for reader in graph.consumers(tensor))
    return [
        graph.tensor_names[tensor] for op in graph.ops if id(op) in chosen for tensor in op.outputs
    ]


def _ancestors(graph: Graph, op: Op) -> Iterable[Op]:
    """Every op whose output ``op`` reads, directly or through others."""
    frontier, seen = list(op.inputs), set()
    while frontier:
        producer = graph.producer(frontier.pop())
        if producer is None or id(producer) in seen:
            continue
        seen.add(id(producer))
        yield producer
        frontier.extend(producer.inputs)


def layer_names(tensor_names: Iterable[str]) -> list[str]:
    """The Keras layers that TFLite tensors belong to, in first-seen order.

    The converter names a tensor after the TensorFlow ops fused into it, each
    ``model/layer/op`` and joined by ``;``, so the second component is the layer."""
    layers: dict[str, None] = {}
    for name in tensor_names:
        for part in name.split(";"):
            components = part.split("/")
            if len(components) > 2 and components[1]:
                layers[components[1]] = None
    return list(layers)
