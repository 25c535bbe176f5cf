"""One live run per run directory, and per checkpoint directory.

Two ``slipway train`` commands on one experiment would write the same checkpoints,
each resuming from and overwriting the other's; so would two experiments that name the
same ``checkpoint.directory`` from different run directories. The first to start holds
an exclusive lock on ``<run_dir>/train.lock`` and on ``<checkpoint_dir>/train.lock``
(with its pid and run directory inside, for the message) until it ends; the kernel drops
the locks when their holder dies, however it dies, so a killed run never blocks the next
one. A supervisor holds them for its whole group of workers.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from contracts.ownership import try_lock
from training.errors import TrainingSetupError

LOCK_FILE = "train.lock"


class RunInUseError(TrainingSetupError):
    """Another live process trains in this run directory or into this checkpoint directory."""


@contextmanager
def exclusive_run(
    run_dir: Path, checkpoint_dir: Path | None = None, *, command: str = "slipway train"
) -> Iterator[None]:
    """Hold the locks of ``run_dir`` and ``checkpoint_dir`` for the duration;
    RunInUseError when a live run holds either. ``command`` names this kind of run in
    the message a second one gets (a search's output directory is locked the same way)."""
    with ExitStack() as stack:
        stack.enter_context(_held(run_dir, run_dir, f"{command} is running in this directory"))
        if checkpoint_dir is not None and _differ(checkpoint_dir, run_dir):
            what = f"{command} is writing its checkpoints to this checkpoint directory"
            stack.enter_context(_held(checkpoint_dir, run_dir, what))
        yield


def _differ(left: Path, right: Path) -> bool:
    """Whether two directories are two (a second lock on one file would be refused)."""
    return left.resolve() != right.resolve()


@contextmanager
def _held(directory: Path, run_dir: Path, what: str) -> Iterator[None]:
    """Hold ``directory``'s lock, recording this process and its run directory."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / LOCK_FILE
    lock = try_lock(path, create=True)
    if lock is None:
        raise RunInUseError(
            f"{directory}: another {what}{_holder(path, run_dir)}; wait for it to finish or stop it"
        )
    try:
        lock.record(f"{os.getpid()}\n{run_dir.resolve()}\n")
        yield
    finally:
        lock.release()


def _holder(path: Path, run_dir: Path) -> str:
    """`` (pid 123)``, with the holder's run directory when it is another one; empty when
    the holder has not recorded itself yet."""
    try:
        pid, *rest = path.read_text().splitlines()
        shown = f" (pid {int(pid)}"
    except (OSError, ValueError):
        return ""
    if rest and rest[0] and Path(rest[0]) != run_dir.resolve():
        shown += f", run directory {rest[0]}"
    return shown + ")"
