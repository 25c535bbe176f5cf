"""A worker process's list of jobs: each run in turn, each failure kept to its own job.

Starting a process that imports TensorFlow costs seconds, and a process's logical devices
are fixed once TensorFlow starts, so tests group the runs that need the same devices into
one process. The plan is a JSON list of job settings, each naming an ``out`` directory the
job writes its results to. A job that raises leaves its traceback in ``out/JOB_ERROR`` and
the next job still runs, so only the tests that read the failed job fail.
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

JOB_ERROR = "error.txt"


def run_plan(plan: Path, job: Callable[[dict[str, Any]], None]) -> None:
    """Run ``job`` on every entry of ``plan`` in order, each from a fresh Keras session."""
    import tf_keras as keras

    for settings in json.loads(plan.read_text(encoding="utf-8")):
        out = Path(settings["out"])
        out.mkdir(parents=True, exist_ok=True)
        try:
            job(settings)
        except Exception:
            (out / JOB_ERROR).write_text(traceback.format_exc(), encoding="utf-8")
        keras.backend.clear_session()
