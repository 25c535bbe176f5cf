"""Knowledge distillation: a smaller zoo model trained on the source model's soft targets.

Pruning and quantization shrink the numbers of one architecture; distillation changes
the architecture. The student is the model a student experiment file names, built for
the teacher's inputs and heads and trained on the teacher's dataset, with a loss that
mixes the usual hard-label loss with the teacher's temperature-softened probabilities
(Hinton et al., 2015): the soft targets say which wrong classes are nearly right, which
is what lets a small model learn more from the same examples than the labels alone.

Training goes through :func:`compression.finetune.fine_tune` like every retraining
method; only the loss differs, so :class:`Distiller` overrides ``compute_loss`` and
nothing else of Keras' training step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tensorflow as tf
import tf_keras as keras

from compression.convert import to_tflite
from compression.errors import CompressionError
from compression.finetune import TrainingData, copy_model, fine_tune
from compression.loading import output_names
from compression.methods import DEFAULT_ALPHA, DEFAULT_TEMPERATURE
from compression.result import CompressedModel
from research.experiments.config import ExperimentConfig, load_experiment
from research.models import HeadSpec
from research.models.registry import build_model

_EPSILON = 1e-7


@dataclass(frozen=True)
class Student:
    """The student experiment: its model, epochs and learning rate (its data is unused:
    a student learns from the teacher's dataset)."""

    path: Path
    config: ExperimentConfig

    @classmethod
    def load(cls, path: str | Path) -> Student:
        """Read and check the file before anything trains (no TensorFlow involved)."""
        try:
            config = load_experiment(path)
        except Exception as exc:  # ConfigError, OSError, YAML errors
            raise CompressionError(f"--student {path}: {exc}") from None
        if config.model is None:
            raise CompressionError(f"--student {path}: the experiment names no model")
        if config.training.epochs is None:
            raise CompressionError(f"--student {path}: give training.epochs (not steps)")
        return cls(Path(path), config)

    @property
    def epochs(self) -> int:
        assert self.config.training.epochs is not None
        return self.config.training.epochs

    @property
    def learning_rate(self) -> float:
        return float(self.config.training.optimizer.learning_rate)


def _as_dict(outputs: Any, names: list[str]) -> dict[str, tf.Tensor]:
    if isinstance(outputs, Mapping):
        return dict(outputs)
    return dict(zip(names, tf.nest.flatten(outputs), strict=True))


def soften(probabilities: tf.Tensor, temperature: float) -> tf.Tensor:
    """Probabilities at ``temperature``: softmax(log p / T) is softmax(logits / T),
    since log p differs from the logits by a constant per example."""
    return tf.nn.softmax(tf.math.log(probabilities + _EPSILON) / temperature, axis=-1)


class Distiller(keras.Model):
    """The student, trained on a mix of hard-label and teacher soft-target losses.

    ``fine_tune`` compiles it with the heads' usual losses (the hard part); the soft
    part is the KL divergence between the softened teacher and student distributions
    of each classification head, scaled by T² so its gradients keep their size as T
    changes. Other heads learn from their labels only.
    """

    def __init__(
        self,
        student: keras.Model,
        teacher: keras.Model,
        heads: Mapping[str, HeadSpec],
        temperature: float,
        alpha: float,
    ) -> None:
        super().__init__()
        self.student = student
        self.teacher = teacher
        self.names = output_names(student)
        self.soft_heads = [name for name, head in heads.items() if head.kind == "classification"]
        self.temperature = temperature
        self.alpha = alpha

    def call(self, inputs: Any, training: bool = False) -> dict[str, tf.Tensor]:
        return _as_dict(self.student(inputs, training=training), self.names)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None):  # noqa: ANN001 ANN201 - Keras' signature
        hard = super().compute_loss(x, y, y_pred, sample_weight)
        if not self.soft_heads:
            return hard
        teacher = _as_dict(self.teacher(x, training=False), self.names)
        kl = keras.losses.KLDivergence()
        soft = tf.add_n([
            kl(soften(teacher[name], self.temperature), soften(y_pred[name], self.temperature))
            for name in self.soft_heads
        ])  # fmt: skip
        return (1.0 - self.alpha) * hard + self.alpha * self.temperature**2 * soft


def distill(
    teacher: keras.Model,
    train: TrainingData,
    student: Student,
    *,
    heads: Mapping[str, HeadSpec],
    temperature: float = DEFAULT_TEMPERATURE,
    alpha: float = DEFAULT_ALPHA,
    seed: int = 0,
    verbose: int = 0,
) -> CompressedModel:
    """Train the student experiment's model on ``train`` against ``teacher``; its float32
    TFLite (the caller quantizes it further when asked)."""
    if temperature <= 0:
        raise CompressionError(f"--temperature must be > 0, got {temperature:g}")
    if not 0.0 <= alpha <= 1.0:
        raise CompressionError(f"--alpha must be within [0, 1], got {alpha:g}")
    keras.utils.set_random_seed(seed)
    try:
        model = build_model(
            student.config.model,
            train.io.inputs,
            heads,
            base_dir=student.config.base_dir,
            source=str(student.path),
        )
    except Exception as exc:  # ConfigError from the zoo: a model that cannot fit the data
        raise CompressionError(f"--student {student.path}: {exc}") from None
    frozen = copy_model(teacher)  # freezing the source itself would freeze its clones
    frozen.trainable = False
    distiller = Distiller(model, frozen, heads, temperature, alpha)
    history = fine_tune(
        distiller,
        train,
        heads,
        epochs=student.epochs,
        learning_rate=student.learning_rate,
        seed=seed,
        verbose=verbose,
    )
    details: dict[str, Any] = {
        "student": str(student.path),
        "student_model": student.config.model.model_dump(mode="json"),
        "teacher_parameters": teacher.count_params(),
        "student_parameters": model.count_params(),
        "temperature": temperature,
        "alpha": alpha,
        "epochs": student.epochs,
        "final_loss": history["loss"][-1],
    }
    return CompressedModel("distill", to_tflite(model), model, details)
