"""Pipeline stages: consecutive Transformer blocks placed on consecutive devices.

Inside ``pipeline_stages(devices)`` the zoo's block stacks split their blocks into
``len(devices)`` contiguous stages, and build and run each block on its stage's device
(``OnDevice``): its variables live there and its ops run there, so a model S times one
device's memory fits on S devices. Fed micro-batches (the trainer's gradient
accumulation) in one compiled update, TensorFlow's executor runs a later stage on one
micro-batch while an earlier stage works on the next, as GPipe schedules them; the
update is the one the whole batch makes on one device.

The scope is read while a model is built, as Keras's ``LayoutMap.scope()`` is: the same
config builds the plain model outside it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import tensorflow as tf
import tf_keras as keras

_stages: list[tuple[str, ...]] = []


@contextlib.contextmanager
def pipeline_stages(devices: Sequence[str]) -> Iterator[None]:
    """Models built inside place their blocks over ``devices``, one stage each."""
    _stages.append(tuple(devices))
    try:
        yield
    finally:
        _stages.pop()


def stage_device(block: int, blocks: int) -> str | None:
    """The device block ``block`` of ``blocks`` is placed on, None outside a scope."""
    if not _stages:
        return None
    devices = _stages[-1]
    return devices[block * len(devices) // blocks]


@keras.saving.register_keras_serializable(package="slipway")
class OnDevice(keras.layers.Wrapper):
    """``layer`` run on ``device`` (its variables are made there by building it in
    ``tf.device(device)``, which the caller does for a functional block)."""

    def __init__(self, layer: keras.layers.Layer, device: str, **kwargs: Any) -> None:
        super().__init__(layer, **kwargs)
        self.device = device

    def call(self, inputs: Any, training: bool | None = None) -> Any:
        with tf.device(self.device):
            return self.layer(inputs, training=training)

    def compute_output_shape(self, input_shape: Any) -> Any:
        return self.layer.compute_output_shape(input_shape)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "device": self.device}


def is_placed(model: keras.Model) -> bool:
    """Whether some block of ``model`` is placed on a pipeline stage."""
    return any(isinstance(layer, OnDevice) for layer in model._flatten_layers())
