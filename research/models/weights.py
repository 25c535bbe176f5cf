"""A model's weights as whole host arrays, wherever they live (one device or a mesh)."""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf
import tf_keras as keras
from tensorflow.experimental import dtensor


def stored(variable: Any) -> Any:
    """The variable that holds ``variable``'s value: under a mixed precision policy Keras
    hands out a wrapper that casts on read (``AutoCastVariable``), whose ``_variable``
    is the stored one; anything else is its own."""
    return getattr(variable, "_variable", variable)


def is_on_mesh(value: Any) -> bool:
    """Whether ``value`` (a tensor or variable) lives on a DTensor mesh."""
    value = stored(value)
    if isinstance(value, dtensor.DVariable):
        return True
    return isinstance(value, tf.Tensor) and dtensor.is_dtensor(value)


def host_value(value: Any) -> np.ndarray:
    """The whole value of a tensor or variable, on a mesh or not, as a NumPy array (a
    sharded value is gathered: no device holds it whole)."""
    value = stored(value)
    if not is_on_mesh(value):
        return np.asarray(value.numpy())
    tensor = value.read_value() if isinstance(value, tf.Variable) else value
    layout = dtensor.fetch_layout(tensor)
    whole = dtensor.relayout(tensor, dtensor.Layout.replicated(layout.mesh, rank=layout.rank))
    return dtensor.unpack(whole)[0].numpy()


def trained_on_mesh(model: keras.Model) -> bool:
    """Whether ``model``'s weights are DTensor variables (it was built on a mesh)."""
    return any(is_on_mesh(weight) for weight in model.weights)


def copy_weights_by_name(source: keras.Model, target: keras.Model) -> None:
    """Give ``target`` the weights of ``source``, matched by name, all of them or none."""
    values = {weight.name: weight for weight in source.weights}
    missing = [weight.name for weight in target.weights if weight.name not in values]
    if missing or len(values) != len(target.weights):
        extra = sorted(set(values) - {weight.name for weight in target.weights})
        raise ValueError(
            f"the models' weights differ: missing {missing[:5]}, unexpected {extra[:5]}"
        )
    target.set_weights([host_value(values[weight.name]) for weight in target.weights])
