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


def matching_weights(source: keras.Model, target: keras.Model) -> list[tuple[Any, Any]]:
    """``(source weight, target weight)`` pairs of two builds of one architecture.

    Matched by name when every name matches (a recomputed and a plain zoo model hold
    their weights at other paths under the same names); otherwise in order, shape by
    shape, as two calls of one build function create them (Keras numbers the layers it
    names itself anew in every build: ``dense``, then ``dense_1``).
    """
    names = {weight.name: weight for weight in source.weights}
    if len(names) == len(target.weights) and all(w.name in names for w in target.weights):
        return [(names[weight.name], weight) for weight in target.weights]
    pairs = list(zip(source.weights, target.weights, strict=False))
    if len(source.weights) != len(target.weights) or any(
        tuple(a.shape) != tuple(b.shape) for a, b in pairs
    ):
        missing = sorted(set(w.name for w in target.weights) - set(names))[:5]
        raise ValueError(
            f"the models' weights differ: {len(source.weights)} against "
            f"{len(target.weights)}, by name missing {missing}"
        )
    return pairs


def copy_weights(source: keras.Model, target: keras.Model) -> None:
    """Give ``target`` the weights of ``source`` (``matching_weights``), wherever they live."""
    target.set_weights([host_value(mine) for mine, _ in matching_weights(source, target)])
