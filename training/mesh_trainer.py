"""The Trainer on a DTensor mesh: weights sharded over ``model``, batches over ``batch``.

It keeps the ``Trainer``'s contract (the Controller, checkpoints and export drive both
alike) and its arithmetic: losses summed per example over the global batch, global-norm
clipping with the norm it logs, an update with a non-finite loss or norm skipped and
counted. What differs is where tensors live. The model is built under the Megatron
layouts of ``training.mesh``, so every variable is a ``DVariable`` with its layout, the
optimizer's slots follow those layouts, and DTensor's SPMD expansion inserts the
collectives each op needs; a host batch is split over the mesh's ``batch`` axis before
an update. Gradients are made dense (DTensor has no layout for a sparse scatter into a
sharded table) and laid out as their variables are before the optimizer sees them.
Evaluation brings the outputs back to the host and scores them there, with the metrics
the ``Trainer`` uses. An update is one mesh program (``steps_per_execution`` does not
group them here).

Not on a mesh: gradient accumulation, mixed precision (Keras's ``LayoutMap`` does not
lay out the cast-on-read variables a mixed policy makes), several workers and XLA
(DTensor compiles its own SPMD program); each is refused as a setup error, and
``precision: auto`` means float32.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
import tf_keras as keras
from tensorflow.experimental import dtensor

from research.experiments.task import ExperimentTask
from research.models.configs import ModelConfig, MultiTaskConfig, TransformerShape
from research.models.weights import stored
from training.distribution import WorkerRole
from training.errors import TrainingSetupError
from training.mesh import (
    local_mesh,
    megatron_layouts,
    place_weights,
    replicated,
    split_over_batch,
)
from training.optimization import build_optimizer
from training.precision import apply_precision
from training.trainer import (
    Evaluation,
    Execution,
    TrainerState,
    configure_determinism,
    per_example_losses,
)
from training.verification import verify_training_shards

# What ``precision: auto`` means on a mesh, and the only policy one trains in.
MESH_PRECISION = "float32"


def _mesh_variable(mesh: dtensor.Mesh, value: Any, name: str) -> dtensor.DVariable:
    """A scalar the update reads or writes, replicated on ``mesh`` (an update's ops
    cannot mix mesh tensors with ordinary ones)."""
    return dtensor.DVariable(replicated(mesh, value), trainable=False, name=name)


def check_mesh_setup(task: ExperimentTask, role: WorkerRole, precision: str) -> None:
    """Refuse, before anything is built, what training on a mesh does not do."""
    config = task.config
    shape = config.distribution.mesh
    assert shape is not None
    if role.count > 1:
        raise TrainingSetupError(
            "distribution.mesh trains in one process over its local devices; "
            f"it cannot be combined with {role.count} workers"
        )
    if config.training.gradient_accumulation > 1:
        raise TrainingSetupError(
            "distribution.mesh: training.gradient_accumulation > 1 is not supported on a mesh"
        )
    if precision != MESH_PRECISION:
        raise TrainingSetupError(
            f"distribution.mesh: training.precision {precision} is not supported on a mesh "
            "(Keras lays out only variables that are not cast on read); use float32 or auto"
        )
    if config.training.jit_compile is True:
        raise TrainingSetupError(
            "distribution.mesh: training.jit_compile: true is not supported on a mesh "
            "(DTensor compiles its own program); use auto or false"
        )
    for key, size in _split_sizes(config.model):
        if size % shape.model:
            raise TrainingSetupError(
                f"model.{key}: {size} does not split over the mesh's model axis ({shape.model})"
            )
    if config.data.batch_size % shape.batch:
        raise TrainingSetupError(
            f"data.batch_size: {config.data.batch_size} is not divisible by the mesh's "
            f"batch axis ({shape.batch})"
        )


def check_mesh_model(model: keras.Model) -> None:
    """Refuse a model with a subclassed part, before the mesh builds it again.

    The mesh builds the model a second time inside Keras' layout scope, where variables are
    created lazily and laid out once the model is finished; a subclassed model's ``call``
    then receives ``None`` for every input. Functional and Sequential models, the zoo's
    and researchers' own, are laid out layer by layer.
    """
    subclassed = [
        part
        for part in [model, *model.submodules]
        if isinstance(part, keras.Model) and not getattr(part, "_is_graph_network", False)
    ]
    if subclassed:
        names = ", ".join(sorted({type(part).__name__ for part in subclassed}))
        raise TrainingSetupError(
            f"model.build: a subclassed Keras model ({names}) cannot be laid out on a "
            "mesh (distribution.mesh); build it as a functional model (keras.Model(inputs, "
            "outputs)), or train it with --workers or on one device"
        )


def _padded(batch: dict[str, tf.Tensor], size: int) -> dict[str, tf.Tensor]:
    """Every tensor of ``batch`` completed with zeros to ``size`` examples."""
    padded = {}
    for name, tensor in batch.items():
        missing = size - int(tf.shape(tensor)[0])
        padding = [[0, missing]] + [[0, 0]] * (tensor.shape.rank - 1)
        padded[name] = tf.pad(tensor, padding) if missing else tensor
    return padded


def _split_sizes(model: ModelConfig | None) -> list[tuple[str, int]]:
    """The zoo config's sizes a Megatron split divides: heads, widths, experts."""
    if model is None:
        return []
    family = model.root
    prefix = ""
    if isinstance(family, MultiTaskConfig):
        family, prefix = family.trunk, "trunk."
    if not isinstance(family, TransformerShape):
        return []
    sizes = {"num_heads": family.num_heads, "d_model": family.d_model, "ff_dim": family.ff_dim}
    if family.experts is not None:
        sizes["experts.num_experts"] = family.experts.num_experts
    return [(prefix + key, size) for key, size in sizes.items()]


