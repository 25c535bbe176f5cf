"""One live run per run directory.

Two ``slipway train`` commands on one experiment would write the same checkpoints,
each resuming from and overwriting the other's. The first to start holds an exclusive
lock on ``<run_dir>/train.lock`` (with its pid inside, for the message) until it ends;
the kernel drops the lock when its holder dies, however it dies, so a killed run never
blocks the next one. A supervisor holds it for its whole group of workers.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from contracts.ownership import try_lock
from training.errors import TrainingSetupError

LOCK_FILE = "train.lock"


class RunInUseError(TrainingSetupError):
    """Another live process trains in this run directory."""


@contextmanager
def exclusive_run(run_dir: Path) -> Iterator[None]:
    """Hold ``run_dir``'s lock for the duration; RunInUseError when a live run holds it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_FILE
    lock = try_lock(path, create=True)
    if lock is None:
        try:
            holder = f" (pid {int(path.read_text())})"
        except (OSError, ValueError):
            holder = ""
        raise RunInUseError(
            f"{run_dir}: another slipway train is running in this run directory{holder}; "
            "wait for it to finish or stop it"
        )
    try:
        lock.record(f"{os.getpid()}\n")
        yield
    finally:
        lock.release()
