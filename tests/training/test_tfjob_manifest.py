"""The Kubeflow TFJob runs the trainer's own worker command, restarts only what can recover,
and mounts everything the command reads and writes."""

from __future__ import annotations

import argparse
from pathlib import Path, PurePosixPath

import pytest
import yaml

import training.cli

MANIFEST = Path(__file__).parents[2] / "ops" / "deploy" / "kubernetes" / "tfjob.yaml"


@pytest.fixture(scope="module")
def job() -> dict:
    [document] = yaml.safe_load_all(MANIFEST.read_text())
    return document


@pytest.fixture(scope="module")
def worker(job: dict) -> dict:
    return job["spec"]["tfReplicaSpecs"]["Worker"]


@pytest.fixture(scope="module")
def container(worker: dict) -> dict:
    [container] = worker["template"]["spec"]["containers"]
    return container


def test_is_a_kubeflow_v1_tfjob_of_two_workers(job: dict, worker: dict):
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v1", "TFJob")
    assert set(job["spec"]["tfReplicaSpecs"]) == {"Worker"}  # worker 0 is the chief
    assert worker["replicas"] == 2


def test_restarts_on_retryable_exit_codes_only(job: dict, worker: dict):
    # ExitCode: 143 (preempted, checkpoint saved) is retried, 1-127 fail the job.
    assert worker["restartPolicy"] == "ExitCode"
    assert job["spec"]["runPolicy"]["activeDeadlineSeconds"] > 0


def test_runs_the_cli_worker_command_in_the_operators_container(container: dict):
    # The training operator injects TF_CONFIG into the container named "tensorflow".
    assert container["name"] == "tensorflow"
    assert container["image"] == "slipway:latest"
    program, *argv = container["command"]
    assert program == "slipway"
    parser = argparse.ArgumentParser(prog="slipway")
    training.cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    assert (args.command, args.worker) == ("train", True)
    assert args.experiment.suffix == ".yaml"


def test_mounts_the_experiment_read_only_and_a_writable_claim(worker: dict, container: dict):
    volumes = {volume["name"]: volume for volume in worker["template"]["spec"]["volumes"]}
    mounts = {mount["name"]: mount for mount in container["volumeMounts"]}
    assert set(mounts) == set(volumes)  # nothing mounted that is not declared, and vice versa

    [config_map] = [name for name, volume in volumes.items() if "configMap" in volume]
    experiment = PurePosixPath(container["command"][2])
    assert experiment.parent == PurePosixPath(mounts[config_map]["mountPath"])
    assert mounts[config_map]["readOnly"] is True

    [claim] = [name for name, volume in volumes.items() if "persistentVolumeClaim" in volume]
    assert volumes[claim]["persistentVolumeClaim"]["claimName"]
    assert not mounts[claim].get("readOnly", False)  # checkpoints and runs are written here
    assert container["workingDir"] == mounts[claim]["mountPath"]


def test_gives_a_preempted_worker_time_to_save(worker: dict):
    assert worker["template"]["spec"]["terminationGracePeriodSeconds"] >= 30
