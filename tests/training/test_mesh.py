"""Tensor parallelism on DTensor meshes of logical CPU devices, and pipeline stages: the
one-device loss curve, weights split Megatron-style or placed by stage, bit-exact
resume, checkpoints that restore into other meshes, and a published model that is the
plain one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.support.datasets import CORPUS_VOCABULARY as VOCABULARY
from tests.support.experiments import write_experiment
from tests.support.worker_groups import WorkerGroups, job_output

# One process per device count runs every job: the mesh, pipeline and classifier runs
# together on four devices, then every one-device reference.
pytestmark = [pytest.mark.process, pytest.mark.timeout(1200)]
MESH_WORKER = "tests.support.workers.mesh_worker"
TIMEOUT = 600
UPDATES = 50
GPT = {"type": "gpt", "num_layers": 2, "d_model": 16, "num_heads": 4, "ff_dim": 32}
# Bit-exact resume needs a checkpoint before the stop and updates after it, not a long curve:
# every checkpoint of a mesh run costs seconds.
RESUME_UPDATES = 12
RESUME = {
    "model": {**GPT, "dropout": 0.1},
    "checkpoint__every_steps": 4,
    "training__steps": RESUME_UPDATES,
}
EXPERTS = {"model": {**GPT, "dropout": 0.0, "experts": {"num_experts": 4, "top_k": 2}}}
CLASSIFIER = {
    "heads": None,
    "data__labels": ["topic"],
    "model": {**GPT, "type": "transformer", "pooling": "cls", "dropout": 0.0},
}
MICRO_BATCHES = {"training__gradient_accumulation": 4}
# A run stopped on one mesh and resumed on others: (job, mesh, devices, last step).
RESTORE_STAGES = [("restore-2x2", "2x2", 4, 12), ("restore-1x4", "1x4", 4, 30)]


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


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, corpus_dataset: Path) -> Path:
    """Every worker run of this module, trained before its tests read them; the directory
    holding each run's output under its name."""
    manifest = json.loads((corpus_dataset / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["features"]["text"]["vocab_size"] == VOCABULARY
    root = tmp_path_factory.mktemp("mesh")
    groups = WorkerGroups(MESH_WORKER, root / "out")

    def add(name: str, devices: int, mesh: str | None, mode: str, job=None, **overrides):
        path = experiment(root / name, corpus_dataset, mesh, **overrides)
        groups.add(name, devices, experiment=str(path), mode=mode, **(job or {}))

    for mesh in ("1x4", "2x2"):
        add(f"mesh-{mesh}", 4, mesh, "curve")
    add("resume-straight", 4, "2x2", "run", **RESUME)
    add("resume-stopped", 4, "2x2", "run", {"stop_at": 6}, **RESUME)
    run_dir = str(root / "restored-run")
    for name, mesh, devices, until in RESTORE_STAGES:
        add(name, devices, mesh, "run", {"until": until}, run_dir=run_dir)
    add("experts-1x4", 4, "1x4", "curve", **EXPERTS)
    add("classifier-2x2", 4, "2x2", "curve", **CLASSIFIER)
    add("nonfinite-2x2", 4, "2x2", "curve", {"updates": 5, "poison_after": 3})
    add("pipeline-2-stages", 4, None, "curve", distribution={"pipeline": {"stages": 2}},
        **MICRO_BATCHES)  # fmt: skip
    add("one-device", 1, None, "curve")
    add("restore-one-device", 1, None, "run", run_dir=run_dir)  # after the mesh stages
    add("experts-one-device", 1, None, "curve", **EXPERTS)
    add("classifier-one-device", 1, None, "curve", **CLASSIFIER)
    add("pipeline-one-device", 1, None, "curve", **MICRO_BATCHES)
    groups.run()
    return root / "out"


def report(runs: Path, name: str) -> dict:
    """Run ``name``'s report, and its weights under ``"weights"``."""
    out = job_output(runs / name)
    result = json.loads((out / "report.json").read_text())
    with np.load(out / "weights.npz") as saved:
        result["weights"] = {key: saved[key] for key in saved.files}
    return result


def assert_same_weights(got: dict, want: dict, **tolerance) -> None:
    """Equal weights; with a tolerance, all but the attention keys' biases, which shift
    every score of a query alike and so leave the softmax as it is: their gradient is
    rounding noise, which Adam turns into steps of any sign on any device."""
    assert sorted(got) == sorted(want)
    for name in want:
        if tolerance and "/key/bias" in name:
            continue
        np.testing.assert_allclose(got[name], want[name], err_msg=name, **tolerance)


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
def one_device(runs: Path) -> dict:
    one_device = report(runs, "one-device")
    assert one_device["trainer"] == "Trainer"
    return one_device


@pytest.mark.parametrize("mesh", ["1x4", "2x2"])
def test_a_mesh_makes_the_one_device_loss_curve_holding_a_part_of_each_split_weight(
    runs: Path, one_device: dict, mesh: str
) -> None:
    on_mesh = report(runs, f"mesh-{mesh}")
    assert_follows(on_mesh, one_device)

    parts = int(mesh.split("x")[1])
    shapes = on_mesh["local_shapes"]
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


def test_a_mesh_run_resumes_bit_for_bit_and_publishes_the_plain_model(runs: Path) -> None:
    straight = report(runs, "resume-straight")
    resumed = report(runs, "resume-stopped")
    assert straight["step"] == resumed["step"] == RESUME_UPDATES
    assert_same_weights(resumed["weights"], straight["weights"], rtol=0, atol=0)

    import tf_keras as keras

    from research.models.weights import trained_on_mesh

    published = keras.models.load_model(straight["published"], compile=False)
    assert not trained_on_mesh(published)
    served = {weight.name: weight.numpy() for weight in published.weights}
    assert_same_weights(served, straight["weights"], rtol=0, atol=0)


def test_checkpoints_restore_into_other_meshes_and_one_device(runs: Path, one_device: dict) -> None:
    """One run, stopped and resumed as 2x2, then 1x4, then on one device."""
    for name, _mesh, _devices, until in RESTORE_STAGES:
        assert report(runs, name)["step"] == until
    restored = report(runs, "restore-one-device")
    assert restored["step"] == UPDATES
    assert restored["trainer"] == "Trainer"
    assert_same_weights(restored["weights"], one_device["weights"], rtol=1e-3, atol=1e-3)


def test_experts_are_split_over_the_model_axis_one_per_device(runs: Path) -> None:
    on_mesh = report(runs, "experts-1x4")
    assert_follows(on_mesh, report(runs, "experts-one-device"))
    width, feed_forward = GPT["d_model"], GPT["ff_dim"]
    shapes = on_mesh["local_shapes"]
    assert shapes["decoder_block0_experts/experts_in/kernel:0"] == [[1, width, feed_forward]] * 4
    assert shapes["decoder_block1_experts/experts_out/bias:0"] == [[1, width]] * 4
    assert shapes["decoder_block0_experts/router/kernel:0"] == [[width, 4]] * 4  # replicated


def test_the_transformer_classifier_trains_on_a_mesh_as_on_one_device(runs: Path) -> None:
    alone = report(runs, "classifier-one-device")
    on_mesh = report(runs, "classifier-2x2")
    assert_follows(on_mesh, alone)
    assert on_mesh["evaluation"]["topic_accuracy"] == pytest.approx(
        alone["evaluation"]["topic_accuracy"]
    )
    assert on_mesh["local_shapes"]["encoder_block1_ffn_in/kernel:0"] == [[16, 16]] * 4


def test_slipway_train_splits_the_cpu_for_a_mesh_and_publishes(
    tmp_path: Path, corpus_dataset: Path
) -> None:
    """The command line on a machine without GPUs: nothing configures devices but the run."""
    file = experiment(
        tmp_path, corpus_dataset, "1x2", training__steps=6, training__precision="auto"
    )
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


def test_an_update_that_is_not_finite_is_skipped_on_a_mesh(runs: Path) -> None:
    poisoned_run = report(runs, "nonfinite-2x2")
    assert poisoned_run["skipped_updates"] == poisoned_run["consecutive_nonfinite"] == 2
    losses = poisoned_run["losses"]
    assert np.isfinite(losses[:3]).all() and not np.isfinite(losses[3:]).any()
    with np.load(runs / "nonfinite-2x2" / "poisoned.npz") as poisoned:
        # Nothing was applied after the poison: every weight is as it was then.
        assert_same_weights(
            poisoned_run["weights"], {name: poisoned[name] for name in poisoned.files}
        )


def test_a_pipeline_places_its_stages_and_makes_the_one_device_updates(runs: Path) -> None:
    alone = report(runs, "pipeline-one-device")
    staged = report(runs, "pipeline-2-stages")
    assert staged["trainer"] == "Trainer"
    np.testing.assert_allclose(staged["losses"], alone["losses"], rtol=1e-4)
    assert_same_weights(staged["weights"], alone["weights"], rtol=1e-3, atol=1e-3)
    devices = staged["devices"]
    for block, device in (("decoder_block0", "CPU:0"), ("decoder_block1", "CPU:1")):
        placed = {name: where for name, where in devices.items() if name.startswith(block)}
        assert placed and all(where.endswith(device) for where in placed.values()), placed
