"""Several replicas per process, and several workers of several replicas each, on logical
CPU devices: every replica reads its own examples and the run makes the updates of one
device with the same global batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from tests.training.experiments import build_digits_dataset, write_experiment
from training.launcher import free_ports, tf_config

pytestmark = pytest.mark.integration
TIMEOUT = 300
STEPS = 12


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return build_digits_dataset(tmp_path_factory.mktemp("digits"))


def start_worker(
    experiment: Path,
    out: Path,
    devices: int,
    env: dict[str, str] | None = None,
    options: tuple[str, ...] = (),
) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.training.replica_worker", str(experiment), str(out)]
        + ["--devices", str(devices), *options],
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        try:
            output, _ = process.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            for other in processes:
                other.kill()
            pytest.fail("a replica worker timed out")
        assert process.returncode == 0, output[-4000:]


def train(
    tmp_path: Path,
    dataset: Path,
    name: str,
    *,
    devices: int,
    workers: int = 1,
    options: tuple[str, ...] = (),
    **settings,
) -> tuple[list[np.ndarray], list[dict]]:
    """Train in fresh processes; the chief's weights and every worker's report."""
    experiment = write_experiment(tmp_path / name, dataset, training__steps=STEPS, **settings)
    out = tmp_path / name / "out"
    if workers == 1:
        finish([start_worker(experiment, out, devices, options=options)])
    else:
        ports = free_ports(workers)
        finish(
            [
                start_worker(
                    experiment, out, devices, {"TF_CONFIG": tf_config(ports, index)}, options
                )
                for index in range(workers)
            ]
        )
    with np.load(out / "weights-0.npz") as saved:
        weights = [saved[key] for key in sorted(saved.files, key=lambda k: int(k.split("_")[1]))]
    reports = [json.loads((out / f"worker-{i}.json").read_text()) for i in range(workers)]
    return weights, reports


@pytest.fixture(scope="module")
def one_device(tmp_path_factory, dataset):
    return train(tmp_path_factory.mktemp("one-device"), dataset, "one-device", devices=1)


def batches_by_replica(reports: list[dict]) -> list[dict[str, list[str]]]:
    """Per micro-batch: what every replica of every worker was fed."""
    merged = [{} for _ in reports[0]["seen"]]
    for report in reports:
        for batch, seen in zip(merged, report["seen"], strict=True):
            batch.update(seen)
    return merged


@pytest.mark.parametrize(
    ("devices", "workers", "accumulation"),
    [(2, 1, 1), (4, 1, 1), (2, 1, 2), (2, 2, 1)],
    ids=["mirrored-2", "mirrored-4", "mirrored-2-accumulating-2", "2-workers-x-2"],
)
def test_replicas_read_their_own_examples_and_make_the_one_device_update(
    tmp_path, dataset, one_device, devices, workers, accumulation
):
    reference, (single,) = one_device
    weights, reports = train(
        tmp_path,
        dataset,
        "replicas",
        devices=devices,
        workers=workers,
        training__gradient_accumulation=accumulation,
    )

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


@pytest.mark.parametrize("workers", [1, 2], ids=["mirrored-2", "2-workers-x-2"])
def test_replicas_resume_bit_for_bit(tmp_path, dataset, workers):
    settings = dict(devices=2, workers=workers, model__dropout=0.2, checkpoint__every_steps=4)
    straight, _ = train(tmp_path, dataset, "straight", **settings)
    resumed, _ = train(tmp_path, dataset, "resumed", options=("--stop-at", "6"), **settings)

    for got, want in zip(resumed, straight, strict=True):
        np.testing.assert_array_equal(got, want)
