"""The Trainer: *how* one update and one evaluation run, on any distribution strategy.

Built from an experiment Task and a strategy, as Orbit's ``StandardTrainer``, it owns
the model, the optimizer and the input iterator, and compiles an execution of several
updates into one ``tf.function``. It has no loop and writes no files: the Controller
decides when to call it.

One update is forward, loss, gradients (accumulated over micro-batches), cross-replica
reduction and the optimizer step. Losses are summed per example and divided by the
*global* batch of one update (micro-batch x replicas x accumulation), so summing
gradients across micro-batches and replicas gives exactly the gradient of the mean loss
over the large batch: N accumulated micro-batches make the same update as one batch N
times larger. Gradients are all-reduced once per update and the optimizer then skips
aggregation; the loss-scale wrapper skips an update whose reduced gradients, or their
global norm, are not finite, the same decision on every replica, and counters of
skipped updates live in variables so that a multi-update execution keeps count inside
the graph.

Each replica's forward and backward pass is compiled with XLA (``training.jit_compile``),
which fuses the small ops a Keras model is made of: measured here 12-15 % less CPU per
update than the same step without it. A model holding ops XLA cannot compile (string
ops, ``py_function``) trains without it under ``auto``: the first execution tells, before
any update is applied, and the run log says why.

Every replica reads its own batches: the input is a distributed dataset whose global
batch of each update is split across the replicas of every worker, so R replicas see the
examples one device would see with the same global batch, and make its update.

Everything a resumed run needs to make bit-identical updates — weights, optimizer slots
and step, the loss scale, the learning-rate scale, dropout RNG state and the input's
position — is in ``checkpointed``, so one checkpoint, verified as a whole, holds them
all: weights can never be restored without the position they were trained to. The
position is a count of micro-batches, the same on every worker (each reads the same
stream and keeps its replicas' slices): the input stream is rebuilt from it
(``seek_input``), so a checkpoint never holds a shuffle buffer.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import tensorflow as tf
import tf_keras as keras

from research.experiments.config import ExperimentConfig
from research.experiments.task import ExperimentTask
from research.models.placement import is_placed
from research.models.weights import host_value
from training.distribution import WorkerRole
from training.errors import TrainingSetupError
from training.optimization import build_optimizer
from training.precision import apply_precision, needs_loss_scaling, resolve_precision
from training.verification import verify_training_shards


@dataclass(frozen=True)
class Execution:
    """What one compiled execution of several updates reports to the host."""

    loss: float  # mean over the execution's updates
    gradient_norm: float  # of its last update
    learning_rate: float  # of the next update
    stop_requested: bool  # some worker asked to stop
    note: str | None = None  # something the run log should say (how the step compiled)


def global_micro_batch_size(config: ExperimentConfig, replicas: int) -> int:
    """The global micro-batch of one update, checked to split evenly over ``replicas``.

    ``data.batch_size`` is one update's batch across every replica and accumulated
    micro-batch, so it must split evenly both ways.
    """
    accumulation = config.training.gradient_accumulation
    if config.data.batch_size % (accumulation * replicas):
        raise TrainingSetupError(
            f"data.batch_size: {config.data.batch_size} is not divisible by "
            f"gradient_accumulation x replicas = {accumulation * replicas}"
        )
    return config.data.batch_size // accumulation


def configure_determinism(config: ExperimentConfig) -> None:
    """Seeds everywhere; op determinism when asked (slower, but bit-reproducible)."""
    keras.utils.set_random_seed(config.seed)
    if config.training.deterministic:
        tf.config.experimental.enable_op_determinism()
    # Dropout and friends draw from tf.random.Generator variables, which checkpoints keep.
    keras.backend.experimental.enable_tf_random_generator()


def random_generators(model: keras.Model) -> list[tf.random.Generator]:
    """The generators dropout-like layers draw from: not model variables, so a checkpoint
    must hold them explicitly for a resumed run to draw the same masks."""
    generators = []
    for layer in model.submodules:
        generator = getattr(getattr(layer, "_random_generator", None), "_generator", None)
        if isinstance(generator, tf.random.Generator):
            generators.append(generator)
    return generators


def weights_digest(model: keras.Model) -> str:
    """SHA-256 over every weight's bytes: equal digests mean bit-identical models."""
    digest = hashlib.sha256()
    for weight in model.weights:
        digest.update(weight.name.encode())
        digest.update(host_value(weight).tobytes())
    return digest.hexdigest()