class MeshTrainer(TrainerState):
    """The model, optimizer and input of a run on a ``batch x model`` device mesh (its
    checkpoint holds every variable sharded, as each device holds it)."""

    accumulation = 1
    jit_compiled = False

    def __init__(
        self, task: ExperimentTask, role: WorkerRole, *, precision: str | None = None
    ) -> None:
        config, training = task.config, task.config.training
        assert config.distribution.mesh is not None
        requested = training.precision
        self.precision = precision or (MESH_PRECISION if requested == "auto" else requested)
        check_mesh_setup(task, role, self.precision)
        self.task = task
        self.role = role
        # The Controller's and the checkpoints' strategy scopes: the default, a no-op.
        self.strategy = tf.distribute.get_strategy()
        self.mesh = mesh = local_mesh(config.distribution.mesh)
        self.global_update_batch = config.data.batch_size
        configure_determinism(config)
        apply_precision(self.precision)
        self.input_position = _mesh_variable(mesh, tf.constant(0, tf.int64), "position")
        self._input_verify = verify_training_shards(task, record=role.is_chief)
        self.iterator: Any = None
        vocabularies = {spec.vocab_size for spec in task.inputs.values() if spec.kind == "tokens"}
        layouts = megatron_layouts(
            mesh,
            vocabulary=vocabularies.pop() if len(vocabularies) == 1 else None,
            language_model_heads=tuple(
                name for name, head in task.heads.items() if head.kind == "language_model"
            ),
        )
        # Built on the host first, then laid out on the mesh: DTensor's initializers
        # draw other numbers than one device's, and the same seed should make the same
        # model (and a mesh run the one-device run, up to rounding).
        initial = task.build_model()
        check_mesh_model(initial)
        with layouts.scope():
            self.model = task.build_model()
        place_weights(initial, self.model)
        del initial
        self.lr_scale = _mesh_variable(mesh, 1.0, "lr_scale")
        self.optimizer, self.schedule = build_optimizer(
            training.optimizer,
            training.schedule,
            task.total_steps,
            self.lr_scale,
            loss_scaling=False,
            mesh=mesh,
        )
        self.optimizer.build(self.model.trainable_variables)
        self._variable_layouts = [
            dtensor.fetch_layout(stored(variable)) for variable in self.model.trainable_variables
        ]
        self._consecutive_nonfinite = _mesh_variable(mesh, tf.constant(0, tf.int64), "nonfinite")
        self._skipped_updates = _mesh_variable(mesh, tf.constant(0, tf.int64), "skipped")
        self._clip_global_norm = training.optimizer.clip_global_norm
        self._losses = per_example_losses(task.build_losses())
        self._loss_weights = task.loss_weights
        self._update = tf.function(self._update_on_mesh)
        self._predict = tf.function(self._outputs_on_host_layout)
        self._evaluation = Evaluation(self._losses, task.build_metrics())
        self._score = tf.function(self._evaluation.update)

    # -- the input ---------------------------------------------------------------------
    def seek_input(self) -> None:
        """Read the input from ``input_position`` on (after restoring it)."""
        position = int(self.input_position.numpy())
        task = self.task
        dataset = task.build_inputs(
            task.config.data.train_split,
            batch_size=self.global_update_batch,
            training=True,
            start_batch=position,
            verify=self._input_verify,
        )
        self.iterator = iter(dataset)

    # -- training ----------------------------------------------------------------------
    def train(self, num_updates: int, *, stop_requested: bool) -> Execution:
        """Run ``num_updates`` updates, one mesh program each."""
        if self.iterator is None:
            self.seek_input()
        total, norm, mesh = 0.0, 0.0, self.mesh
        for _ in range(num_updates):
            features, labels = next(self.iterator)
            loss, norm_tensor = self._update(
                split_over_batch(mesh, features), split_over_batch(mesh, labels)
            )
            total += float(loss.numpy())
            norm = float(norm_tensor.numpy())
        self.input_position.assign_add(replicated(self.mesh, tf.constant(num_updates, tf.int64)))
        rate = float(self.schedule(self.optimizer.iterations).numpy())
        return Execution(total / num_updates, norm, rate, stop_requested)

    def _update_on_mesh(self, features: Any, labels: Any) -> tuple[tf.Tensor, tf.Tensor]:
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            loss = self._part_loss(features, labels, parts=1)
        # Dense, and laid out as their variables are: a replicated weight used on a
        # split activation (a norm's scale on the split residual stream) gets a split
        # gradient, which its update must not take for the whole.
        gradients = [
            dtensor.relayout(tf.convert_to_tensor(gradient), layout)
            for gradient, layout in zip(
                tape.gradient(loss, variables), self._variable_layouts, strict=True
            )
        ]
        norm = tf.linalg.global_norm(gradients)
        finite = tf.logical_and(tf.math.is_finite(loss), tf.math.is_finite(norm))
        if self._clip_global_norm is not None:
            gradients, _ = tf.clip_by_global_norm(gradients, self._clip_global_norm, use_norm=norm)
        optimizer = self.optimizer

        def apply() -> tf.Tensor:
            optimizer.apply_gradients(zip(gradients, variables, strict=True))
            return tf.constant(True)

        def skip() -> tf.Tensor:
            optimizer.iterations.assign_add(1, read_value=False)
            return tf.constant(False)

        tf.cond(finite, apply, skip)
        zero = tf.zeros_like(self._consecutive_nonfinite)
        consecutive = self._consecutive_nonfinite
        consecutive.assign(tf.where(finite, zero, consecutive + 1))
        self._skipped_updates.assign_add(tf.cast(tf.logical_not(finite), tf.int64))
        return loss, norm

    # -- evaluation --------------------------------------------------------------------
    def _outputs_on_host_layout(self, features: Any) -> dict[str, tf.Tensor]:
        outputs = self.model(features, training=False)
        return {
            name: dtensor.relayout(value, dtensor.Layout.replicated(self.mesh, value.shape.rank))
            for name, value in outputs.items()
        }

    def evaluate(self, split: str) -> dict[str, float]:
        """Loss and metrics of the current weights on one split, scored on the host."""
        task = self.task
        dataset = task.build_inputs(split, batch_size=self.global_update_batch)
        self._evaluation.reset()
        records = task.manifest.splits[split].num_records
        batch = self.global_update_batch
        for index, (features, labels) in enumerate(dataset):
            # The last batch is completed with zeros, for the mesh's batch axis to split
            # it; the mask leaves them out.
            outputs = self._predict(split_over_batch(self.mesh, _padded(features, batch)))
            host = {name: dtensor.unpack(value)[0] for name, value in outputs.items()}
            mask = tf.cast(index * batch + tf.range(batch) < records, tf.float32)
            self._score(_padded(labels, batch), host, mask)
        return self._evaluation.results(task.loss_weights)
