"""Experiment configs: one YAML file says what to train, on what data, and how.

Loaded into typed, validated objects so that a typo or a wrong type fails before any
step runs, with the file, line and key path in the message. The model section may be
left out by a script that builds its own model (``ExperimentTask(config, model_fn=...)``). Relative paths in an
experiment are relative to the experiment file, so an experiment and its data can
move together.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from contracts.yaml_config import StrictModel, load_yaml_model
from research.models.configs import ModelConfig
from research.models.specs import HeadSpec

Precision = Literal["auto", "float32", "mixed_bfloat16", "mixed_float16"]

# The largest finite float32. Learning rates, loss weights and the optimizer's constants
# enter the update as float32 in every precision policy (mixed policies keep float32
# variables), so a larger value is infinity there and would poison every weight.
# Below the smallest float32 (a subnormal) a value rounds to 0: an epsilon of 1e-50 would
# divide by zero.
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_SMALLEST = 2.0**-149


def _finite_in_float32(value: float) -> float:
    if not math.isfinite(value) or abs(value) > FLOAT32_MAX:
        raise ValueError(
            f"expected a finite float32 value (at most {FLOAT32_MAX:.7g} in magnitude), "
            f"got {value!r}"
        )
    if value != 0 and abs(value) < FLOAT32_SMALLEST:
        raise ValueError(f"{value!r} is 0 in float32 (smallest: {FLOAT32_SMALLEST:.2g})")
    return value


TrainingFloat = Annotated[float, AfterValidator(_finite_in_float32)]


class AugmentationConfig(StrictModel):
    flip: bool = False
    crop_padding: int = Field(default=0, ge=0)
    brightness: float = Field(default=0.0, ge=0.0, le=1.0)


class DataConfig(StrictModel):
    dataset: str = Field(description="dataset directory (manifest.json + shards)")
    train_split: str = "train"
    eval_split: str | None = "validation"
    test_split: str | None = "test"
    batch_size: int = Field(default=32, ge=1, description="global batch size of one update")
    shuffle_buffer: int = Field(default=10_000, ge=1)
    sequence_length: int | None = Field(default=None, ge=1)
    cache: bool = False
    augment: AugmentationConfig | None = None
    token_dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    features: list[str] | None = Field(default=None, description="model inputs; default all")
    labels: list[str] | None = Field(default=None, description="model outputs; default all")


class OptimizerConfig(StrictModel):
    type: Literal["adamw", "sgd"] = Field(
        default="adamw",
        description="sgd (with momentum) for linear models over sparse features: Adam's "
        "per-weight steps give rare features' weights as much room as common ones'",
    )
    learning_rate: TrainingFloat = Field(default=1e-3, gt=0)
    weight_decay: TrainingFloat = Field(default=1e-4, ge=0)
    beta_1: float = Field(default=0.9, gt=0, lt=1, description="adamw only")
    beta_2: float = Field(default=0.999, gt=0, lt=1, description="adamw only")
    epsilon: TrainingFloat = Field(default=1e-7, gt=0, description="adamw only")
    momentum: float = Field(default=0.9, ge=0, lt=1, description="sgd only")
    nesterov: bool = Field(default=False, description="sgd only")
    clip_global_norm: TrainingFloat | None = Field(default=1.0, gt=0)


class ScheduleConfig(StrictModel):
    warmup_steps: int = Field(default=0, ge=0)
    decay: Literal["cosine", "linear", "constant"] = "cosine"
    final_learning_rate_ratio: float = Field(default=0.0, ge=0, le=1)


class NonFiniteConfig(StrictModel):
    max_consecutive: int = Field(default=3, ge=1, description="skipped updates before a restore")
    learning_rate_factor: float = Field(default=0.5, gt=0, le=1)
    max_restores: int = Field(default=3, ge=0)


class TrainingConfig(StrictModel):
    epochs: int | None = Field(default=None, ge=1)
    steps: int | None = Field(default=None, ge=1, description="total optimizer updates")
    steps_per_execution: int = Field(default=1, ge=1, description="updates per tf.function call")
    gradient_accumulation: int = Field(default=1, ge=1, description="micro-batches per update")
    precision: Precision = "auto"
    deterministic: bool = False
    jit_compile: bool | Literal["auto"] = Field(
        default="auto",
        description="XLA-compile each replica's forward and backward pass; auto falls back "
        "to plain TensorFlow when the model holds ops XLA cannot compile",
    )
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    nonfinite: NonFiniteConfig = Field(default_factory=NonFiniteConfig)
    eval_every_steps: int | None = Field(default=None, ge=1)
    loss_weights: dict[str, TrainingFloat] = Field(
        default_factory=dict, description="per-head loss weight (multi-task); default 1"
    )

    @model_validator(mode="after")
    def _length_given(self) -> TrainingConfig:
        if (self.epochs is None) == (self.steps is None):
            raise ValueError("give exactly one of epochs or steps")
        return self


class CheckpointConfig(StrictModel):
    directory: str | None = Field(default=None, description="default: <run_dir>/checkpoints")
    every_steps: int | None = Field(default=100, ge=1)
    every_seconds: float | None = Field(default=None, gt=0)
    keep: int = Field(default=3, ge=1)
    keep_every_hours: float | None = Field(default=None, gt=0)


class ExportConfig(StrictModel):
    model_root: str = "models"
    model_name: str | None = Field(default=None, description="default: the experiment name")


class MeshShape(StrictModel):
    """A device mesh: ``batch`` data-parallel groups of ``model`` devices that shard weights."""

    batch: int = Field(default=1, ge=1, description="data-parallel size (the batch is split)")
    model: int = Field(default=1, ge=1, description="tensor-parallel size (weights are split)")

    @property
    def devices(self) -> int:
        return self.batch * self.model


class PipelineConfig(StrictModel):
    """Consecutive Transformer blocks on consecutive devices; micro-batches are the
    ``training.gradient_accumulation`` micro-batches."""

    stages: int = Field(ge=2, description="devices the blocks are split over")


class DistributionConfig(StrictModel):
    """How training spreads over devices beyond data parallelism (``distribution``).

    Without either the trainer replicates the model on every device it finds; with
    ``mesh`` it shards the zoo Transformer's and GPT's weights over the mesh's ``model``
    axis (DTensor) and splits each batch over its ``batch`` axis; with ``pipeline`` it
    places the blocks in stages on consecutive devices.
    """

    mesh: MeshShape | None = None
    pipeline: PipelineConfig | None = None

    @model_validator(mode="after")
    def _one_way(self) -> DistributionConfig:
        if self.mesh is not None and self.pipeline is not None:
            raise ValueError("give mesh or pipeline, not both")
        return self


class ExperimentConfig(StrictModel):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    seed: int = 0
    run_dir: str | None = Field(default=None, description="default: runs/<name>")
    data: DataConfig
    model: ModelConfig | None = Field(
        default=None, description="the zoo or Python model; a script may pass model_fn instead"
    )
    heads: dict[str, HeadSpec] | None = Field(
        default=None, description="override heads derived from the dataset's labels"
    )
    training: TrainingConfig
    distribution: DistributionConfig = Field(default_factory=DistributionConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    export: ExportConfig = Field(default_factory=ExportConfig)
    base_dir: str = Field(default=".", exclude=True)
    source: str = Field(default="experiment", exclude=True, description="named in errors")

    def resolve(self, path: str) -> Path:
        candidate = Path(path).expanduser()
        return candidate if candidate.is_absolute() else Path(self.base_dir) / candidate

    @property
    def run_path(self) -> Path:
        return self.resolve(self.run_dir or f"runs/{self.name}")

    @property
    def checkpoint_path(self) -> Path:
        if self.checkpoint.directory:
            return self.resolve(self.checkpoint.directory)
        return self.run_path / "checkpoints"

    def config_hash(self) -> str:
        """What a run's checkpoints were trained by: everything but ``distribution``, which
        says where the same updates run (a run may resume on another mesh)."""
        settings = self.model_dump(mode="json", exclude={"distribution"})
        canonical = json.dumps(settings, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def load_experiment(path: str | Path) -> ExperimentConfig:
    """Read an experiment YAML; a ConfigError names the file, line and key.

    Only pydantic and YAML are involved, so a broken file is reported before TensorFlow
    would have finished loading.
    """
    path = Path(path)
    config = load_yaml_model(path, ExperimentConfig)
    return config.model_copy(update={"base_dir": str(path.resolve().parent), "source": str(path)})