def per_example_losses(losses: Mapping[str, keras.losses.Loss]) -> dict[str, keras.losses.Loss]:
    """Copies of the losses that return one value per example instead of a batch mean."""
    unreduced = {}
    for name, loss in losses.items():
        config = loss.get_config()
        config["reduction"] = keras.losses.Reduction.NONE
        unreduced[name] = type(loss).from_config(config)
    return unreduced


def weighted_example_losses(
    losses: Mapping[str, keras.losses.Loss],
    weights: Mapping[str, float],
    labels: Any,
    outputs: Any,
) -> tf.Tensor:
    """Weighted sum of every head's loss (``per_example_losses``), one value per example."""
    total = None
    for name, loss in losses.items():
        value = loss(labels[name], outputs[name])  # [batch]: every head's loss is per example
        value = tf.cast(value, tf.float32) * weights.get(name, 1.0)
        total = value if total is None else total + value
    return total


def evaluation_names(task: ExperimentTask) -> list[str]:
    """The values :meth:`Trainer.evaluate` reports besides ``examples``.

    ``loss`` (weighted over heads), each head's own ``<head>_loss`` when there are
    several, and ``<head>_<metric>`` for each head's metrics.
    """
    names = ["loss"]
    for head, metrics in task.build_metrics().items():
        if len(task.heads) > 1:
            names.append(f"{head}_loss")
        names.extend(f"{head}_{metric.name}" for metric in metrics)
    return names


def _replica_local_zeros(like: Any) -> tf.Variable:
    """A per-replica buffer: each replica adds its own gradients, nothing is synced."""
    return tf.Variable(
        tf.zeros_like(like),
        trainable=False,
        synchronization=tf.VariableSynchronization.ON_READ,
        aggregation=tf.VariableAggregation.SUM,
    )


def _all_finite(gradients: list[Any]) -> tf.Tensor:
    """Whether every gradient value is finite (sparse gradients by their values; a
    variable the loss does not reach has None)."""
    values = [g.values if isinstance(g, tf.IndexedSlices) else g for g in gradients]
    return tf.reduce_all([tf.reduce_all(tf.math.is_finite(v)) for v in values if v is not None])


def _poison_if(condition: tf.Tensor, gradients: list[Any]) -> list[Any]:
    """The gradients, the first of them made NaN where ``condition`` holds so that the
    loss-scale optimizer skips the update.

    The optimizer checks every gradient, so one NaN is enough to skip; poisoning only
    one keeps this to two ops an update instead of two per variable (multiplying by one
    leaves it bit-identical when ``condition`` does not hold).
    """
    poisoned = list(gradients)
    index = next((i for i, gradient in enumerate(gradients) if gradient is not None), None)
    if index is None:
        return poisoned
    gradient = gradients[index]
    values = gradient.values if isinstance(gradient, tf.IndexedSlices) else gradient
    factor = tf.where(
        condition, tf.constant(float("nan"), values.dtype), tf.constant(1, values.dtype)
    )
    if isinstance(gradient, tf.IndexedSlices):
        poisoned[index] = tf.IndexedSlices(values * factor, gradient.indices, gradient.dense_shape)
    else:
        poisoned[index] = values * factor
    return poisoned


