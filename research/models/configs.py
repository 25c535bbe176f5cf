"""The ``model`` section of an experiment: one config class per family, picked by ``type``.

Configs are plain pydantic objects with no TensorFlow import, so an experiment file is
validated (and a typo reported with its file, line and key) in a fraction of a second,
before the seconds it takes to load TensorFlow. The Keras builders that read these
configs live in the family modules (``mlp``, ``cnn``, ...).
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, PositiveInt, RootModel, field_validator, model_validator

from contracts.yaml_config import StrictModel
from research.models.config_types import Activation, Dropout, tagged_union
from research.models.specs import InputSpec


class MlpConfig(StrictModel):
    """Hidden layer widths, their activation, dropout and optional batch norm."""

    type: Literal["mlp"] = "mlp"
    hidden_units: list[PositiveInt] = [64, 32]
    activation: Activation = "relu"
    dropout: Dropout = 0.0
    batch_norm: bool = False
    embedding_dim: PositiveInt = 8
    batch_norm_momentum: float = Field(default=0.9, gt=0.0, lt=1.0)


class CnnConfig(StrictModel):
    """Widths of the stem and of each stage, blocks per stage, kernel size, dropout."""

    type: Literal["cnn"] = "cnn"
    stem_filters: PositiveInt = 16
    stages: list[PositiveInt] = [16, 32]
    blocks_per_stage: PositiveInt = 1
    kernel_size: PositiveInt = 3
    dropout: Dropout = 0.0
    # Keras' 0.99 needs ~500 updates before inference statistics settle; small datasets
    # train for fewer, so the default favours quick convergence of the moving averages.
    batch_norm_momentum: float = Field(default=0.9, gt=0.0, lt=1.0)


class ExpertsConfig(StrictModel):
    """A mixture-of-experts feed-forward network in every block (``research.models.moe``)."""

    num_experts: int = Field(ge=2)
    top_k: int = Field(default=1, ge=1)
    capacity_factor: float = Field(default=1.25, gt=0)
    aux_loss_weight: float = Field(default=0.01, ge=0)

    @model_validator(mode="after")
    def _top_k_within_experts(self) -> ExpertsConfig:
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k: {self.top_k} exceeds num_experts={self.num_experts}")
        return self


class TransformerShape(StrictModel):
    """Size and layout of a stack of transformer blocks.

    ``norm: pre`` puts LayerNormalization before attention and feed-forward (stable
    without warm-up, plus a final norm); ``post`` is the original Transformer layout.
    ``max_length`` sizes the position table; by default the input's sequence length.
    ``recompute`` keeps only each block's input for the backward pass and runs the block
    again there (``research.models.recompute``): less activation memory, more compute.
    ``experts`` makes every block's feed-forward network a mixture of ``ff_dim``-wide
    experts (``research.models.moe``).
    """

    num_layers: PositiveInt = 2
    d_model: PositiveInt = 32
    num_heads: PositiveInt = 2
    ff_dim: PositiveInt = 64
    dropout: Dropout = 0.1
    norm: Literal["pre", "post"] = "pre"
    max_length: PositiveInt | None = None
    recompute: bool = False
    experts: ExpertsConfig | None = None

    @model_validator(mode="after")
    def _heads_divide_width(self) -> TransformerShape:
        if self.d_model % self.num_heads:
            raise ValueError(
                f"d_model: {self.d_model} is not divisible by num_heads={self.num_heads}"
            )
        return self

    def position_table_size(self, name: str, spec: InputSpec) -> int:
        """Rows of the position table: ``max_length``, else the input's fixed length."""
        length = spec.shape[0]
        size = self.max_length or length
        if size is None:
            raise ValueError(
                f"max_length: input {name!r} has no fixed length, so the position table "
                "needs one: set max_length (or give the input a fixed length, as an "
                "experiment's data.sequence_length does)"
            )
        if length is not None and length > size:
            raise ValueError(f"max_length: input {name!r} has length {length} > {size}")
        return size


class TransformerConfig(TransformerShape):
    """Encoder size plus how the sequence is pooled (``mean`` or ``cls``)."""

    type: Literal["transformer"] = "transformer"
    pooling: Literal["mean", "cls"] = "mean"


class GptConfig(TransformerShape):
    """Decoder size; ``max_length`` is the context window when the input length is open."""

    type: Literal["gpt"] = "gpt"


TrunkConfig = tagged_union(MlpConfig, CnnConfig, TransformerConfig)


class MultiTaskConfig(StrictModel):
    """The shared trunk and the hidden tower every head gets on top of it."""

    type: Literal["multitask"] = "multitask"
    trunk: TrunkConfig = MlpConfig()
    head_hidden_units: list[PositiveInt] = [32]
    head_activation: Activation = "relu"
    head_dropout: Dropout = 0.0


# A dotted Python name: ``package.module`` or ``function`` / ``Class.method``.
_DOTTED_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


class PythonModelConfig(StrictModel):
    """A model written in Python: ``build`` names the function that makes it.

    ``build`` is ``package.module:function`` (imported from ``sys.path``, else from the
    experiment file's directory) or ``path/to/file.py:function`` (relative to the
    experiment file). The function is called as ``function(inputs, heads, **args)`` with
    the dataset's ``InputSpec`` and ``HeadSpec`` mappings and returns a tf_keras model,
    which ``research.models.interface.conform_model`` then fits to the dataset's names.
    The string is kept as written, so the config hash does not depend on where the
    experiment lives.
    """

    type: Literal["python"] = "python"
    build: str
    args: dict[str, Any] = Field(default_factory=dict)

    @field_validator("build")
    @classmethod
    def _check_reference(cls, build: str) -> str:
        target, _, function = build.rpartition(":")
        valid_target = target.endswith(".py") or _DOTTED_NAME.fullmatch(target)
        if not (target and valid_target and _DOTTED_NAME.fullmatch(function)):
            raise ValueError(
                "expected 'package.module:function' or 'path/to/file.py:function'. "
                f"Received: build={build!r}"
            )
        return build

    @property
    def target(self) -> str:
        """The module (``package.module``) or file (``path/to/file.py``) to load."""
        return self.build.rpartition(":")[0]

    @property
    def function(self) -> str:
        """The attribute of the module that builds the model (dots reach nested ones)."""
        return self.build.rpartition(":")[2]


AnyModelConfig = (
    MlpConfig | CnnConfig | TransformerConfig | GptConfig | MultiTaskConfig | PythonModelConfig
)


class ModelConfig(
    RootModel[
        tagged_union(
            MlpConfig,
            CnnConfig,
            TransformerConfig,
            GptConfig,
            MultiTaskConfig,
            PythonModelConfig,
        )
    ]
):
    """A model section of an experiment file: ``{type: cnn, stages: [16, 32], ...}``.

    Use it as a field type (``model: ModelConfig``) or validate a mapping with
    ``contracts.yaml_config.parse_model(data, ModelConfig)``; the family config is ``.root``.
    """


def without_recompute(config: ModelConfig) -> ModelConfig:
    """``config`` with recomputation off in every block stack (a multi-task trunk's too).

    Recomputation changes how gradients are taken, not what the model computes, so the
    published model is this plain architecture with the trained weights.
    """

    def plain(node: Any) -> Any:
        if isinstance(node, dict):
            return {
                key: False if key == "recompute" else plain(value) for key, value in node.items()
            }
        if isinstance(node, list):
            return [plain(item) for item in node]
        return node

    return ModelConfig.model_validate(plain(config.model_dump()))
