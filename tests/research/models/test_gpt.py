from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from contracts.yaml_config import parse_model
from research.models import GptConfig, HeadSpec, ModelConfig
from research.models.gpt import generate, next_token_pairs
from research.models.losses import PaddedSequenceCrossentropy
from research.models.registry import build_model
from tests.support.keras_checks import (
    assert_config_round_trip,
    assert_saved_model_round_trip,
    train,
)

VOCAB = 16
HEADS = {"next_token": HeadSpec(kind="language_model")}
SMALL = {
    "type": "gpt",
    "num_layers": 2,
    "d_model": 16,
    "num_heads": 2,
    "ff_dim": 32,
    "dropout": 0.0,
}


def _model(length: int | None = None, **overrides: object) -> keras.Model:
    config = parse_model({**SMALL, "max_length": 12, **overrides}, ModelConfig)
    assert isinstance(config.root, GptConfig)
    inputs = {"tokens": {"kind": "tokens", "shape": [length], "vocab_size": VOCAB}}
    return build_model(config, inputs, HEADS)


def _logits(model: keras.Model, ids: list[list[int]]) -> np.ndarray:
    return model({"tokens": np.array(ids)})["next_token"].numpy()


def test_logits_cover_the_vocabulary_at_every_position() -> None:
    keras.utils.set_random_seed(0)
    model = _model()
    assert model.input_names == ["tokens"] and model.output_names == ["next_token"]
    assert _logits(model, [[1, 2, 3, 4, 5]] * 3).shape == (3, 5, VOCAB)


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_attention_is_causal(norm: str) -> None:
    keras.utils.set_random_seed(0)
    model = _model(norm=norm)
    original = _logits(model, [[3, 7, 1, 9, 4, 2]])
    changed = _logits(model, [[3, 7, 1, 12, 4, 2]])
    np.testing.assert_allclose(changed[:, :3], original[:, :3], rtol=1e-5, atol=1e-6)
    assert not np.allclose(changed[:, 3:], original[:, 3:])


def test_padding_tail_leaves_real_positions_alone() -> None:
    keras.utils.set_random_seed(0)
    model = _model()
    bare = _logits(model, [[3, 7, 1]])
    padded = _logits(model, [[3, 7, 1, 0, 0]])
    np.testing.assert_allclose(padded[:, :3], bare, rtol=1e-5, atol=1e-6)


def test_loss_ignores_padding_targets() -> None:
    loss = PaddedSequenceCrossentropy()
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 4, VOCAB)).astype(np.float32)
    targets = np.array([[5, 6, 0, 0], [7, 0, 0, 0]])
    noisy = logits.copy()
    noisy[targets == 0] += 5.0 * rng.normal(size=(5, VOCAB)).astype(np.float32)
    real = keras.losses.sparse_categorical_crossentropy(
        np.array([5, 6, 7]), np.stack([logits[0, 0], logits[0, 1], logits[1, 0]]), from_logits=True
    ).numpy()
    per_sequence_mean = (real[:2].mean() + real[2]) / 2  # each sequence counts once
    assert float(loss(targets, logits)) == pytest.approx(per_sequence_mean, rel=1e-5)
    assert float(loss(targets, noisy)) == pytest.approx(per_sequence_mean, rel=1e-5)
    weighted = loss(targets, logits, sample_weight=np.array([1.0, 0.0]))
    assert float(weighted) == pytest.approx(real[:2].mean() / 2, rel=1e-5)  # sum over batch
    restored = PaddedSequenceCrossentropy.from_config(loss.get_config())
    assert float(restored(targets, logits)) == pytest.approx(per_sequence_mean, rel=1e-5)
    unreduced = PaddedSequenceCrossentropy(reduction=keras.losses.Reduction.NONE)
    per_sequence = unreduced(targets, noisy).numpy()
    np.testing.assert_allclose(per_sequence, [real[:2].mean(), real[2]], rtol=1e-5)
    np.testing.assert_allclose(
        unreduced(targets, logits, sample_weight=np.array([2.0, 0.0])).numpy(),
        [2 * real[:2].mean(), 0.0],
        rtol=1e-5,
    )


