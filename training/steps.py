"""The compiled update: forward, loss, gradients (accumulated over micro-batches),
cross-replica reduction and the optimizer step, for any distribution strategy.

Losses are summed per example and divided by the *global* batch of one update
(micro-batch x replicas x accumulation), so summing gradients across micro-batches and
replicas gives exactly the gradient of the mean loss over the large batch: N
accumulated micro-batches make the same update as one batch N times larger.

Gradients are all-reduced once per update and the optimizer then skips aggregation;
the loss-scale wrapper skips an update whose reduced gradients are not finite, the same
decision on every replica. Counters for skipped updates live in variables so that a
multi-step execution can keep count inside the graph.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import tensorflow as tf
import tf_keras as keras


@dataclass
class StepState:
    """Variables the compiled update reads and writes besides the model's."""

    consecutive_nonfinite: tf.Variable
    skipped_updates: tf.Variable
    accumulators: list[tf.Variable]
    loss_accumulator: tf.Variable | None


def per_example_loss(
    losses: Mapping[str, keras.losses.Loss],
    weights: Mapping[str, float],
    labels: Mapping[str, tf.Tensor],
    outputs: Mapping[str, tf.Tensor],
) -> tf.Tensor:
    """Weighted sum of every head's loss, one value per example."""
    total = None
    for name, loss in losses.items():
        value = loss(labels[name], outputs[name])
        while value.shape.rank and value.shape.rank > 1:
            value = tf.reduce_mean(value, axis=-1)
        value = tf.cast(value, tf.float32) * weights.get(name, 1.0)
        total = value if total is None else total + value
    return total


def per_example_losses(losses: Mapping[str, keras.losses.Loss]) -> dict[str, keras.losses.Loss]:
    """Copies of the losses that return one value per example instead of a batch mean."""
    unreduced = {}
    for name, loss in losses.items():
        config = loss.get_config()
        config["reduction"] = keras.losses.Reduction.NONE
        unreduced[name] = type(loss).from_config(config)
    return unreduced


def _replica_local_zeros(like: Any) -> tf.Variable:
    """A per-replica buffer: each replica adds its own gradients, nothing is synced."""
    return tf.Variable(
        tf.zeros_like(like),
        trainable=False,
        synchronization=tf.VariableSynchronization.ON_READ,
        aggregation=tf.VariableAggregation.SUM,
    )


class UpdateStep:
    """Builds the replica functions of one update for ``model`` and ``optimizer``."""

    def __init__(
        self,
        strategy: tf.distribute.Strategy,
        model: keras.Model,
        optimizer: keras.optimizers.Optimizer,
        losses: Mapping[str, keras.losses.Loss],
        loss_weights: Mapping[str, float],
        *,
        global_micro_batch: int,
        accumulation: int,
        loss_only_finiteness: bool,
    ) -> None:
        self.strategy = strategy
        self.model = model
        self.optimizer = optimizer
        self.losses = per_example_losses(losses)
        self.weights = dict(loss_weights)
        self.global_update_batch = global_micro_batch * accumulation
        self.accumulation = accumulation
        self.loss_only_finiteness = loss_only_finiteness
        accumulate = accumulation > 1
        with strategy.scope():
            self.state = StepState(
                consecutive_nonfinite=tf.Variable(0, dtype=tf.int64, trainable=False),
                skipped_updates=tf.Variable(0, dtype=tf.int64, trainable=False),
                accumulators=[_replica_local_zeros(v) for v in model.trainable_variables]
                if accumulate
                else [],
                loss_accumulator=_replica_local_zeros(tf.zeros((), tf.float32))
                if accumulate
                else None,
            )

    # -- replica functions -------------------------------------------------------
    def _gradients(self, features: Any, labels: Any) -> tuple[list[tf.Tensor], tf.Tensor]:
        with tf.GradientTape() as tape:
            outputs = self.model(features, training=True)
            if not isinstance(outputs, Mapping):
                outputs = {self.model.output_names[0]: outputs}
            example_losses = per_example_loss(self.losses, self.weights, labels, outputs)
            loss = tf.reduce_sum(example_losses) / float(self.global_update_batch)
            if self.model.losses:
                replicas = self.strategy.num_replicas_in_sync
                loss += tf.add_n(self.model.losses) / float(replicas * self.accumulation)
            scaled = self.optimizer.get_scaled_loss(loss)
        variables = self.model.trainable_variables
        gradients = self.optimizer.get_unscaled_gradients(tape.gradient(scaled, variables))
        return gradients, loss

    def _accumulate(self, features: Any, labels: Any) -> None:
        gradients, loss = self._gradients(features, labels)
        for accumulator, gradient in zip(self.state.accumulators, gradients, strict=True):
            accumulator.assign_add(gradient)
        self.state.loss_accumulator.assign_add(loss)

    def _apply(self, gradients: list[tf.Tensor], loss: tf.Tensor, stop: tf.Tensor) -> Any:
        context = tf.distribute.get_replica_context()
        gradients = context.all_reduce(tf.distribute.ReduceOp.SUM, gradients)
        loss = context.all_reduce(tf.distribute.ReduceOp.SUM, loss)
        # A value passed into the replica function has no device for the collective until it
        # is an op of the replica's own (MultiWorkerMirroredStrategy refuses it otherwise).
        stop = context.all_reduce(tf.distribute.ReduceOp.SUM, tf.identity(stop))  # > 0: asked
        norm = tf.linalg.global_norm(gradients)
        finite = tf.math.is_finite(loss)
        if not self.loss_only_finiteness:
            finite = tf.logical_and(finite, tf.math.is_finite(norm))
        self.optimizer.apply_gradients(
            zip(gradients, self.model.trainable_variables, strict=True),
            skip_gradients_aggregation=True,
        )
        return loss, norm, finite, stop

    def _update_single(self, features: Any, labels: Any, stop: tf.Tensor) -> Any:
        gradients, loss = self._gradients(features, labels)
        return self._apply(gradients, loss, stop)

    def _update_accumulated(self, stop: tf.Tensor) -> Any:
        gradients = [accumulator.read_value() for accumulator in self.state.accumulators]
        loss = self.state.loss_accumulator.read_value()
        result = self._apply(gradients, loss, stop)
        for accumulator in self.state.accumulators:
            accumulator.assign(tf.zeros_like(accumulator))
        self.state.loss_accumulator.assign(0.0)
        return result

    # -- one update, called inside a tf.function ----------------------------------
    def update(self, iterator: Any, stop: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
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
        consecutive = self.state.consecutive_nonfinite
        consecutive.assign(tf.where(finite, tf.constant(0, tf.int64), consecutive + 1))
        self.state.skipped_updates.assign_add(tf.cast(tf.logical_not(finite), tf.int64))
        return loss, norm, stop
