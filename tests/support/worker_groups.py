"""Training jobs run in worker processes grouped by the devices they need.

A test that needs several logical devices (replicas, a mesh, pipeline stages) must train in
a fresh process, and each such process spends seconds importing TensorFlow. So a test
module adds every job it needs to one ``WorkerGroups`` and runs them at once: one process
(or one cluster of processes) per device count and worker count, each running its jobs in
turn (``tests/support/workers/plans.py``). Tests then read each job's output directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.support.workers.plans import JOB_ERROR
from training.launcher import free_ports, tf_config

# A group's processes together: generous, a loaded two-core machine trains slowly.
GROUP_TIMEOUT_S = 900
LOG_TAIL = 4000


class WorkerGroups:
    """Jobs for the worker program ``module``, grouped by (devices, workers).

    Groups run one after another in the order their first job was added, so a job may
    continue what a job of an earlier group left (a run directory, say).
    """

    def __init__(self, module: str, directory: Path) -> None:
        self.module = module
        self.directory = directory
        self.groups: dict[tuple[int, int], list[dict[str, Any]]] = {}

    def add(self, name: str, devices: int, workers: int = 1, **settings: Any) -> Path:
        """Add job ``name`` with the worker's ``settings``; returns its output directory."""
        out = self.directory / name
        self.groups.setdefault((devices, workers), []).append({"out": str(out), **settings})
        return out

    def run(self) -> None:
        """Run every group, failing with a worker's log if one crashed or timed out."""
        for (devices, workers), jobs in self.groups.items():
            group = self.directory / f"group-{devices}-devices-{workers}-workers"
            group.mkdir(parents=True, exist_ok=True)
            plan = group / "plan.json"
            plan.write_text(json.dumps(jobs), encoding="utf-8")
            self._start_and_finish(group, plan, devices, workers)

    def _start_and_finish(self, group: Path, plan: Path, devices: int, workers: int) -> None:
        ports = free_ports(workers) if workers > 1 else []
        command = [sys.executable, "-m", self.module, str(plan), "--devices", str(devices)]
        started = []
        for index in range(workers):
            env = dict(os.environ)
            if ports:
                env["TF_CONFIG"] = tf_config(ports, index)
            log = group / f"worker-{index}.log"
            with log.open("w", encoding="utf-8") as output:
                process = subprocess.Popen(
                    command, env=env, stdout=output, stderr=subprocess.STDOUT
                )
            started.append((process, log))
        deadline = time.monotonic() + GROUP_TIMEOUT_S
        try:
            for process, log in started:
                try:
                    code = process.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    raise AssertionError(
                        f"{self.module} on {devices} devices timed out after "
                        f"{GROUP_TIMEOUT_S} s:\n{tail(log)}"
                    ) from None
                assert code == 0, f"{self.module} exited {code}:\n{tail(log)}"
        finally:
            for process, _ in started:
                if process.poll() is None:
                    process.kill()
                    process.wait()


def job_output(out: Path) -> Path:
    """``out``, once sure the job writing it did not fail (else its traceback)."""
    error = out / JOB_ERROR
    if error.exists():
        raise AssertionError(f"the job writing {out} failed:\n{tail(error)}")
    return out


def tail(path: Path) -> str:
    """The end of a log or traceback file, enough to see why without flooding the report."""
    return path.read_text(encoding="utf-8", errors="replace")[-LOG_TAIL:]