def _xla_refusal(error: tf.errors.OpError) -> str | None:
    """The op XLA could not compile, as TensorFlow names it, when that is what ``error``
    says; None for any other error."""
    lines = str(error).splitlines()
    for line in lines:
        if "Detected unsupported operations" in line:
            ops = sorted(set(re.findall(r"(\w+) \(No registered", line)))
            return f"unsupported ops: {', '.join(ops)}" if ops else line.strip()
    return next((line.strip() for line in lines if "tf2xla" in line), None)


def _sum_over_replicas(values: Any) -> Any:
    """``values`` summed over the replicas in sync; as they are with a single replica,
    where the all-reduce would only add identity ops (and a gradient wrapper) to every
    update."""
    context = tf.distribute.get_replica_context()
    if context.num_replicas_in_sync == 1:
        return values
    return context.all_reduce(tf.distribute.ReduceOp.SUM, values)


class TrainerState:
    """What the Controller reads, keeps and repairs of a trainer, wherever it trains."""

    model: keras.Model
    optimizer: keras.optimizers.Optimizer
    global_update_batch: int
    _losses: dict[str, keras.losses.Loss]
    _loss_weights: dict[str, float]
    input_position: tf.Variable
    lr_scale: tf.Variable
    _consecutive_nonfinite: tf.Variable
    _skipped_updates: tf.Variable

    @property
    def step(self) -> int:
        return int(self.optimizer.iterations.numpy())

    @property
    def checkpointed(self) -> dict[str, Any]:
        """The objects a checkpoint must hold."""
        return {
            "input_position": self.input_position,
            "model": self.model,
            "optimizer": self.optimizer,
            "lr_scale": self.lr_scale,
            "random": random_generators(self.model),
        }

    @property
    def consecutive_nonfinite(self) -> int:
        """Updates skipped in a row because their loss or gradients were not finite."""
        return int(self._consecutive_nonfinite.numpy())

    @property
    def skipped_updates(self) -> int:
        """Updates skipped by this process (a restore does not roll the count back)."""
        return int(self._skipped_updates.numpy())

    def forget_nonfinite(self) -> None:
        """Start counting non-finite updates in a row afresh (after a restore)."""
        self._consecutive_nonfinite.assign(tf.zeros_like(self._consecutive_nonfinite))

    def _part_loss(self, features: Any, labels: Any, parts: int) -> tf.Tensor:
        """The update's loss from one of its ``parts`` (replicas x micro-batches): the
        part's examples' losses over the global batch, plus the model's own losses (a
        mixture of experts' balance) shared among the parts, so the parts sum to it."""
        outputs = self.model(features, training=True)
        example_losses = weighted_example_losses(self._losses, self._loss_weights, labels, outputs)
        loss = tf.reduce_sum(example_losses) / float(self.global_update_batch)
        if self.model.losses:
            loss += tf.add_n(self.model.losses) / float(parts)
        return loss


