"""``slipway train`` as a real child process, and what a test watches of it.

Kills, signals, preemption and several workers are only real across a process boundary,
so these tests start the command itself and follow it through its heartbeat file and the
``/proc`` entries of its workers.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.waiting import wait_until
from training.launcher import read_heartbeat

TIMEOUT = 300


def slipway(*args: str, env: dict[str, str] | None = None, **popen) -> subprocess.Popen:
    """``slipway ARGS...`` started in a child process, its output merged and piped."""
    return subprocess.Popen(
        [sys.executable, "-m", "slipway", *args],
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **popen,
    )


def finish(process: subprocess.Popen) -> tuple[int, str]:
    """The process's exit code and output, once it exits (killed after ``TIMEOUT``)."""
    try:
        output, _ = process.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
        pytest.fail(f"timed out:\n{output[-3000:]}")
    return process.returncode, output


def wait_for_step(heartbeat: Path, process: subprocess.Popen, step: int) -> int:
    """The step the trainer reports through its heartbeat file, once ``step`` or later."""

    def reached() -> int | None:
        beat = read_heartbeat(heartbeat)
        if beat is not None and beat.step >= step:
            return beat.step
        if process.poll() is not None:
            pytest.fail(f"trainer exited early:\n{process.stdout.read()[-3000:]}")
        return None

    try:
        return wait_until(reached, f"a heartbeat for step {step}", timeout=TIMEOUT)
    except AssertionError:
        process.kill()
        raise


def worker_pid(index: int, marker: str) -> int | None:
    """The pid of worker ``index`` of the run whose command line holds ``marker``."""
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
