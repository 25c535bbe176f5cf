"""A small ResNet for small images (8x8 digits, 28x28 or 32x32 pictures).

A stem convolution, then stages of residual blocks (conv-BN-ReLU twice, added to the
block input); every stage after the first halves the resolution in its first block.
Where the block changes shape, a 1x1 convolution projects the shortcut to match.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import tf_keras as keras

from research.models.configs import CnnConfig
from research.models.endpoints import Tensors, only_input
from research.models.specs import InputSpec


def features(config: CnnConfig, tensors: Tensors, specs: Mapping[str, InputSpec]) -> Any:
    """Globally average-pooled feature maps of the last stage."""
    name = only_input(specs, ("image",), "cnn")
    spec = specs[name]
    x = tensors[name]
    if len(spec.shape) == 2:
        x = keras.layers.Reshape((*spec.shape, 1), name=f"{name}_channels")(x)
    momentum = config.batch_norm_momentum
    x = _conv_bn(x, config.stem_filters, config.kernel_size, 1, "stem", momentum)
    x = keras.layers.ReLU(name="stem_relu")(x)
    for stage, filters in enumerate(config.stages):
        for block in range(config.blocks_per_stage):
            stride = 2 if stage > 0 and block == 0 else 1
            x = _residual_block(
                x, filters, config.kernel_size, stride, f"stage{stage}_block{block}", momentum
            )
    x = keras.layers.GlobalAveragePooling2D(name="cnn_pool")(x)
    if config.dropout:
        x = keras.layers.Dropout(config.dropout, name="cnn_dropout")(x)
    return x


def _conv_bn(x: Any, filters: int, kernel: int, stride: int, name: str, momentum: float) -> Any:
    # No conv bias: the batch norm that follows has its own shift.
    x = keras.layers.Conv2D(
        filters, kernel, strides=stride, padding="same", use_bias=False, name=f"{name}_conv"
    )(x)
    return keras.layers.BatchNormalization(momentum=momentum, name=f"{name}_bn")(x)


def _residual_block(
    x: Any, filters: int, kernel: int, stride: int, name: str, momentum: float
) -> Any:
    shortcut = x
    if stride != 1 or x.shape[-1] != filters:
        shortcut = _conv_bn(x, filters, 1, stride, f"{name}_projection", momentum)
    y = _conv_bn(x, filters, kernel, stride, f"{name}_1", momentum)
    y = keras.layers.ReLU(name=f"{name}_1_relu")(y)
    y = _conv_bn(y, filters, kernel, 1, f"{name}_2", momentum)
    x = keras.layers.Add(name=f"{name}_add")([shortcut, y])
    return keras.layers.ReLU(name=f"{name}_relu")(x)
