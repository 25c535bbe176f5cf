"""A DTensor device mesh, the Megatron layouts of the zoo's weights on it, and moving
tensors between the host and the mesh.

With ``distribution: {mesh: {batch: B, model: M}}`` the local devices (GPUs, else the
logical CPU devices a process configured) form a ``B x M`` mesh. Each batch is split
over ``batch``; each Transformer block's weights are split over ``model`` as Megatron-LM
does, so that a block needs two all-reduces and no split weight is whole on any device:

- attention: the query, key and value projections by heads (their kernels are
  ``(d_model, heads, head_dim)``), the output projection by heads too (``(heads,
  head_dim, d_model)``), so every device attends with its own heads;
- feed-forward: the first matmul by columns, the second by rows; a mixture of experts
  by expert, each device holding whole experts;
- the token and position embeddings by width (DTensor has no lookup into a table split
  by rows), a language model's logits by vocabulary when it divides.

Everything else (norms, biases summed after a row split, small heads) is replicated.
The layouts are regular expressions over the paths Keras gives a functional model's
variables (``<layer>.<attribute>``), matched by ``tf_keras.dtensor``'s ``LayoutMap``
as the model is built; a researcher's model whose layers are named otherwise trains
replicated over ``model`` and split over ``batch``.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping
from typing import Any

import tensorflow as tf
import tf_keras as keras
from tensorflow.experimental import dtensor

from research.experiments.config import DistributionConfig, MeshShape
from research.models.weights import matching_weights, stored
from training.errors import TrainingSetupError

BATCH, MODEL = "batch", "model"


def local_devices(count: int, wanted_by: str = "distribution.pipeline") -> list[str]:
    """``count`` of this process's GPUs, else of its CPU devices, by name.

    Without GPUs, a CPU not yet split into ``count`` logical devices is split now, if
    the runtime has not started (after that its devices are fixed), so a mesh or a
    pipeline can be tried on any machine.
    """
    if not tf.config.list_physical_devices("GPU"):
        _split_cpu(count)
    gpus = tf.config.list_logical_devices("GPU")
    devices = gpus or tf.config.list_logical_devices("CPU")
    kind = "GPU" if gpus else "CPU"
    if len(devices) < count:
        raise TrainingSetupError(
            f"{wanted_by} needs {count} {kind} devices; this process has {len(devices)}"
        )
    return [device.name for device in devices[:count]]


def local_mesh(shape: MeshShape) -> dtensor.Mesh:
    """A ``batch x model`` mesh over this process's GPUs, else its CPU devices."""
    devices = local_devices(
        shape.devices, wanted_by=f"distribution.mesh: {shape.batch} x {shape.model}"
    )
    names = [device.rpartition("device:")[2] for device in devices]
    return dtensor.create_mesh([(BATCH, shape.batch), (MODEL, shape.model)], devices=names)


def prepare_devices(distribution: DistributionConfig) -> None:
    """Split a machine's CPU into the devices a mesh or a pipeline needs, when it has
    no GPUs, while TensorFlow's runtime has not started yet."""
    if tf.config.list_physical_devices("GPU"):
        return
    if distribution.mesh is not None:
        _split_cpu(distribution.mesh.devices)
    elif distribution.pipeline is not None:
        _split_cpu(distribution.pipeline.stages)


def _split_cpu(count: int) -> None:
    cpu = tf.config.list_physical_devices("CPU")[0]
    if len(tf.config.get_logical_device_configuration(cpu) or [cpu]) >= count:
        return
    # Once the runtime has started, the devices it has are the ones.
    with contextlib.suppress(RuntimeError):
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(count)]
        )


def megatron_layouts(
    mesh: dtensor.Mesh, *, vocabulary: int | None = None, language_model_heads: tuple[str, ...] = ()
) -> keras.dtensor.experimental.LayoutMap:
    """Where each of the zoo Transformer's and GPT's weights lives on ``mesh``.

    The language-model heads' logits are split when ``vocabulary`` (the token inputs'
    vocabulary size) divides evenly over the ``model`` axis, and replicated otherwise.
    """
    unsplit = dtensor.UNSHARDED

    def layout(*dimensions: str) -> dtensor.Layout:
        return dtensor.Layout(list(dimensions), mesh)

    layouts = keras.dtensor.experimental.LayoutMap(mesh=mesh)
    layouts[r".*_attention\._(query|key|value)_dense\.kernel"] = layout(unsplit, MODEL, unsplit)
    layouts[r".*_attention\._(query|key|value)_dense\.bias"] = layout(MODEL, unsplit)
    layouts[r".*_attention\._output_dense\.kernel"] = layout(MODEL, unsplit, unsplit)
    layouts[r".*_ffn_in\.kernel"] = layout(unsplit, MODEL)
    layouts[r".*_ffn_in\.bias"] = layout(MODEL)
    layouts[r".*_ffn_out\.kernel"] = layout(MODEL, unsplit)
    # A mixture of experts is split by expert: each device holds whole experts.
    layouts[r".*_experts\.experts_(in|out)_kernel"] = layout(MODEL, unsplit, unsplit)
    layouts[r".*_experts\.experts_(in|out)_bias"] = layout(MODEL, unsplit)
    # By width, not by row: DTensor has no lookup into a table split by rows. Token and
    # position tables alike, since their rows are added.
    layouts[r".*_embedding\.(token|position)_embedding\.embeddings"] = layout(unsplit, MODEL)
    if vocabulary is not None and vocabulary % mesh.dim_size(MODEL) == 0:
        for head in language_model_heads:
            layouts[rf"{re.escape(head)}_logits\.kernel"] = layout(unsplit, MODEL)
            layouts[rf"{re.escape(head)}_logits\.bias"] = layout(MODEL)
    return layouts


def replicated(mesh: dtensor.Mesh, value: Any) -> tf.Tensor:
    """``value`` copied to every device of ``mesh``."""
    value = tf.convert_to_tensor(value)
    return dtensor.copy_to_mesh(value, dtensor.Layout.replicated(mesh, rank=value.shape.rank))


def split_over_batch(mesh: dtensor.Mesh, batch: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """A host batch as mesh tensors split along their first dimension over ``batch``.

    Device ``(b, m)`` of the mesh gets slice ``b``: the devices of one model group read
    the same examples.
    """
    groups, group_size = mesh.dim_size(BATCH), mesh.dim_size(MODEL)
    packed = {}
    for name, tensor in batch.items():
        slices = tf.split(tensor, groups, axis=0)
        layout = dtensor.Layout.batch_sharded(mesh, BATCH, rank=tensor.shape.rank)
        per_device = [slices[device // group_size] for device in range(groups * group_size)]
        packed[name] = dtensor.pack(per_device, layout)
    return packed


def local_shapes(variable: tf.Variable) -> list[tuple[int, ...]]:
    """The shape of the part of ``variable`` each device of its mesh holds."""
    return [tuple(part.shape) for part in dtensor.unpack(stored(variable).read_value())]


def place_weights(source: keras.Model, target: keras.Model) -> None:
    """Give ``target`` (built on a mesh) the weights of ``source`` (``matching_weights``),
    each laid out as the target's variable is."""
    for mine, theirs in matching_weights(source, target):
        variable = stored(theirs)
        layout = dtensor.fetch_layout(variable)
        variable.assign(dtensor.relayout(replicated(layout.mesh, mine.numpy()), layout))
