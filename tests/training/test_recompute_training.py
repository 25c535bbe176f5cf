"""``recompute: true`` through the trainer: the updates of the plain model on several
replicas, bit-exact resume, and a published model that is the plain architecture."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tf_keras as keras

from research.models.recompute import has_recomputation
from tests.training.experiments import build_corpus_dataset, write_experiment
from tests.training.test_replicas import train

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_corpus_dataset(tmp_path_factory.mktemp("corpus"), 400)


def gpt_settings(recompute: bool) -> dict:
    return {
        "data__features": ["text"],
        "data__sequence_length": 32,
        "heads": {"next_token": {"kind": "language_model"}},
        "model": {
            "type": "gpt",
            "num_layers": 2,
            "d_model": 16,
            "num_heads": 2,
            "ff_dim": 32,
            "dropout": 0.2,
            "recompute": recompute,
        },
    }


def test_recomputed_replicas_make_the_plain_updates(tmp_path: Path, corpus: Path) -> None:
    plain, _ = train(tmp_path, corpus, "plain", devices=2, **gpt_settings(False))
    recomputed, reports = train(tmp_path, corpus, "recomputed", devices=2, **gpt_settings(True))
    assert reports[0]["replicas"] == 2
    assert len(recomputed) == len(plain)
    for got, want in zip(recomputed, plain, strict=True):
        # Twelve Adam updates apart only by rounding (other dropout masks would not be).
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_a_recomputed_run_resumes_bit_for_bit(tmp_path: Path, corpus: Path) -> None:
    settings = dict(devices=2, checkpoint__every_steps=4, **gpt_settings(True))
    straight, _ = train(tmp_path, corpus, "straight", **settings)
    resumed, _ = train(tmp_path, corpus, "resumed", options=("--stop-at", "6"), **settings)
    for got, want in zip(resumed, straight, strict=True):
        np.testing.assert_array_equal(got, want)


def test_the_published_model_is_the_plain_architecture(tmp_path: Path, corpus: Path) -> None:
    from research.experiments import load_experiment
    from research.experiments.task import ExperimentTask
    from training.run import train as train_run

    experiment = write_experiment(tmp_path / "run", corpus, training__steps=4, **gpt_settings(True))
    task = ExperimentTask(load_experiment(experiment))
    outcome = train_run(task, progress=False)
    assert outcome.exit_code == 0 and outcome.published is not None
    _, directory = outcome.published
    served = keras.models.load_model(directory, compile=False)
    assert not has_recomputation(served)
    block_layers = [layer.name for layer in served.layers if "_block0_" in layer.name]
    assert "decoder_block0_ffn_in" in block_layers