class Trainer(TrainerState):
    """The model, optimizer and input of one worker (of ``role.count``), and their steps.

    Seeds and the precision policy are set here, before the model is built, because
    both decide what the model's variables are. ``precision`` is the policy a launcher
    chose for ``auto`` (by probing, see ``training.precision``); without it ``auto``
    means the hardware's default.
    """

    def __init__(
        self,
        task: ExperimentTask,
        strategy: tf.distribute.Strategy,
        role: WorkerRole,
        *,
        precision: str | None = None,
    ) -> None:
        config, training = task.config, task.config.training
        global_micro_batch = global_micro_batch_size(config, strategy.num_replicas_in_sync)
        self.task = task
        self.strategy = strategy
        self.role = role
        self.accumulation = training.gradient_accumulation
        self.global_update_batch = global_micro_batch * self.accumulation
        self.precision = precision or resolve_precision(training.precision)
        self.loss_scaling = needs_loss_scaling(self.precision)
        configure_determinism(config)
        apply_precision(self.precision)
        self.global_micro_batch = global_micro_batch
        # Micro-batches this run has consumed (each a global batch across the replicas).
        self.input_position = tf.Variable(0, trainable=False, dtype=tf.int64, name="position")
        # Checked now, before the model is built; the input itself is built once, at the
        # first update, from the position a restore may have set (``seek_input``).
        self._input_verify = verify_training_shards(task, record=role.is_chief)
        self.iterator: Any = None
        with strategy.scope():
            self.model = task.build_model()
            self.lr_scale = tf.Variable(1.0, trainable=False, dtype=tf.float32, name="lr_scale")
            self.optimizer, self.schedule = build_optimizer(
                training.optimizer,
                training.schedule,
                task.total_steps,
                self.lr_scale,
                loss_scaling=self.loss_scaling,
            )
            self.optimizer.build(self.model.trainable_variables)
            self._consecutive_nonfinite = tf.Variable(0, dtype=tf.int64, trainable=False)
            self._skipped_updates = tf.Variable(0, dtype=tf.int64, trainable=False)
            accumulate = self.accumulation > 1
            variables = self.model.trainable_variables
            self._accumulators = [_replica_local_zeros(v) for v in variables] if accumulate else []
            self._loss_accumulator = (
                _replica_local_zeros(tf.zeros((), tf.float32)) if accumulate else None
            )
        self._clip_global_norm = training.optimizer.clip_global_norm
        self._losses = per_example_losses(task.build_losses())
        self._loss_weights = task.loss_weights
        self._jit_compile = training.jit_compile
        placed = is_placed(self.model)
        self.jit_compiled = training.jit_compile is not False and not placed
        if training.jit_compile is True and placed:
            raise TrainingSetupError(
                "training.jit_compile: true compiles for one device; a pipeline's blocks sit "
                "on several (use auto or false)"
            )
        self._first_execution = True
        self._execute = self._compile_execution()
        self._evaluation = self._build_evaluation()
        self._evaluate_batch = self._compile_evaluation()  # traced once per run

    # -- the input ---------------------------------------------------------------------
    def seek_input(self) -> None:
        """Read the input from ``input_position`` on (after restoring it)."""
        self.iterator = self.input_iterator(int(self.input_position.numpy()))

    def input_iterator(self, position: int) -> Any:
        """The distributed input from micro-batch ``position`` on.

        Each worker's pipeline yields per-replica batches of its own replicas (one each
        per micro-batch), cut from the same global stream, which
        ``distribute_datasets_from_function`` hands to the replicas in turn.
        """
        task, split = self.task, self.task.config.data.train_split
        global_micro_batch = self.global_micro_batch

        def pipeline(context: tf.distribute.InputContext) -> tf.data.Dataset:
            return task.build_inputs(
                split,
                batch_size=context.get_per_replica_batch_size(global_micro_batch),
                training=True,
                input_context=context,
                start_batch=position * context.num_replicas_in_sync,
                verify=self._input_verify,
            )

        return iter(self.strategy.distribute_datasets_from_function(pipeline))

    # -- training ----------------------------------------------------------------------
    def train(self, num_updates: int, *, stop_requested: bool) -> Execution:
        """Run ``num_updates`` updates in one compiled execution.

        ``stop_requested`` is this worker's vote to stop; every worker learns whether
        any of them voted, so all stop after the same update.
        """
        if self.iterator is None:
            self.seek_input()
        arguments = (num_updates, tf.constant(float(stop_requested)))
        note = None
        try:
            loss, norm, stop, rate = self._execute(self.iterator, *arguments)
        except tf.errors.InvalidArgumentError as error:
            note = self._fall_back_from_xla(error)
            loss, norm, stop, rate = self._execute(self.iterator, *arguments)
        if self._first_execution and self.jit_compiled:
            note = "forward and backward pass compiled with XLA"
        self._first_execution = False
        self.input_position.assign_add(num_updates * self.accumulation)
        return Execution(float(loss), float(norm), float(rate), float(stop) > 0, note)

    def _fall_back_from_xla(self, error: tf.errors.InvalidArgumentError) -> str:
        """Rebuild the execution without XLA when XLA refused the model at the first
        execution, and say so for the run log; any other error is raised as it is.

        Nothing was applied: the refusal comes at the first forward pass, after only the
        input moved on, and the input is read again from its position.
        """
        reason = _xla_refusal(error)
        if not (self._first_execution and self.jit_compiled and reason):
            raise error
        if self._jit_compile is True:
            raise TrainingSetupError(
                f"training.jit_compile: true, but the model does not compile with XLA "
                f"({reason}); set it to auto or false"
            ) from None
        self.jit_compiled = False
        self._execute = self._compile_execution()
        self.seek_input()
        return f"XLA cannot compile this model ({reason}); training without it"

    def _compile_execution(self) -> Any:
        update, schedule, optimizer = self._update, self.schedule, self.optimizer
        self._replica_gradients = (
            tf.function(self._gradients, jit_compile=True) if self.jit_compiled else self._gradients
        )

        @tf.function
        def execute(iterator: Any, num_updates: tf.Tensor, stop: tf.Tensor) -> Any:
            total = tf.constant(0.0)
            norm = tf.constant(0.0)
            any_stop = tf.constant(0.0)
            for _ in tf.range(num_updates):
                loss, norm, any_stop = update(iterator, stop)
                total += loss
            mean = total / tf.cast(num_updates, tf.float32)
            return mean, norm, any_stop, schedule(optimizer.iterations)

        # One update (steps_per_execution's default) needs no in-graph loop, whose body and
        # condition graphs make the execution slower to trace. Each is traced when first used.
        @tf.function
        def execute_one(iterator: Any, stop: tf.Tensor) -> Any:
            loss, norm, any_stop = update(iterator, stop)
            return loss, norm, any_stop, schedule(optimizer.iterations)

        def dispatch(iterator: Any, num_updates: int, stop: tf.Tensor) -> Any:
            if num_updates == 1:
                return execute_one(iterator, stop)
            return execute(iterator, tf.constant(num_updates), stop)

        return dispatch

    def _update(self, iterator: Any, stop: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """Consume ``accumulation`` batches from ``iterator`` and apply one update.

        Returns the update's mean loss, global gradient norm and whether any worker
        asked to stop, all identical on every replica.
        """
        strategy = self.strategy
        if self.accumulation == 1:
            features, labels = next(iterator)
            result = strategy.run(self._update_single, args=(features, labels, stop))
        else:
            for _ in range(self.accumulation):
                features, labels = next(iterator)
                strategy.run(self._accumulate, args=(features, labels))
            result = strategy.run(self._update_accumulated, args=(stop,))
        loss, norm, finite, stop = (strategy.experimental_local_results(v)[0] for v in result)
        consecutive = self._consecutive_nonfinite
        consecutive.assign(tf.where(finite, tf.constant(0, tf.int64), consecutive + 1))
        self._skipped_updates.assign_add(tf.cast(tf.logical_not(finite), tf.int64))
        return loss, norm, stop

    # -- replica functions -------------------------------------------------------------
    def _gradients(self, features: Any, labels: Any) -> tuple[list[tf.Tensor], tf.Tensor]:
        with tf.GradientTape() as tape:
            parts = self.strategy.num_replicas_in_sync * self.accumulation
            loss = self._part_loss(features, labels, parts)
            scaled = self.optimizer.get_scaled_loss(loss) if self.loss_scaling else loss
        variables = self.model.trainable_variables
        gradients = tape.gradient(scaled, variables)
        if self.loss_scaling:
            gradients = self.optimizer.get_unscaled_gradients(gradients)
        return gradients, loss

    def _accumulate(self, features: Any, labels: Any) -> None:
        gradients, loss = self._replica_gradients(features, labels)
        for accumulator, gradient in zip(self._accumulators, gradients, strict=True):
            accumulator.assign_add(gradient)
        self._loss_accumulator.assign_add(loss)

    def _apply(self, gradients: list[tf.Tensor], loss: tf.Tensor, stop: tf.Tensor) -> Any:
        # A value passed into the replica function has no device for the collective until it
        # is an op of the replica's own (MultiWorkerMirroredStrategy refuses it otherwise).
        gradients = _sum_over_replicas(gradients)
        loss = _sum_over_replicas(loss)
        stop = _sum_over_replicas(tf.identity(stop))  # > 0: some worker asked to stop
        norm = tf.linalg.global_norm(gradients)
        norm_finite = tf.math.is_finite(norm)
        if self.loss_scaling:
            # Non-finite gradients are the dynamic loss scale overflowing, which the
            # optimizer answers by lowering it; only finite gradients whose global norm
            # overflows make the update count as non-finite.
            overflow = tf.logical_and(_all_finite(gradients), tf.logical_not(norm_finite))
            finite = tf.logical_and(tf.math.is_finite(loss), tf.logical_not(overflow))
            # Finite gradients whose global norm overflows pass the loss-scale optimizer's
            # check, and global-norm clipping then turns every one of them into NaN: such
            # an update is poisoned, so it is skipped (gradients that are not all finite
            # are skipped anyway, so poisoning them too changes nothing).
            gradients = _poison_if(tf.logical_not(norm_finite), gradients)
        else:
            finite = tf.logical_and(tf.math.is_finite(loss), norm_finite)
        if self._clip_global_norm is not None:
            # The norm is at hand: the optimizer's own clipping would compute it again.
            gradients, _ = tf.clip_by_global_norm(gradients, self._clip_global_norm, use_norm=norm)
        if self.loss_scaling:  # the loss-scale optimizer decides whether to apply
            self.optimizer.apply_gradients(
                zip(gradients, self.model.trainable_variables, strict=True),
                skip_gradients_aggregation=True,
            )
        else:
            tf.distribute.get_replica_context().merge_call(
                self._apply_if_finite, args=(finite, gradients)
            )
        return loss, norm, finite, stop

    def _apply_if_finite(
        self, strategy: tf.distribute.Strategy, finite: Any, gradients: list[Any]
    ) -> None:
        """Apply the summed gradients, or skip the update (still counting it, as the
        loss-scale optimizer does) when it is not finite.

        The condition is taken across replicas (as the loss-scale optimizer takes its
        own): an optimizer applying gradients cannot be called inside a condition of one
        replica, so the branch that applies enters every replica again.
        """
        apply_now = strategy.experimental_local_results(finite)[0]  # the same on every replica
        optimizer = self.optimizer

        def apply_in_replica(gradients: list[Any]) -> None:
            optimizer.apply_gradients(
                zip(gradients, self.model.trainable_variables, strict=True),
                skip_gradients_aggregation=True,
            )

        def apply() -> None:
            strategy.extended.call_for_each_replica(apply_in_replica, args=(gradients,))

        def skip() -> None:
            optimizer.iterations.assign_add(1, read_value=False)

        tf.cond(apply_now, apply, skip)

    def _update_single(self, features: Any, labels: Any, stop: tf.Tensor) -> Any:
        gradients, loss = self._replica_gradients(features, labels)
        return self._apply(gradients, loss, stop)

    def _update_accumulated(self, stop: tf.Tensor) -> Any:
        gradients = [accumulator.read_value() for accumulator in self._accumulators]
        loss = self._loss_accumulator.read_value()
        result = self._apply(gradients, loss, stop)
        for accumulator in self._accumulators:
            accumulator.assign(tf.zeros_like(accumulator))
        self._loss_accumulator.assign(0.0)
        return result

    # -- evaluation --------------------------------------------------------------------
    def evaluate(self, split: str) -> dict[str, float]:
        """Loss and metrics of the current weights on one split (see ``evaluation_names``).

        Sharded as training is: each replica of each worker evaluates its slice of every
        global batch, and the sums meet in the metrics' cross-replica reduction. The
        stream's last global batch is completed with padding records (so every replica
        runs as many batches, as collectives require), which a mask leaves out.
        """
        task, strategy = self.task, self.strategy
        per_replica = task.config.data.batch_size // strategy.num_replicas_in_sync
        dataset = strategy.distribute_datasets_from_function(
            lambda context: task.build_inputs(split, batch_size=per_replica, input_context=context)
        )
        self._evaluation.reset()
        records = tf.constant(task.manifest.splits[split].num_records, tf.int64)
        for index, (features, labels) in enumerate(dataset):
            self._evaluate_batch(features, labels, tf.constant(index, tf.int64), records)
        return self._evaluation.results(task.loss_weights)

    def _build_evaluation(self) -> Evaluation:
        """Built once, under the strategy, so that reading it sums every replica's part."""
        with self.strategy.scope():
            return Evaluation(self._losses, self.task.build_metrics())

    def _compile_evaluation(self) -> Any:
        strategy = self.strategy

        @tf.function
        def evaluate_batch(
            features: Any, labels: Any, index: tf.Tensor, records: tf.Tensor
        ) -> None:
            strategy.run(self._evaluate_replica, args=(features, labels, index, records))

        return evaluate_batch

    def _evaluate_replica(
        self, features: Any, labels: Any, index: tf.Tensor, records: tf.Tensor
    ) -> None:
        """Add one replica's batch ``index`` to the metrics, without its padding records."""
        context = tf.distribute.get_replica_context()
        size = tf.shape(next(iter(labels.values())), out_type=tf.int64)[0]
        replica = tf.cast(context.replica_id_in_sync_group, tf.int64)
        first = (index * self.strategy.num_replicas_in_sync + replica) * size
        mask = tf.cast(first + tf.range(size) < records, tf.float32)
        self._evaluation.update(labels, self.model(features, training=False), mask)


class Evaluation:
    """Per-head loss means, the task's metrics and an example count over one split.

    ``update`` adds a batch, leaving out the examples ``mask`` zeroes (the padding that
    completes a split's last global batch); ``results`` names the figures as
    ``evaluation_names`` says.
    """

    def __init__(
        self, losses: Mapping[str, keras.losses.Loss], metrics: dict[str, list[Any]]
    ) -> None:
        self._losses = dict(losses)
        self.loss_means = {name: keras.metrics.Mean(name=f"{name}_loss") for name in losses}
        self.metrics = metrics
        self.count = keras.metrics.Sum(name="examples")

    def reset(self) -> None:
        metrics = (metric for items in self.metrics.values() for metric in items)
        for metric in [*self.loss_means.values(), *metrics, self.count]:
            metric.reset_state()

    def update(self, labels: Any, outputs: Any, mask: tf.Tensor) -> None:
        for name, loss in self._losses.items():
            value = tf.cast(loss(labels[name], outputs[name]), tf.float32)
            self.loss_means[name].update_state(value, sample_weight=mask)
        for name, items in self.metrics.items():
            rank = labels[name].shape.rank
            weight = tf.broadcast_to(
                tf.reshape(mask, [-1] + [1] * (rank - 1)), tf.shape(labels[name])
            )
            for metric in items:
                metric.update_state(labels[name], outputs[name], sample_weight=weight)
        self.count.update_state(tf.reduce_sum(mask))

    def results(self, weights: Mapping[str, float]) -> dict[str, float]:
        means = self.loss_means
        results = {"loss": sum(float(means[name].result()) * weights[name] for name in means)}
        for name, items in self.metrics.items():
            if len(means) > 1:
                results[f"{name}_loss"] = float(means[name].result())
            for metric in items:
                results[f"{name}_{metric.name}"] = float(metric.result())
        results["examples"] = float(self.count.result())
        return results
