"""Recomputed blocks take the plain model's gradients, draw its dropout masks, and keep
less in memory; the published artifact is the plain architecture."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from contracts.yaml_config import parse_model
from research.models import HeadSpec, ModelConfig
from research.models.configs import without_recompute
from research.models.recompute import Recomputed, has_recomputation
from research.models.registry import build_model
from research.models.weights import copy_weights
from tests.support.keras_checks import assert_config_round_trip

VOCAB = 40
LENGTH = 24
HEADS = {"next_token": HeadSpec(kind="language_model")}
GPT = {"type": "gpt", "num_layers": 3, "d_model": 16, "num_heads": 2, "ff_dim": 32}
INPUTS = {"tokens": {"kind": "tokens", "shape": [LENGTH], "vocab_size": VOCAB}}


@pytest.fixture(autouse=True)
def _generator_dropout() -> None:
    """Dropout draws from tf.random.Generator states, as the trainer sets it up."""
    keras.backend.experimental.enable_tf_random_generator()


def _gpt(recompute: bool, **overrides: object) -> keras.Model:
    keras.utils.set_random_seed(3)
    config = parse_model({**GPT, "recompute": recompute, **overrides}, ModelConfig)
    return build_model(config, INPUTS, HEADS)


def _ids(batch: int = 4) -> tf.Tensor:
    rng = np.random.default_rng(0)
    return tf.constant(rng.integers(1, VOCAB, size=(batch, LENGTH)), tf.int64)


def _step(model: keras.Model, jit_compile: bool):
    """A compiled forward and backward pass, as the trainer's replica runs it."""

    @tf.function(jit_compile=jit_compile)
    def step(ids: tf.Tensor) -> tuple[tf.Tensor, list[tf.Tensor]]:
        with tf.GradientTape() as tape:
            logits = model({"tokens": ids}, training=True)["next_token"]
            loss = tf.reduce_mean(
                keras.losses.sparse_categorical_crossentropy(ids, logits, from_logits=True)
            )
        gradients = tape.gradient(loss, model.trainable_variables)
        return loss, [tf.convert_to_tensor(gradient) for gradient in gradients]

    return step


def _generator_states(model: keras.Model) -> list[np.ndarray]:
    states = []
    for layer in model._flatten_layers():
        generator = getattr(getattr(layer, "_random_generator", None), "_generator", None)
        if isinstance(generator, tf.random.Generator):
            states.append(generator.state.numpy())
    return states


@pytest.mark.parametrize(
    "jit_compile",
    [pytest.param(True, id="xla", marks=pytest.mark.slow), pytest.param(False, id="graph")],
)
def test_recomputed_blocks_take_the_plain_gradients_with_the_same_dropout_masks(
    jit_compile: bool,
) -> None:
    plain, recomputed = _gpt(False, dropout=0.2), _gpt(True, dropout=0.2)
    assert has_recomputation(recomputed) and not has_recomputation(plain)
    copy_weights(plain, recomputed)
    plain_step, recomputed_step = _step(plain, jit_compile), _step(recomputed, jit_compile)
    for _ in range(2):  # the second step draws from where the first left the generators
        plain_loss, plain_gradients = plain_step(_ids())
        loss, gradients = recomputed_step(_ids())
        # Different dropout masks would change the loss itself, not only the gradients.
        np.testing.assert_allclose(loss.numpy(), plain_loss.numpy(), rtol=1e-6)
        for got, want in zip(gradients, plain_gradients, strict=True):
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6, atol=1e-6)
    plain_states, states = _generator_states(plain), _generator_states(recomputed)
    assert len(states) == len(plain_states) > 0
    for got, want in zip(states, plain_states, strict=True):
        np.testing.assert_array_equal(got, want)


def test_the_backward_pass_runs_each_block_again() -> None:
    """A recomputed block's forward runs twice per step (forward, then in backward)."""
    model = _gpt(True, num_layers=1)
    (wrapper,) = [layer for layer in model._flatten_layers() if isinstance(layer, Recomputed)]
    calls = []
    block = wrapper.layer
    original = block.call

    def counting_call(*args, **kwargs):
        calls.append(kwargs.get("training"))
        return original(*args, **kwargs)

    block.call = counting_call
    ids = _ids()
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(model({"tokens": ids}, training=True)["next_token"])
    tape.gradient(loss, model.trainable_variables)
    assert calls == [True, True]


def test_outside_training_the_wrapper_is_the_block() -> None:
    plain, recomputed = _gpt(False), _gpt(True)
    copy_weights(plain, recomputed)
    ids = _ids()
    np.testing.assert_allclose(
        recomputed({"tokens": ids})["next_token"].numpy(),
        plain({"tokens": ids})["next_token"].numpy(),
        rtol=1e-5,
        atol=1e-6,
    )
    assert_config_round_trip(recomputed, {"tokens": _ids().numpy()})


def test_the_plain_config_turns_recomputation_off_everywhere() -> None:
    config = parse_model(
        {"type": "multitask", "trunk": {"type": "transformer", "recompute": True}}, ModelConfig
    )
    assert without_recompute(config).root.trunk.recompute is False
    gpt = parse_model({**GPT, "recompute": True}, ModelConfig)
    assert without_recompute(gpt).root.recompute is False
    assert without_recompute(gpt).root.num_layers == GPT["num_layers"]


def test_weights_are_copied_only_when_every_name_matches() -> None:
    with pytest.raises(ValueError, match="weights differ"):
        copy_weights(_gpt(True), _gpt(False, num_layers=2))
