"""Where a run reports itself: TensorBoard scalars, a JSON-lines file and a progress bar.

Only the chief writes logs; every worker writes its heartbeat (the supervisor watches
it to tell a slow worker from a hung collective).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import tensorflow as tf
import tf_keras as keras

from contracts.metric_values import json_metrics
from training.launcher import HEARTBEAT_ENV, write_heartbeat

# Eager summary writes cost milliseconds; training scalars reach TensorBoard at most this
# often (every value still goes to metrics.jsonl).
SUMMARY_INTERVAL_SECONDS = 1.0


class RunLog:
    def __init__(self, run_dir: Path, total_steps: int, *, is_chief: bool, progress: bool) -> None:
        self.is_chief = is_chief
        self._heartbeat = os.environ.get(HEARTBEAT_ENV)
        self._writer = None
        self._jsonl = None
        self._progress = None
        self._last_summary = float("-inf")
        if is_chief:
            run_dir.mkdir(parents=True, exist_ok=True)
            self._writer = tf.summary.create_file_writer(str(run_dir / "tensorboard"))
            self._jsonl = open(run_dir / "metrics.jsonl", "a", encoding="utf-8")  # noqa: SIM115
            if progress:
                self._progress = keras.utils.Progbar(total_steps, unit_name="step")

    def heartbeat(self, step: int) -> None:
        if not self._heartbeat:
            return
        write_heartbeat(Path(self._heartbeat), step)

    def scalars(self, step: int, values: dict[str, float], *, kind: str = "train") -> None:
        if not self.is_chief:
            return
        record = json_metrics({"kind": kind, "step": step, "time": round(time.time(), 3), **values})
        self._jsonl.write(json.dumps(record, allow_nan=False) + "\n")
        self._jsonl.flush()
        now = time.monotonic()
        if kind == "train" and now - self._last_summary < SUMMARY_INTERVAL_SECONDS:
            return
        self._last_summary = now
        with self._writer.as_default(step=step):
            for name, value in values.items():
                tf.summary.scalar(f"{kind}/{name}", value)

    def progress(self, step: int, values: dict[str, float]) -> None:
        if self._progress is not None:
            self._progress.update(step, values=list(values.items()), finalize=False)

    def event(self, step: int, message: str, **details: Any) -> None:
        """Something a person should see: a skipped update, a restore, a preemption."""
        if not self.is_chief:
            return
        print(f"\n[step {step}] {message}", flush=True)
        self._jsonl.write(
            json.dumps(
                {
                    "kind": "event",
                    "step": step,
                    "message": message,
                    "time": round(time.time(), 3),
                    **details,
                }
            )
            + "\n"
        )
        self._jsonl.flush()

    def close(self) -> None:
        if self._progress is not None:
            print(flush=True)  # end the progress bar's line
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
        if self._jsonl is not None:
            self._jsonl.close()
