"""Several replicas per process, and several workers of several replicas each, on logical
CPU devices: every replica reads its own examples and the run makes the updates of one
device with the same global batch."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from tests.support.experiments import write_experiment
from tests.support.worker_groups import WorkerGroups, job_output

# One process (or pair of processes) per device and worker count trains every run.
pytestmark = [pytest.mark.process, pytest.mark.timeout(1200)]
REPLICA_WORKER = "tests.support.workers.replica_worker"
STEPS = 12
# name -> (devices per worker, workers, gradient accumulation)
LAYOUTS = {
    "mirrored-2": (2, 1, 1),
    "mirrored-4": (4, 1, 1),
    "mirrored-2-accumulating-2": (2, 1, 2),
    "2-workers-x-2": (2, 2, 1),
}
RESUMED = ("mirrored-2", "2-workers-x-2")
RESUME = dict(model__dropout=0.2, checkpoint__every_steps=4)


def trained(out: Path, workers: int = 1) -> tuple[list[np.ndarray], list[dict]]:
    """A finished run's chief weights and every worker's report."""
    out = job_output(out)
    with np.load(out / "weights-0.npz") as saved:
        weights = [saved[key] for key in sorted(saved.files, key=lambda k: int(k.split("_")[1]))]
    reports = [json.loads((out / f"worker-{i}.json").read_text()) for i in range(workers)]
    return weights, reports


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, digits_dataset: Path) -> Path:
    """Every run of this module, trained before its tests read them; the directory holding
    each run's output under its name."""
    root = tmp_path_factory.mktemp("replicas")
    groups = WorkerGroups(REPLICA_WORKER, root / "out")

    def add(name: str, devices: int, workers: int, job=None, **settings) -> None:
        path = write_experiment(root / name, digits_dataset, training__steps=STEPS, **settings)
        groups.add(name, devices, workers, experiment=str(path), **(job or {}))

    add("one-device", 1, 1)
    for name, (devices, workers, accumulation) in LAYOUTS.items():
        add(name, devices, workers, training__gradient_accumulation=accumulation)
    for name in RESUMED:
        devices, workers, _ = LAYOUTS[name]
        add(f"{name}-straight", devices, workers, **RESUME)
        add(f"{name}-resumed", devices, workers, {"stop_at": 6}, **RESUME)
    groups.run()
    return root / "out"


@pytest.fixture(scope="module")
def one_device(runs: Path) -> tuple[list[np.ndarray], list[dict]]:
    return trained(runs / "one-device")


def batches_by_replica(reports: list[dict]) -> list[dict[str, list[str]]]:
    """Per micro-batch: what every replica of every worker was fed."""
    merged = [{} for _ in reports[0]["seen"]]
    for report in reports:
        for batch, seen in zip(merged, report["seen"], strict=True):
            batch.update(seen)
    return merged


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_replicas_read_their_own_examples_and_make_the_one_device_update(runs, one_device, layout):
    devices, workers, accumulation = LAYOUTS[layout]
    reference, (single,) = one_device
    weights, reports = trained(runs / layout, workers)

    replicas = devices * workers
    assert all(report["replicas"] == replicas for report in reports)
    assert all(report["step"] == STEPS for report in reports)
    single_batches = [batch["0"] for batch in single["seen"]]
    micro_batches = batches_by_replica(reports)
    per_replica = 32 // accumulation // replicas
    for step, batch in enumerate(micro_batches):
        assert sorted(batch) == [str(r) for r in range(replicas)]
        fed = [digest for replica in sorted(batch) for digest in batch[replica]]
        assert all(len(examples) == per_replica for examples in batch.values())
        # No example reaches two replicas, and together they read one device's batch.
        assert len(set(fed)) == len(fed)
        update, part = divmod(step, accumulation)
        whole = single_batches[update][part * len(fed) : (part + 1) * len(fed)]
        assert Counter(fed) == Counter(whole)

    for got, want in zip(weights, reference, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert not np.allclose(weights[0], 0)
    for report in reports:  # evaluation under the strategy sees the whole split once
        assert report["validation"]["examples"] == single["validation"]["examples"]
        assert report["validation"]["loss"] == pytest.approx(single["validation"]["loss"], rel=1e-4)


@pytest.mark.parametrize("layout", RESUMED)
def test_replicas_resume_bit_for_bit(runs, layout):
    workers = LAYOUTS[layout][1]
    straight, _ = trained(runs / f"{layout}-straight", workers)
    resumed, _ = trained(runs / f"{layout}-resumed", workers)

    for got, want in zip(resumed, straight, strict=True):
        np.testing.assert_array_equal(got, want)
