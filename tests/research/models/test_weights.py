"""Weights of two builds of one architecture are paired, by name or else in order."""

from __future__ import annotations

import numpy as np
import pytest
import tf_keras as keras

from research.models.weights import copy_weights, matching_weights


def _unnamed(width: int = 4) -> keras.Model:
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(width), keras.layers.Dense(2)])


def test_layers_keras_named_itself_pair_in_order() -> None:
    first, second = _unnamed(), _unnamed()
    assert [w.name for w in first.weights] != [w.name for w in second.weights]
    pairs = matching_weights(first, second)
    assert [(a.shape, b.shape) for a, b in pairs] == [(a.shape, a.shape) for a in first.weights]
    copy_weights(first, second)
    for mine, theirs in zip(first.get_weights(), second.get_weights(), strict=True):
        np.testing.assert_array_equal(mine, theirs)


def test_other_architectures_are_refused() -> None:
    with pytest.raises(ValueError, match="weights differ"):
        matching_weights(_unnamed(4), _unnamed(5))
