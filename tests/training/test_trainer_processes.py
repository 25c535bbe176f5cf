"""`slipway train` as real processes: kills, preemption, resume, several workers."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.training.experiments import build_digits_dataset, write_experiment
from training.checkpoints import latest_committed_step
from training.launcher import read_heartbeat
from training.preemption import EXIT_PREEMPTED

pytestmark = pytest.mark.integration
TIMEOUT = 300
DIGEST = re.compile(r"weights sha256 ([0-9a-f]{64})")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return build_digits_dataset(tmp_path_factory.mktemp("digits"))


def slipway(*args: str, env: dict[str, str] | None = None, **popen) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "slipway", *args],
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **popen,
    )


def finish(process: subprocess.Popen) -> tuple[int, str]:
    try:
        output, _ = process.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
        pytest.fail(f"timed out:\n{output[-3000:]}")
    return process.returncode, output


def wait_for_step(heartbeat: Path, process: subprocess.Popen, step: int) -> int:
    """Block until the trainer reports ``step`` (or later) through its heartbeat file."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        beat = read_heartbeat(heartbeat)
        if beat is not None and beat.step >= step:
            return beat.step
        if process.poll() is not None:
            pytest.fail(f"trainer exited early:\n{process.stdout.read()[-3000:]}")
        time.sleep(0.05)
    process.kill()
    pytest.fail(f"no heartbeat for step {step}")


def test_a_run_killed_mid_way_resumes_bit_for_bit(tmp_path, dataset):
    settings = dict(
        training__steps=24,
        training__deterministic=True,
        checkpoint__every_steps=4,
        model__dropout=0.2,
    )
    reference = write_experiment(tmp_path / "reference", dataset, **settings)
    code, output = finish(slipway("train", str(reference), "--no-export", "--quiet"))
    assert code == 0, output
    expected = DIGEST.search(output).group(1)

    interrupted = write_experiment(tmp_path / "interrupted", dataset, **settings)
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


def test_sigterm_saves_at_the_step_boundary_and_the_run_resumes(tmp_path, dataset):
    path = write_experiment(tmp_path, dataset, training__steps=400, checkpoint__every_steps=1000)
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


def _worker_pid(index: int, marker: str) -> int | None:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker.encode() in cmdline and f"SLIPWAY_WORKER_INDEX={index}".encode() in environ:
            return int(entry.name)
    return None


def test_two_workers_agree_and_survive_a_killed_worker(tmp_path, dataset):
    path = write_experiment(tmp_path, dataset, training__steps=60, checkpoint__every_steps=10)
    supervisor = slipway("train", str(path), "--workers", "2", "--quiet", "--no-export")
    heartbeat = tmp_path / "run" / "workers" / "heartbeat-1"
    wait_for_step(heartbeat, supervisor, 15)
    pid = _worker_pid(1, str(path))
    assert pid is not None
    os.kill(pid, signal.SIGKILL)

    code, output = finish(supervisor)
    assert code == 0, output
    assert "worker 1 died (SIGKILL)" in output
    assert latest_committed_step(tmp_path / "run" / "checkpoints") == 60
    logs = [(tmp_path / "run" / "workers" / f"worker-{i}.log").read_text() for i in (0, 1)]
    digests = [DIGEST.findall(log)[-1] for log in logs]
    assert digests[0] == digests[1]
