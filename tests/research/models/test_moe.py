"""Mixture of experts: tokens reach the experts the router picks, within capacity, and
the load-balancing loss spreads a collapsed router over every expert."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from contracts.yaml_config import ConfigError, parse_model
from research.models import HeadSpec, ModelConfig
from research.models.moe import MixtureOfExperts
from research.models.registry import build_model
from tests.support.keras_checks import assert_config_round_trip

WIDTH, LENGTH, VOCAB = 8, 10, 30


def _layer(**options: object) -> MixtureOfExperts:
    keras.utils.set_random_seed(0)
    layer = MixtureOfExperts(4, 16, **options)
    layer.build((None, LENGTH, WIDTH))
    return layer


def _tokens(batch: int = 3) -> tf.Tensor:
    return tf.constant(np.random.default_rng(1).normal(size=(batch, LENGTH, WIDTH)), tf.float32)


def _expert(layer: MixtureOfExperts, expert: int, token: np.ndarray) -> np.ndarray:
    hidden = token @ layer.experts_in_kernel[expert].numpy() + layer.experts_in_bias[expert].numpy()
    hidden = layer.activation(tf.constant(hidden)).numpy()
    return (
        hidden @ layer.experts_out_kernel[expert].numpy() + layer.experts_out_bias[expert].numpy()
    )


def test_each_token_is_the_router_weighted_sum_of_its_top_k_experts() -> None:
    layer = _layer(top_k=2, capacity_factor=10.0)  # room for every token
    tokens = _tokens()
    combine, _ = layer.route(tokens)
    probabilities = tf.nn.softmax(
        tf.einsum("bld,de->ble", tokens, layer.router_kernel) + layer.router_bias
    ).numpy()
    output = layer(tokens).numpy()
    for b in range(3):
        for t in range(LENGTH):
            chosen = np.argsort(-probabilities[b, t])[:2]
            # Each chosen expert holds the token in exactly one slot, none other does.
            slots = (combine.numpy()[b, t] > 0).sum(axis=-1)
            assert sorted(np.flatnonzero(slots)) == sorted(chosen)
            assert slots[chosen].tolist() == [1, 1]
            token = tokens.numpy()[b, t]
            want = sum(probabilities[b, t, e] * _expert(layer, e, token) for e in chosen)
            np.testing.assert_allclose(output[b, t], want, rtol=1e-4, atol=1e-5)


def test_a_crowded_expert_takes_tokens_in_order_up_to_its_capacity() -> None:
    layer = _layer(top_k=1, capacity_factor=1.0)
    layer.router_bias.assign([10.0, 0.0, 0.0, 0.0])  # every token's first choice: expert 0
    combine, _ = layer.route(_tokens())
    capacity = layer.capacity(LENGTH)
    assert capacity == 3  # ceil(1.0 * 10 tokens * 1 / 4 experts)
    held = combine.numpy()[:, :, 0, :] > 0  # (batch, length, slot) of expert 0
    for sequence in held:
        # The first `capacity` tokens fill the slots in order; the rest are dropped.
        np.testing.assert_array_equal(np.argmax(sequence[:capacity], axis=-1), range(capacity))
        assert not sequence[capacity:].any()
    assert not (combine.numpy()[:, :, 1:, :] > 0).any()


def test_the_balance_loss_is_one_when_even_and_grows_when_collapsed() -> None:
    layer = _layer()
    layer.router_kernel.assign(tf.zeros_like(layer.router_kernel))
    _, even = layer.route(_tokens())
    layer.router_bias.assign([8.0, 0.0, 0.0, 0.0])
    _, collapsed = layer.route(_tokens())
    assert float(even) == pytest.approx(1.0, abs=0.3)
    assert float(collapsed) > 3.5  # the most it can be is num_experts = 4


def test_training_spreads_a_collapsed_router_over_every_expert() -> None:
    # Initial weights as the trainer draws them, whatever ran before in this process.
    keras.backend.experimental.enable_tf_random_generator()
    keras.utils.set_random_seed(0)
    config = {"type": "gpt", "num_layers": 1, "d_model": 16, "num_heads": 2, "ff_dim": 32}
    config |= {"dropout": 0.0, "experts": {"num_experts": 4, "aux_loss_weight": 0.1}}
    inputs = {"tokens": {"kind": "tokens", "shape": [LENGTH], "vocab_size": VOCAB}}
    model = build_model(config, inputs, {"next_token": HeadSpec(kind="language_model")})
    layer = model.get_layer("decoder_block0_experts")
    layer.router_bias.assign([8.0, 0.0, 0.0, 0.0])  # a router that sends every token to one
    ids = tf.constant(np.random.default_rng(2).integers(1, VOCAB, size=(16, LENGTH + 1)))
    optimizer = keras.optimizers.Adam(0.01)
    layer_input = keras.Model(model.inputs, layer.input)

    @tf.function
    def step() -> tf.Tensor:
        with tf.GradientTape() as tape:
            logits = model({"tokens": ids[:, :-1]}, training=True)["next_token"]
            loss = tf.reduce_mean(
                keras.losses.sparse_categorical_crossentropy(ids[:, 1:], logits, from_logits=True)
            )
            loss += tf.add_n(model.losses)
        variables = model.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables, strict=True))
        return model.losses[0] / 0.1

    def tokens_per_expert() -> np.ndarray:
        combine, _ = layer.route(layer_input({"tokens": ids[:, :-1]}))
        return (combine.numpy().sum(axis=-1) > 0).sum(axis=(0, 1))

    assert (tokens_per_expert()[1:] == 0).all()  # collapsed: the others get nothing
    balance = [float(step()) for _ in range(150)]
    assert np.mean(balance[:10]) > 3.0  # near the most it can be, num_experts = 4
    assert np.mean(balance[-10:]) < 1.2  # near even, 1
    assert (tokens_per_expert() > 0).all()


def test_experts_serialize_and_top_k_is_checked() -> None:
    keras.utils.set_random_seed(0)
    config = {"type": "gpt", "num_layers": 1, "d_model": 8, "num_heads": 2, "ff_dim": 16}
    config |= {"experts": {"num_experts": 3, "top_k": 2}}
    inputs = {"tokens": {"kind": "tokens", "shape": [LENGTH], "vocab_size": VOCAB}}
    model = build_model(config, inputs, {"next_token": HeadSpec(kind="language_model")})
    ids = np.random.default_rng(0).integers(1, VOCAB, size=(2, LENGTH))
    assert_config_round_trip(model, {"tokens": ids})
    with pytest.raises(ConfigError, match="top_k: 4 exceeds num_experts=3"):
        parse_model({**config, "experts": {"num_experts": 3, "top_k": 4}}, ModelConfig)
