"""Tensor parallelism on DTensor meshes of logical CPU devices, and pipeline stages: the
one-device loss curve, weights split Megatron-style or placed by stage, bit-exact
resume, checkpoints that restore into other meshes, and a published model that is the
plain one."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.training.experiments import build_corpus_dataset, write_experiment

pytestmark = pytest.mark.integration
TIMEOUT = 600
UPDATES = 50
VOCABULARY = 256
GPT = {"type": "gpt", "num_layers": 2, "d_model": 16, "num_heads": 4, "ff_dim": 32}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The generated corpus, its sentencepiece vocabulary a size every mesh here divides."""
    dataset = build_corpus_dataset(tmp_path_factory.mktemp("corpus"), 400, vocabulary=VOCABULARY)
    manifest = json.loads((dataset / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["features"]["text"]["vocab_size"] == VOCABULARY
    return dataset


def experiment(directory: Path, corpus: Path, mesh: str | None, **overrides) -> Path:
    settings = {
        "data__features": ["text"],
        "data__sequence_length": 16,
        "data__batch_size": 8,
        "heads": {"next_token": {"kind": "language_model"}},
        "model": {**GPT, "dropout": 0.0},
        "training__steps": UPDATES,
        **overrides,
    }
    if mesh is not None:
        batch, model = (int(size) for size in mesh.split("x"))
        settings["distribution"] = {"mesh": {"batch": batch, "model": model}}
    return write_experiment(directory, corpus, **settings)


def run_worker(experiment_file: Path, out: Path, devices: int, *options: str) -> dict:
    """The worker's report, and its weights under ``"weights"``."""
    command = [sys.executable, "-m", "tests.training.mesh_worker", str(experiment_file)]
    command += [str(out), "--devices", str(devices), *options]
    try:
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=TIMEOUT, env=dict(os.environ)
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"the mesh worker timed out after {TIMEOUT} s")
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    report = json.loads((out / "report.json").read_text())
    with np.load(out / "weights.npz") as saved:
        report["weights"] = {name: saved[name] for name in saved.files}
    return report


def assert_same_weights(got: dict, want: dict, **tolerance) -> None:
    """Equal weights; with a tolerance, all but the attention keys' biases, which shift
    every score of a query alike and so leave the softmax as it is: their gradient is
    rounding noise, which Adam turns into steps of any sign on any device."""
    assert sorted(got) == sorted(want)
    for name in want:
        if tolerance and "/key/bias" in name:
            continue
        np.testing.assert_allclose(got[name], want[name], err_msg=name, **tolerance)


def curves_alone_and_on(tmp_path: Path, corpus: Path, mesh: str, **overrides) -> tuple:
    """The same experiment's curve reports on one device and on ``mesh``."""
    alone = run_worker(
        experiment(tmp_path / "one", corpus, None, **overrides), tmp_path / "one-out", 1,
        "--mode", "curve",
    )  # fmt: skip
    on_mesh = run_worker(
        experiment(tmp_path / "mesh", corpus, mesh, **overrides), tmp_path / "mesh-out", 4,
        "--mode", "curve",
    )  # fmt: skip
    return alone, on_mesh


def assert_follows(report: dict, one_device: dict) -> None:
    """A mesh run made the one-device run's updates: its losses, weights, evaluation."""
    assert report["trainer"] == "MeshTrainer"
    assert len(report["losses"]) == UPDATES
    np.testing.assert_allclose(report["losses"], one_device["losses"], rtol=1e-4)
    assert report["losses"][-1] < report["losses"][0]
    # Fifty Adam updates (steps of 0.01) turn rounding in a near-zero gradient into a
    # visible part of a step here and there.
    assert_same_weights(report["weights"], one_device["weights"], rtol=1e-3, atol=1e-3)
    evaluation = report["evaluation"]
    assert evaluation["examples"] == one_device["evaluation"]["examples"]
    assert evaluation["loss"] == pytest.approx(one_device["evaluation"]["loss"], rel=1e-4)


@pytest.fixture(scope="module")
def one_device(tmp_path_factory: pytest.TempPathFactory, corpus: Path) -> dict:
    directory = tmp_path_factory.mktemp("one-device")
    report = run_worker(
        experiment(directory, corpus, None), directory / "out", 1, "--mode", "curve"
    )
    assert report["trainer"] == "Trainer"
    return report


@pytest.mark.parametrize("mesh", ["1x4", "2x2"])
def test_a_mesh_makes_the_one_device_loss_curve_holding_a_part_of_each_split_weight(
    tmp_path: Path, corpus: Path, one_device: dict, mesh: str
) -> None:
    report = run_worker(experiment(tmp_path, corpus, mesh), tmp_path / "out", 4, "--mode", "curve")
    assert_follows(report, one_device)

    parts = int(mesh.split("x")[1])
    shapes = report["local_shapes"]
    heads, width, feed_forward = GPT["num_heads"], GPT["d_model"], GPT["ff_dim"]
    split = {
        "decoder_block0_attention/query/kernel:0": (width, heads // parts, width // heads),
        "decoder_block0_attention/attention_output/kernel:0": (
            heads // parts,
            width // heads,
            width,
        ),
        "decoder_block1_ffn_in/kernel:0": (width, feed_forward // parts),
        "decoder_block1_ffn_out/kernel:0": (feed_forward // parts, width),
        "decoder_embedding/token/embeddings:0": (VOCABULARY, width // parts),
        "next_token_logits/kernel:0": (width, VOCABULARY // parts),
    }
    for name, part in split.items():
        assert shapes[name] == [list(part)] * 4, name
    assert shapes["decoder_final_norm/gamma:0"] == [[width]] * 4  # replicated


def test_a_mesh_run_resumes_bit_for_bit_and_publishes_the_plain_model(
    tmp_path: Path, corpus: Path
) -> None:
    settings = {"model": {**GPT, "dropout": 0.1}, "checkpoint__every_steps": 4}
    straight = run_worker(
        experiment(tmp_path / "straight", corpus, "2x2", **settings),
        tmp_path / "straight-out", 4, "--mode", "run",
    )  # fmt: skip
    resumed = run_worker(
        experiment(tmp_path / "resumed", corpus, "2x2", **settings),
        tmp_path / "resumed-out", 4, "--mode", "run", "--stop-at", "6",
    )  # fmt: skip
    assert straight["step"] == resumed["step"] == UPDATES
    assert_same_weights(resumed["weights"], straight["weights"], rtol=0, atol=0)

    import tf_keras as keras

    from research.models.weights import trained_on_mesh

    published = keras.models.load_model(straight["published"], compile=False)
    assert not trained_on_mesh(published)
    served = {weight.name: weight.numpy() for weight in published.weights}
    assert_same_weights(served, straight["weights"], rtol=0, atol=0)


def test_checkpoints_restore_into_other_meshes_and_one_device(
    tmp_path: Path, corpus: Path, one_device: dict
) -> None:
    """One run, stopped and resumed as 2x2, then 1x4, then on one device."""
    run_dir = tmp_path / "run"
    stages = [("2x2", 4, 12), ("1x4", 4, 30), (None, 1, None)]
    for index, (mesh, devices, until) in enumerate(stages):
        file = experiment(tmp_path / f"stage{index}", corpus, mesh, run_dir=str(run_dir))
        options = ["--mode", "run"] + (["--until", str(until)] if until else [])
        report = run_worker(file, tmp_path / f"out{index}", devices, *options)
        assert report["step"] == (until or UPDATES)
    assert report["trainer"] == "Trainer"
    assert_same_weights(report["weights"], one_device["weights"], rtol=1e-3, atol=1e-3)
    shutil.rmtree(run_dir)


def test_experts_are_split_over_the_model_axis_one_per_device(tmp_path: Path, corpus: Path) -> None:
    experts = {"model": {**GPT, "dropout": 0.0, "experts": {"num_experts": 4, "top_k": 2}}}
    alone, report = curves_alone_and_on(tmp_path, corpus, "1x4", **experts)
    assert_follows(report, alone)
    width, feed_forward = GPT["d_model"], GPT["ff_dim"]
    shapes = report["local_shapes"]
    assert shapes["decoder_block0_experts/experts_in/kernel:0"] == [[1, width, feed_forward]] * 4
    assert shapes["decoder_block1_experts/experts_out/bias:0"] == [[1, width]] * 4
    assert shapes["decoder_block0_experts/router/kernel:0"] == [[width, 4]] * 4  # replicated


def test_the_transformer_classifier_trains_on_a_mesh_as_on_one_device(
    tmp_path: Path, corpus: Path
) -> None:
    classifier = {
        "heads": None,
        "data__labels": ["topic"],
        "model": {**GPT, "type": "transformer", "pooling": "cls", "dropout": 0.0},
    }
    alone, report = curves_alone_and_on(tmp_path, corpus, "2x2", **classifier)
    assert_follows(report, alone)
    assert report["evaluation"]["topic_accuracy"] == pytest.approx(
        alone["evaluation"]["topic_accuracy"]
    )
    assert report["local_shapes"]["encoder_block1_ffn_in/kernel:0"] == [[16, 16]] * 4


def test_slipway_train_splits_the_cpu_for_a_mesh_and_publishes(
    tmp_path: Path, corpus: Path
) -> None:
    """The command line on a machine without GPUs: nothing configures devices but the run."""
    file = experiment(tmp_path, corpus, "1x2", training__steps=6, training__precision="auto")
    result = subprocess.run(
        [sys.executable, "-m", "slipway", "train", str(file), "--quiet"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    log = (tmp_path / "run" / "metrics.jsonl").read_text(encoding="utf-8")
    assert "precision float32 (auto: a device mesh trains in float32)" in log
    (version,) = (tmp_path / "models" / "mlp").iterdir()
    manifest = json.loads((version / "slipway.json").read_text(encoding="utf-8"))
    assert manifest["provenance"]["experiment"] == "mlp"


def test_an_update_that_is_not_finite_is_skipped_on_a_mesh(tmp_path: Path, corpus: Path) -> None:
    report = run_worker(
        experiment(tmp_path, corpus, "2x2"), tmp_path / "out", 4,
        "--mode", "curve", "--updates", "5", "--poison-after", "3",
    )  # fmt: skip
    assert report["skipped_updates"] == report["consecutive_nonfinite"] == 2
    assert np.isfinite(report["losses"][:3]).all() and not np.isfinite(report["losses"][3:]).any()
    with np.load(tmp_path / "out" / "poisoned.npz") as poisoned:
        # Nothing was applied after the poison: every weight is as it was then.
        assert_same_weights(report["weights"], {name: poisoned[name] for name in poisoned.files})


def test_a_pipeline_places_its_stages_and_makes_the_one_device_updates(
    tmp_path: Path, corpus: Path
) -> None:
    micro_batches = {"training__gradient_accumulation": 4}
    alone = run_worker(
        experiment(tmp_path / "one", corpus, None, **micro_batches), tmp_path / "one-out", 1,
        "--mode", "curve",
    )  # fmt: skip
    staged = run_worker(
        experiment(
            tmp_path / "staged", corpus, None, distribution={"pipeline": {"stages": 2}},
            **micro_batches,
        ),
        tmp_path / "staged-out", 2, "--mode", "curve",
    )  # fmt: skip
    assert staged["trainer"] == "Trainer"
    np.testing.assert_allclose(staged["losses"], alone["losses"], rtol=1e-4)
    assert_same_weights(staged["weights"], alone["weights"], rtol=1e-3, atol=1e-3)
    devices = staged["devices"]
    for block, device in (("decoder_block0", "CPU:0"), ("decoder_block1", "CPU:1")):
        placed = {name: where for name, where in devices.items() if name.startswith(block)}
        assert placed and all(where.endswith(device) for where in placed.values()), placed
