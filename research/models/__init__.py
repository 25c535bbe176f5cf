"""The model zoo: Keras 2 (tf_keras) models built from typed configs.

``build_model(config, inputs, heads)`` makes a functional model whose inputs are named
after dataset features and whose outputs are named after labels; ``compile_args(heads)``
gives the matching losses, loss weights and metrics.
"""

from research.models.cnn import CnnConfig
from research.models.endpoints import compile_args
from research.models.gpt import GptConfig, generate, next_token_pairs
from research.models.layers import (
    AttentionMask,
    PrependClsToken,
    SequencePooling,
    TokenAndPositionEmbedding,
)
from research.models.losses import PaddedSequenceCrossentropy
from research.models.mlp import MlpConfig
from research.models.multitask import MultiTaskConfig
from research.models.registry import AnyModelConfig, ModelConfig, build_model
from research.models.specs import (
    HeadSpec,
    InputSpec,
    head_spec_from_feature,
    input_spec_from_feature,
)
from research.models.transformer import TransformerConfig

__all__ = [
    "AnyModelConfig",
    "AttentionMask",
    "CnnConfig",
    "GptConfig",
    "HeadSpec",
    "InputSpec",
    "MlpConfig",
    "ModelConfig",
    "MultiTaskConfig",
    "PaddedSequenceCrossentropy",
    "PrependClsToken",
    "SequencePooling",
    "TokenAndPositionEmbedding",
    "TransformerConfig",
    "build_model",
    "compile_args",
    "generate",
    "head_spec_from_feature",
    "input_spec_from_feature",
    "next_token_pairs",
]
