"""``recompute: true`` through the trainer: the updates of the plain model on several
replicas, bit-exact resume, and a published model that is the plain architecture."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tf_keras as keras

from research.models.recompute import has_recomputation
from tests.support.experiments import write_experiment
from tests.support.worker_groups import WorkerGroups, job_output

REPLICA_WORKER = "tests.support.workers.replica_worker"
STEPS = 12
RESUME = {"checkpoint__every_steps": 4}


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


def weights(out: Path) -> list[np.ndarray]:
    """A finished replica run's weights, in the model's order."""
    with np.load(job_output(out) / "weights-0.npz") as saved:
        return [saved[key] for key in sorted(saved.files, key=lambda k: int(k.split("_")[1]))]


@pytest.fixture(scope="module")
def replica_runs(tmp_path_factory: pytest.TempPathFactory, corpus_dataset: Path) -> Path:
    """Each run on two replicas, all in one worker process; the directory holding each
    run's output under its name."""
    root = tmp_path_factory.mktemp("recompute")
    groups = WorkerGroups(REPLICA_WORKER, root / "out")
    runs = {
        "plain": ({}, gpt_settings(False)),
        "recomputed": ({}, gpt_settings(True)),
        "straight": ({}, {**RESUME, **gpt_settings(True)}),
        "resumed": ({"stop_at": 6}, {**RESUME, **gpt_settings(True)}),
    }
    for name, (job, settings) in runs.items():
        path = write_experiment(root / name, corpus_dataset, training__steps=STEPS, **settings)
        groups.add(name, 2, experiment=str(path), **job)
    groups.run()
    return root / "out"


@pytest.mark.process
def test_recomputed_replicas_make_the_plain_updates(replica_runs: Path) -> None:
    plain = weights(replica_runs / "plain")
    recomputed = weights(replica_runs / "recomputed")
    report = json.loads((replica_runs / "recomputed" / "worker-0.json").read_text())
    assert report["replicas"] == 2
    assert len(recomputed) == len(plain)
    for got, want in zip(recomputed, plain, strict=True):
        # Twelve Adam updates apart only by rounding (other dropout masks would not be).
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.process
def test_a_recomputed_run_resumes_bit_for_bit(replica_runs: Path) -> None:
    straight = weights(replica_runs / "straight")
    resumed = weights(replica_runs / "resumed")
    for got, want in zip(resumed, straight, strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.slow
def test_the_published_model_is_the_plain_architecture(
    tmp_path: Path, corpus_dataset: Path
) -> None:
    from research.experiments import load_experiment
    from research.experiments.task import ExperimentTask
    from training.run import train as train_run

    experiment = write_experiment(
        tmp_path / "run", corpus_dataset, training__steps=4, **gpt_settings(True)
    )
    task = ExperimentTask(load_experiment(experiment))
    outcome = train_run(task, progress=False)
    assert outcome.exit_code == 0 and outcome.published is not None
    _, directory = outcome.published
    served = keras.models.load_model(directory, compile=False)
    assert not has_recomputation(served)
    block_layers = [layer.name for layer in served.layers if "_block0_" in layer.name]
    assert "decoder_block0_ffn_in" in block_layers
