from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from research.models.layers import (
    AttentionMask,
    PrependClsToken,
    SequencePooling,
    TokenAndPositionEmbedding,
)
from research.models.registry import build_model

IDS = tf.constant([[5, 3, 0], [7, 0, 0]])


def test_padding_mask_hides_padding_keys() -> None:
    mask = AttentionMask()(IDS).numpy()
    assert mask.shape == (2, 3, 3)
    assert mask[0].tolist() == [[True, True, False]] * 3
    assert mask[1].tolist() == [[True, False, False]] * 3


def test_causal_mask_also_hides_later_keys() -> None:
    mask = AttentionMask(causal=True)(tf.constant([[5, 3, 4]])).numpy()[0]
    assert mask.tolist() == [[True, False, False], [True, True, False], [True, True, True]]


def test_prefix_tokens_are_always_visible() -> None:
    mask = AttentionMask(prefix_tokens=1)(IDS).numpy()
    assert mask.shape == (2, 4, 4)
    assert mask[1, 0].tolist() == [True, True, False, False]


def test_mean_pooling_skips_padding() -> None:
    sequence = tf.constant(
        [[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]], [[6.0, 8.0], [9.0, 9.0], [9.0, 9.0]]]
    )
    pooled = SequencePooling("mean")(sequence, ids=IDS).numpy()
    np.testing.assert_allclose(pooled, [[2.0, 3.0], [6.0, 8.0]])
    empty = SequencePooling("mean")(sequence, ids=tf.zeros([2, 3], tf.int64)).numpy()
    np.testing.assert_array_equal(empty, np.zeros((2, 2)))
    np.testing.assert_array_equal(SequencePooling("cls")(sequence).numpy(), sequence[:, 0].numpy())
    with pytest.raises(ValueError, match="'mean' or 'cls'"):
        SequencePooling("max")


def test_cls_token_is_prepended_and_learned() -> None:
    layer = PrependClsToken()
    out = layer(tf.ones([2, 3, 4]))
    assert out.shape == (2, 4, 4)
    np.testing.assert_array_equal(out[0, 0].numpy(), layer.cls.numpy())
    np.testing.assert_array_equal(out[:, 1:].numpy(), np.ones((2, 3, 4)))
    assert layer.trainable_weights == [layer.cls]


def test_position_embedding_refuses_sequences_past_its_table() -> None:
    layer = TokenAndPositionEmbedding(vocab_size=10, max_length=4, embed_dim=3)
    assert layer(tf.constant([[1, 2, 3, 4]])).shape == (1, 4, 3)
    with pytest.raises(tf.errors.InvalidArgumentError, match="longer than max_length=4"):
        layer(tf.constant([[1, 2, 3, 4, 5]]))


@pytest.mark.parametrize(
    "layer",
    [
        TokenAndPositionEmbedding(vocab_size=10, max_length=4, embed_dim=3, name="embed"),
        PrependClsToken(name="cls"),
        AttentionMask(causal=True, prefix_tokens=1, name="mask"),
        SequencePooling("cls", name="pool"),
    ],
)
def test_layers_serialise_without_custom_objects(layer: keras.layers.Layer) -> None:
    serialised = keras.layers.serialize(layer)
    assert serialised["registered_name"] == f"slipway>{type(layer).__name__}"
    restored = keras.layers.deserialize(serialised)
    assert type(restored) is type(layer)
    assert restored.get_config() == layer.get_config()


@pytest.mark.parametrize(
    ("config", "inputs", "heads", "features"),
    [
        (
            {"type": "multitask", "trunk": {"type": "transformer", "num_layers": 1, "d_model": 8}},
            {"text": {"kind": "tokens", "shape": [6], "vocab_size": 9}},
            {
                "label": {"kind": "classification", "num_classes": 2},
                "score": {"kind": "regression"},
            },
            {"text": np.array([[1, 2, 3, 0, 0, 0]])},
        ),
        (
            {"type": "cnn", "stem_filters": 4, "stages": [4]},
            {"image": {"kind": "image", "shape": [8, 8, 1]}},
            {"digit": {"kind": "classification", "num_classes": 10}},
            {"image": np.zeros((1, 8, 8, 1), np.float32)},
        ),
        (
            {"type": "gpt", "num_layers": 1, "d_model": 8, "max_length": 8},
            {"tokens": {"kind": "tokens", "shape": [None], "vocab_size": 9}},
            {"next_token": {"kind": "language_model"}},
            {"tokens": np.array([[1, 2, 3]])},
        ),
    ],
)
def test_outputs_stay_float32_under_mixed_precision(config, inputs, heads, features) -> None:
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = build_model(config, inputs, heads)
        assert model.get_layer(next(iter(heads))).compute_dtype == "float32"
        outputs = model(features)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert {name: value.dtype for name, value in outputs.items()} == dict.fromkeys(
        heads, tf.float32
    )
    assert all(np.isfinite(value.numpy()).all() for value in outputs.values())
