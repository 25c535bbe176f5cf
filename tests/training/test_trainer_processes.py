"""`slipway train` as real processes: kills, preemption, resume, several workers."""

from __future__ import annotations

import os
import re
import signal

import pytest

from tests.support.experiments import write_experiment
from tests.support.training_processes import finish, slipway, wait_for_step, worker_pid
from training.checkpoints import latest_committed_step
from training.preemption import EXIT_PREEMPTED

pytestmark = pytest.mark.process
DIGEST = re.compile(r"weights sha256 ([0-9a-f]{64})")


def test_a_run_killed_mid_way_resumes_bit_for_bit(tmp_path, digits_dataset):
    settings = dict(
        training__steps=24,
        training__deterministic=True,
        checkpoint__every_steps=4,
        model__dropout=0.2,
    )
    reference = write_experiment(tmp_path / "reference", digits_dataset, **settings)
    code, output = finish(slipway("train", str(reference), "--no-export", "--quiet"))
    assert code == 0, output
    expected = DIGEST.search(output).group(1)

    interrupted = write_experiment(tmp_path / "interrupted", digits_dataset, **settings)
    heartbeat = tmp_path / "heartbeat"
    first = slipway(
        "train",
        str(interrupted),
        "--no-export",
        "--quiet",
        env={"SLIPWAY_HEARTBEAT_FILE": str(heartbeat)},
    )
    wait_for_step(heartbeat, first, 10)
    first.send_signal(signal.SIGKILL)
    finish(first)
    assert latest_committed_step(tmp_path / "interrupted" / "run" / "checkpoints") < 24

    code, output = finish(slipway("train", str(interrupted), "--no-export", "--quiet"))
    assert code == 0, output
    assert "resumed from checkpoint" in output
    assert DIGEST.search(output).group(1) == expected


def test_sigterm_saves_at_the_step_boundary_and_the_run_resumes(tmp_path, digits_dataset):
    path = write_experiment(
        tmp_path, digits_dataset, training__steps=400, checkpoint__every_steps=1000
    )
    heartbeat = tmp_path / "heartbeat"
    process = slipway(
        "train", str(path), "--no-export", "--quiet", env={"SLIPWAY_HEARTBEAT_FILE": str(heartbeat)}
    )
    wait_for_step(heartbeat, process, 5)
    process.send_signal(signal.SIGTERM)
    code, output = finish(process)

    assert code == EXIT_PREEMPTED, output
    saved = latest_committed_step(tmp_path / "run" / "checkpoints")
    assert saved is not None and 5 <= saved < 400
    assert f"[step {saved}] preempted (SIGTERM); checkpoint saved" in output

    code, output = finish(slipway("train", str(path), "--no-export", "--quiet"))
    assert code == 0, output
    assert f"resumed from checkpoint at step {saved}" in output
    assert latest_committed_step(tmp_path / "run" / "checkpoints") == 400


def test_two_workers_agree_and_survive_a_killed_worker(tmp_path, digits_dataset):
    path = write_experiment(
        tmp_path, digits_dataset, training__steps=60, checkpoint__every_steps=10
    )
    supervisor = slipway("train", str(path), "--workers", "2", "--quiet", "--no-export")
    heartbeat = tmp_path / "run" / "workers" / "heartbeat-1"
    wait_for_step(heartbeat, supervisor, 15)
    pid = worker_pid(1, str(path))
    assert pid is not None
    os.kill(pid, signal.SIGKILL)

    code, output = finish(supervisor)
    assert code == 0, output
    assert "worker 1 died (SIGKILL)" in output
    assert latest_committed_step(tmp_path / "run" / "checkpoints") == 60
    logs = [(tmp_path / "run" / "workers" / f"worker-{i}.log").read_text() for i in (0, 1)]
    digests = [DIGEST.findall(log)[-1] for log in logs]
    assert digests[0] == digests[1]