def test_next_token_pairs_shift_by_one() -> None:
    inputs, targets = next_token_pairs(tf.constant([[1, 2, 3, 4, 0]]))
    assert inputs.numpy().tolist() == [[1, 2, 3, 4]]
    assert targets.numpy().tolist() == [[2, 3, 4, 0]]


def test_training_learns_a_repeating_sequence() -> None:
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(1)
    cycle = np.array([3, 8, 5, 11, 2])
    starts = rng.integers(0, 5, size=64)
    sequences = np.stack([np.resize(np.roll(cycle, -s), 11) for s in starts])
    sequences[::4, 8:] = 0  # some padded sequences
    inputs, targets = next_token_pairs(sequences)
    model = _model()
    before, after = train(
        model, HEADS, {"tokens": inputs}, {"next_token": targets}, epochs=8, learning_rate=2e-2
    )
    assert after < 0.3 * before
    assert generate(model, [8, 5, 11], 6).tolist() == [8, 5, 11, 2, 3, 8, 5, 11, 2]


def test_greedy_generation_is_deterministic_and_follows_argmax() -> None:
    keras.utils.set_random_seed(0)
    model = _model()
    prompt = [3, 8, 5]
    first = generate(model, prompt, 6)
    assert first.tolist()[:3] == prompt and first.shape == (9,)
    assert np.array_equal(generate(model, prompt, 6), first)
    logits = _logits(model, [prompt])[0, -1]
    logits[0] = -np.inf
    assert first[3] == int(np.argmax(logits))
    assert 0 not in first[3:]


def test_top_k_sampling_is_deterministic_per_seed() -> None:
    keras.utils.set_random_seed(0)
    model = _model()
    prompt = np.array([[3, 8, 5], [2, 2, 4]])
    sample = generate(model, prompt, 12, strategy="top_k", k=6, temperature=2.0, seed=7)
    assert sample.shape == (2, 15)
    again = generate(model, prompt, 12, strategy="top_k", k=6, temperature=2.0, seed=7)
    other = generate(model, prompt, 12, strategy="top_k", k=6, temperature=2.0, seed=8)
    assert np.array_equal(sample, again)
    assert not np.array_equal(sample, other)
    # With one candidate, sampling is greedy decoding.
    single = generate(model, prompt, 4, strategy="top_k", k=1, seed=3)
    assert np.array_equal(single, generate(model, prompt, 4))


def test_generation_slides_past_a_fixed_context_window() -> None:
    keras.utils.set_random_seed(0)
    model = _model(length=6, max_length=None)
    out = generate(model, [1, 2, 3], 8)
    assert out.shape == (11,)
    # Each step reads only the last 6 tokens, right-padded while the text is shorter.
    logits = _logits(model, [out[4:10].tolist()])[0, -1]
    logits[0] = -np.inf
    assert out[10] == int(np.argmax(logits))


def test_generate_rejects_bad_arguments() -> None:
    model = _model()
    with pytest.raises(ValueError, match="strategy"):
        generate(model, [1], 2, strategy="beam")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="temperature"):
        generate(model, [1], 2, temperature=0.0)
    with pytest.raises(ValueError, match="non-empty"):
        generate(model, [], 2)


def test_config_round_trip() -> None:
    keras.utils.set_random_seed(0)
    assert_config_round_trip(_model(), {"tokens": np.array([[1, 2, 3, 0]])})


def test_saved_model_round_trip(tmp_path) -> None:
    keras.utils.set_random_seed(0)
    assert_saved_model_round_trip(_model(), {"tokens": np.array([[1, 2, 3, 4, 0]])}, tmp_path)


def test_needs_a_language_model_head() -> None:
    with pytest.raises(ValueError, match="exactly one language_model head"):
        build_model(
            SMALL | {"max_length": 8},
            {"tokens": {"kind": "tokens", "shape": [8], "vocab_size": VOCAB}},
            {"label": HeadSpec(kind="classification", num_classes=2)},
        )


def test_open_length_needs_max_length() -> None:
    with pytest.raises(ValueError, match="set max_length"):
        _model(max_length=None)
