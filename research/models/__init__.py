"""The model zoo and researchers' own models: Keras 2 (tf_keras) models from typed configs.

This package imports no TensorFlow: it holds the configs (``ModelConfig`` and one class
per family, ``InputSpec``, ``HeadSpec``), so an experiment file is checked before
TensorFlow loads. The Keras side is imported from its own modules:

- ``research.models.registry.build_model(config, inputs, heads)``: a model whose inputs
  are named after dataset features and whose outputs are named after labels;
- ``research.models.interface.conform_model(model, inputs, heads, source=...)``: fits any
  tf_keras model to those names, or says what does not fit;
- ``research.models.endpoints.compile_args(heads)``: the matching losses, loss weights
  and metrics;
- ``research.models.layers`` and ``research.models.losses``: the custom layers and losses
  (importing them registers them for deserialisation); ``research.models.gpt``: decoding.
"""

from research.models.configs import (
    AnyModelConfig,
    CnnConfig,
    GptConfig,
    MlpConfig,
    ModelConfig,
    MultiTaskConfig,
    PythonModelConfig,
    TransformerConfig,
)
from research.models.specs import (
    HeadSpec,
    InputSpec,
    head_spec_from_feature,
    input_spec_from_feature,
)

__all__ = [
    "AnyModelConfig",
    "CnnConfig",
    "GptConfig",
    "HeadSpec",
    "InputSpec",
    "MlpConfig",
    "ModelConfig",
    "MultiTaskConfig",
    "PythonModelConfig",
    "TransformerConfig",
    "head_spec_from_feature",
    "input_spec_from_feature",
]
