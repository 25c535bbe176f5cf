"""Learning-rate schedules and the optimizer an experiment asks for.

The schedule is a function of the optimizer's own step counter, which lives in the
checkpoint, so a resumed run continues the schedule exactly where it stopped.
``lr_scale`` is a variable (also checkpointed) that the trainer lowers after repeated
non-finite losses, without rebuilding the optimizer.
"""

from __future__ import annotations

import math
from typing import Any

import tensorflow as tf
import tf_keras as keras

from research.experiments.config import OptimizerConfig, ScheduleConfig


@keras.saving.register_keras_serializable(package="slipway")
class WarmupDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up to ``peak`` over ``warmup_steps``, then cosine or linear decay to
    ``peak * final_ratio`` at ``total_steps``, times a run-time ``scale`` variable."""

    def __init__(
        self,
        peak: float,
        total_steps: int,
        warmup_steps: int = 0,
        decay: str = "cosine",
        final_ratio: float = 0.0,
        scale: tf.Variable | None = None,
    ) -> None:
        super().__init__()
        self.peak = float(peak)
        self.total_steps = max(int(total_steps), 1)
        self.warmup_steps = int(warmup_steps)
        self.decay = decay
        self.final_ratio = float(final_ratio)
        self.scale = scale

    def __call__(self, step: Any) -> tf.Tensor:
        step = tf.cast(step, tf.float32)
        peak = tf.constant(self.peak, tf.float32)
        warmup = tf.constant(float(max(self.warmup_steps, 1)), tf.float32)
        warm = peak * tf.minimum(1.0, (step + 1.0) / warmup)
        span = float(max(self.total_steps - self.warmup_steps, 1))
        progress = tf.clip_by_value((step - float(self.warmup_steps)) / span, 0.0, 1.0)
        if self.decay == "cosine":
            shape = 0.5 * (1.0 + tf.cos(math.pi * progress))
        elif self.decay == "linear":
            shape = 1.0 - progress
        else:
            shape = tf.ones_like(progress)
        decayed = peak * (self.final_ratio + (1.0 - self.final_ratio) * shape)
        rate = tf.where(step < float(self.warmup_steps), warm, decayed)
        if self.scale is not None:
            rate = rate * tf.cast(self.scale, tf.float32)
        return rate

    def get_config(self) -> dict[str, Any]:
        return {
            "peak": self.peak,
            "total_steps": self.total_steps,
            "warmup_steps": self.warmup_steps,
            "decay": self.decay,
            "final_ratio": self.final_ratio,
        }


def build_optimizer(
    optimizer: OptimizerConfig,
    schedule: ScheduleConfig,
    total_steps: int,
    lr_scale: tf.Variable,
    *,
    loss_scaling: bool,
    mesh: Any = None,
) -> tuple[keras.optimizers.Optimizer, WarmupDecay]:
    """AdamW or SGD with the experiment's schedule (returned too, for logging); with
    ``loss_scaling`` (float16) wrapped in a dynamic loss-scale optimizer.

    ``optimizer.clip_global_norm`` is left to the trainer, which computes the gradients'
    global norm for its log and its non-finite check and clips with it
    (``tf.clip_by_global_norm(..., use_norm=norm)``, the same op the optimizer would
    run, without computing the norm a second time).

    The loss-scale wrapper scales the loss and skips an update whose gradients are not
    finite (lowering the scale). Other precisions need no scale, and the trainer skips
    their non-finite updates itself, from the global norm it computes anyway: a wrapper
    would test every gradient a second time, each update.

    With a DTensor ``mesh`` the optimizer's slots take their weights' layouts there.
    """
    rate = WarmupDecay(
        optimizer.learning_rate,
        total_steps,
        schedule.warmup_steps,
        schedule.decay,
        schedule.final_learning_rate_ratio,
        scale=lr_scale,
    )
    common = {
        "learning_rate": rate,
        "weight_decay": optimizer.weight_decay,
        **({"mesh": mesh} if mesh is not None else {}),
    }
    if optimizer.type == "sgd":
        inner = keras.optimizers.SGD(
            momentum=optimizer.momentum, nesterov=optimizer.nesterov, **common
        )
    else:
        inner = keras.optimizers.AdamW(
            beta_1=optimizer.beta_1, beta_2=optimizer.beta_2, epsilon=optimizer.epsilon, **common
        )
    if loss_scaling:
        return keras.mixed_precision.LossScaleOptimizer(inner), rate
    return inner, rate
