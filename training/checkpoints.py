"""Checkpoints that a crash, a preemption or a flipped bit cannot turn into a bad resume.

Layout of a checkpoint directory::

    ckpt-<step>.index                 TensorFlow's checkpoint files, numbered by step
    ckpt-<step>.data-NNNNN-of-NNNNN
    ckpt-<step>.commit.json           the commit marker: step, time, SHA-256 and size of each file

TensorFlow writes the index and data files one after the other and nothing says when a
checkpoint is complete; ``tf.train.latest_checkpoint`` would happily point at one a
crash cut short. Here a checkpoint counts only once its commit marker exists, and it is
restored only while its bytes still match the marker. The marker is written once the
files are flushed to disk (fsync), and only then are the oldest checkpoints deleted
(marker first), so whenever the process dies the newest committed checkpoint is still
whole on disk.

The files are written on the calling (training) thread by one compiled function: the
checkpoint's object graph is traced once, so a save is a single call into TensorFlow
(about 4 ms for the example models) where an eager save walks the objects and runs a
few ops per variable in Python (30-70 ms, and as much again on whatever thread does
it). Writing before the next update keeps the saved values consistent without a host
copy of the state. The function is traced again when the checkpoint's objects change
(optimizer slots appear with the first update). The commit that follows — fsync,
SHA-256 of each file, the marker, deleting old checkpoints — runs on a thread of its
own while training goes on (``save(wait=False)``). At most one save is in flight: the
next save, any restore and ``wait`` finish it first, and an error it met is raised
there.

Under ``MultiWorkerMirroredStrategy`` saving involves collectives, so every worker saves;
only the chief writes into the directory, the others into a per-worker temporary
directory that is removed straight away (TensorFlow's multi-worker tutorial pattern).
Every worker restores from the chief's directory.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import tensorflow as tf

from contracts.atomic_files import write_json_atomically
from contracts.model_manifest import check_files, file_entry
from training.errors import TrainingSetupError

CHECKPOINT_NAME = "ckpt"
MARKER_FORMAT = "slipway.checkpoint/1"
MARKER_SUFFIX = ".commit.json"
# Objects a traced write cannot save as they are at each save.
_EAGER_ONLY = (tf.train.experimental.PythonState, tf.experimental.dtensor.DVariable)
_MARKER = re.compile(rf"^{CHECKPOINT_NAME}-(\d+){re.escape(MARKER_SUFFIX)}$")
# A checkpoint's files, and the scratch directory TensorFlow merges them from.
_CHECKPOINT_FILE = re.compile(
    rf"^{CHECKPOINT_NAME}-(\d+)(\.index|\.data-\d{{5}}-of-\d{{5}}|_temp.*)$"
)


class CheckpointError(RuntimeError):
    """Committed checkpoints exist but none of them can be restored."""


class CheckpointMismatchError(CheckpointError, TrainingSetupError):
    """A sound checkpoint does not fit the objects being restored: the experiment changed
    (a layer's width, a layer added) since the run's checkpoints were written. Every older
    checkpoint has the same shapes, so this is the user's to resolve, not a fault to retry."""


class CheckpointWarning(UserWarning):
    """A committed checkpoint was skipped because it cannot be trusted."""


def _marker_path(directory: Path, step: int) -> Path:
    return directory / f"{CHECKPOINT_NAME}-{step}{MARKER_SUFFIX}"


def committed_steps(directory: str | Path) -> list[int]:
    """Steps with a commit marker, newest first (their files are not re-verified)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted((int(m.group(1)) for m in map(_MARKER.match, names) if m), reverse=True)


def latest_committed_step(directory: str | Path) -> int | None:
    """The newest committed step, for tooling; ``restore_latest`` is what verifies it."""
    steps = committed_steps(directory)
    return steps[0] if steps else None


def _problem(directory: Path, step: int) -> str | None:
    """Why the committed checkpoint at ``step`` cannot be trusted, or None when it can."""
    try:
        marker = json.loads(_marker_path(directory, step).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return f"unreadable commit marker: {exc}"
    if not isinstance(marker, dict) or marker.get("format") != MARKER_FORMAT:
        return "not a commit marker"
    if marker.get("step") != step:
        return f"commit marker is for step {marker.get('step')!r}"
    files = marker.get("files")
    if not isinstance(files, dict) or not any(name.endswith(".index") for name in files):
        return "commit marker lists no checkpoint files"
    problems = check_files(directory, files)
    return "; ".join(problems) if problems else None


def _written_at(directory: Path, step: int) -> float:
    """When the checkpoint at ``step`` was committed: its marker's time (markers of
    older runs have none, so their file's modification time stands in)."""
    path = _marker_path(directory, step)
    try:
        written = json.loads(path.read_text(encoding="utf-8")).get("written_at")
    except (OSError, ValueError, AttributeError):
        written = None
    return float(written) if isinstance(written, int | float) else path.stat().st_mtime


def _any_worker(strategy: tf.distribute.Strategy) -> Callable[[bool], bool]:
    """A vote that is True on every worker when it is True on any (a summed all-reduce)."""

    @tf.function
    def reduce(vote: tf.Tensor) -> tf.Tensor:
        per_replica = strategy.run(tf.identity, args=(vote,))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    return lambda vote: int(reduce(tf.constant(int(vote), tf.int32))) > 0


class _UnrestoredValueNotices(logging.Filter):
    """Drops TensorFlow's notices, logged when the objects of a failed restore are freed,
    about each value the restore did not reach: the mismatch was reported already, in
    one message, and the list would bury it."""

    _PREFIXES = (
        "Detecting that an object or model or tf.train.Checkpoint is being deleted",
        "Value in checkpoint could not be found in the restored object",
        "An attribute in the restored object could not be found in the checkpoint",
    )

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self._PREFIXES)


_UNRESTORED_NOTICES = _UnrestoredValueNotices()


class _SaverRetracingNotices(logging.Filter):
    """Drops TensorFlow's warning that its own checkpoint writer retraced: an eager save
    of DTensor variables traces a fresh writer every time, by TensorFlow's design, and
    the warning (meant for a user's functions) would follow every save of the run."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not ("triggered tf.function retracing" in message and "MultiDeviceSaver" in message)


_SAVER_RETRACING_NOTICES = _SaverRetracingNotices()


def _silence_unrestored_value_notices() -> None:
    tf.get_logger().addFilter(_UNRESTORED_NOTICES)  # a no-op when already added


class CheckpointKeeper:
    """Saves ``checkpoint`` every so many steps and/or seconds; restores the newest good one.

    ``keep`` checkpoints are kept, plus one every ``keep_every_hours`` when given. Every
    worker of a multi-worker run builds its own keeper on the same ``directory`` and calls
    ``should_save``/``save`` at the same steps. Steps are a shared count, but clocks are
    not: with ``every_seconds`` under several workers pass ``strategy`` so that the
    workers agree on a time-based save (otherwise one would wait forever in the save's
    collectives for the others).
    """

    def __init__(
        self,
        directory: str | Path,
        checkpoint: tf.train.Checkpoint,
        *,
        keep: int,
        keep_every_hours: float | None = None,
        every_steps: int | None = None,
        every_seconds: float | None = None,
        is_chief: bool = True,
        worker_index: int = 0,
        clock: Callable[[], float] = time.monotonic,
        strategy: tf.distribute.Strategy | None = None,
    ) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        if every_steps is not None and every_steps < 1:
            raise ValueError(f"every_steps must be at least 1, got {every_steps}")
        if every_seconds is not None and every_seconds <= 0:
            raise ValueError(f"every_seconds must be positive, got {every_seconds}")
        if keep_every_hours is not None and keep_every_hours <= 0:
            raise ValueError(f"keep_every_hours must be positive, got {keep_every_hours}")
        self.directory = Path(directory).absolute()
        self.checkpoint = checkpoint
        self.is_chief = is_chief
        self._keep = keep
        self._keep_every_hours = keep_every_hours
        self._every_steps = every_steps
        self._every_seconds = every_seconds
        self._clock = clock
        self._agree = _any_worker(strategy) if strategy is not None else (lambda vote: vote)
        if is_chief:
            self._write_dir = self.directory
        else:
            scratch = self.directory.parent / f"workertemp_{worker_index}"
            self._write_dir = scratch / self.directory.name
        self._write: Callable[[Any], Any] | None = None
        self._traced_objects: list[Any] = []
        # One long-lived thread: starting a thread per save waits for it to take the
        # GIL from the training thread, which can take longer than the commit itself.
        self._committer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-commit")
        self._pending: Future[None] | None = None
        self._last_step: int | None = None
        self._last_time = clock()

    # -- when ---------------------------------------------------------------------------
    def should_save(self, step: int) -> bool:
        """True when a multiple of ``every_steps`` was passed or ``every_seconds`` elapsed.

        Crossing a multiple (rather than landing on one) keeps the schedule when the step
        advances several at a time, as with ``steps_per_execution``.
        """
        step = int(step)
        if step == self._last_step:
            return False
        last = self._last_step or 0
        if self._every_steps is not None and step // self._every_steps > last // self._every_steps:
            return True
        if self._every_seconds is None:
            return False
        return self._agree(self._clock() - self._last_time >= self._every_seconds)

    def maybe_save(self, step: int, *, wait: bool = True) -> str | None:
        """``save`` when ``should_save``; call it on every worker after every update."""
        return self.save(step, wait=wait) if self.should_save(step) else None

    # -- saving -------------------------------------------------------------------------
    def save(self, step: int, *, wait: bool = True) -> str | None:
        """Save and commit a checkpoint for ``step``; its path on the chief, else None.

        The files are written before this returns; with ``wait=False`` their commit may
        still be running, off this thread (see ``wait``). Saving the step that
        was just saved or restored is a no-op, so a final forced save right after a
        scheduled one does not rewrite it.
        """
        step = int(step)
        if step < 0:
            raise ValueError(f"step must be non-negative, got {step}")
        # The previous commit first: until its marker exists, its files look like the
        # leftovers of a crash, which preparing the directory deletes.
        self.wait()
        if step != self._last_step:
            if self.is_chief:
                self._prepare_directory(step)
            else:
                shutil.rmtree(self._write_dir.parent, ignore_errors=True)
                self._write_dir.mkdir(parents=True)
            prefix = self._write_dir / f"{CHECKPOINT_NAME}-{step}"
            self._compiled_write()(tf.constant(str(prefix)))
            self._pending = self._committer.submit(self._finish_save, prefix, step)
            self._last_step = step
            self._last_time = self._clock()
        if wait:
            self.wait()
        return str(self.directory / f"{CHECKPOINT_NAME}-{step}") if self.is_chief else None

    def wait(self) -> None:
        """Block until the last save is committed; raise the error its commit met (that
        checkpoint then does not count, and saving its step again retries it)."""
        pending, self._pending = self._pending, None
        error = pending.exception() if pending is not None else None
        if error is not None:
            self._last_step = None
            raise error

    def close(self) -> None:
        """Finish the save in flight (raising its error, as ``wait``) and stop the commit
        thread; the keeper saves no more."""
        try:
            self.wait()
        finally:
            self._committer.shutdown(wait=True)

    def _compiled_write(self) -> Callable[[Any], Any]:
        """``checkpoint.write`` traced for the checkpoint's objects as they are now.

        The trace captures the variables reachable at that moment, so it is redone
        when they change: a save made before the first update would otherwise miss the
        optimizer's slots ever after. Walking the objects to see that costs under a
        millisecond; an eager write walks them too, and then runs each variable's ops.
        A checkpoint holding Python state (``tf.train.experimental.PythonState``) is not
        traced, since a trace would save that state as it was when traced.
        """
        # Created on first use by tf.train.Checkpoint.save and restore, never by write:
        # made here so that every checkpoint and every restore have the same objects.
        self.checkpoint.save_counter  # noqa: B018
        objects = tf.train.TrackableView(self.checkpoint).descendants()
        unchanged = len(objects) == len(self._traced_objects) and all(
            now is then for now, then in zip(objects, self._traced_objects, strict=True)
        )
        if any(isinstance(thing, _EAGER_ONLY) for thing in objects):
            # Python values are read once when traced, and DTensor's sharded save is not
            # traced at all: such a checkpoint is written eagerly.
            tf.get_logger().addFilter(_SAVER_RETRACING_NOTICES)  # a no-op when added
            return self.checkpoint.write
        if self._write is None or not unchanged:
            # Under this worker's CPU named in full, as variables on it name it: the
            # object graph's short "/cpu:0" would otherwise make a second data file.
            with tf.device("/cpu:0"):
                device = tf.zeros([]).device

            def write(prefix: tf.Tensor) -> tf.Tensor:
                with tf.device(device):
                    return self.checkpoint.write(prefix)

            self._write = tf.function(
                write, input_signature=(tf.TensorSpec([], tf.string),), autograph=False
            )
            self._traced_objects = objects
        return self._write

    def _finish_save(self, prefix: Path, step: int) -> None:
        """On the chief, commit the checkpoint at ``prefix`` and delete the ones it
        replaces; elsewhere remove the scratch copy (the commit thread; an error it
        raises is raised to the training thread by ``wait``)."""
        if self.is_chief:
            self._commit(prefix, step)
            self._sweep()
        else:
            shutil.rmtree(self._write_dir.parent, ignore_errors=True)

    def _prepare_directory(self, step: int) -> None:
        """Uncommit ``step`` (it is about to be rewritten) and clear crash leftovers."""
        self.directory.mkdir(parents=True, exist_ok=True)
        _marker_path(self.directory, step).unlink(missing_ok=True)
        self._clear_uncommitted()

    def _clear_uncommitted(self) -> None:
        """Delete the files of every checkpoint without a marker: what a save cut short
        left behind, or what a sweep cut short was deleting (it removes markers first)."""
        committed = set(committed_steps(self.directory))
        for name in os.listdir(self.directory):
            match = _CHECKPOINT_FILE.match(name)
            if match and int(match.group(1)) not in committed:
                path = self.directory / name
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)

    def _commit(self, prefix: Path, step: int) -> None:
        """Write the marker once the checkpoint's bytes are on disk (chief only)."""
        files: dict[str, Any] = {}
        for name in sorted(os.listdir(prefix.parent)):
            match = _CHECKPOINT_FILE.match(name)
            if not match or int(match.group(1)) != step or match.group(2).startswith("_temp"):
                continue
            path = prefix.parent / name
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
            files[path.name] = file_entry(path)
        write_json_atomically(
            _marker_path(self.directory, step),
            {
                "format": MARKER_FORMAT,
                "step": step,
                "written_at": time.time(),
                "prefix": prefix.name,
                "files": files,
            },
        )

    def _sweep(self) -> None:
        """Delete the committed checkpoints past the ``keep`` newest, except one every
        ``keep_every_hours`` (the oldest, then each one that much younger than the last
        one kept). Decisions depend only on older checkpoints, so a checkpoint kept for
        its age stays kept at every later sweep. The markers go first: a crash midway
        leaves uncommitted files, which the next save clears."""
        retired = committed_steps(self.directory)[self._keep :]
        spacing = None if self._keep_every_hours is None else self._keep_every_hours * 3600
        last_kept: float | None = None
        for step in reversed(retired):  # oldest first
            if spacing is not None:
                written = _written_at(self.directory, step)
                if last_kept is None or written - last_kept >= spacing:
                    last_kept = written
                    continue
            _marker_path(self.directory, step).unlink(missing_ok=True)
        self._clear_uncommitted()

    # -- restoring ----------------------------------------------------------------------
    def _try_restore(self, step: int) -> str | None:
        """Restore ``step``; the reason it cannot be trusted, or None on success.

        ``assert_existing_objects_matched`` fails when an object that already exists (a
        built layer, the step variable, the iterator) has no value in the checkpoint: a
        checkpoint of another model must not half-load. ``expect_partial`` then silences
        the warning about values not consumed yet: optimizer slots and layers built later
        are restored when they are created, which is intended, not partial.
        """
        problem = _problem(self.directory, step)
        if problem is not None:
            return problem
        prefix = self.directory / f"{CHECKPOINT_NAME}-{step}"
        try:
            status = self.checkpoint.restore(str(prefix))
            status.assert_existing_objects_matched()
            status.expect_partial()
        except tf.errors.OpError as exc:
            return f"restore failed: {exc}"
        except (AssertionError, ValueError) as exc:
            # The bytes matched the commit marker, so the checkpoint is whole: it is the
            # objects that changed (TensorFlow names the variable in its message).
            _silence_unrestored_value_notices()
            raise CheckpointMismatchError(
                f"{prefix} does not fit the experiment as it is now: {exc} The experiment "
                "was changed after this run's checkpoints were written; undo the change, or "
                "train it in a new run_dir (or checkpoint.directory)."
            ) from None
        self._last_step = step
        self._last_time = self._clock()
        return None

    def _skip(self, step: int, reason: str) -> None:
        warnings.warn(
            f"skipping checkpoint {self.directory / f'{CHECKPOINT_NAME}-{step}'}: {reason}",
            CheckpointWarning,
            stacklevel=3,
        )

    def restore_latest(self) -> int | None:
        """Restore the newest trustworthy committed checkpoint and return its step.

        A checkpoint that fails verification or restoration is skipped with a
        ``CheckpointWarning`` and the one before it is tried. A verified one that does not fit the objects raises ``CheckpointMismatchError``
        (older ones would not fit either). None means there is no committed checkpoint
        (a fresh start); when there are some but none can be restored, CheckpointError
        is raised rather than silently starting over.
        """
        self.wait()
        failures = []
        for step in committed_steps(self.directory):
            reason = self._try_restore(step)
            if reason is None:
                return step
            self._skip(step, reason)
            failures.append(f"step {step}: {reason}")
        if failures:
            raise CheckpointError(
                f"{self.directory}: no committed checkpoint can be restored ({'; '.join(failures)})"
            )
        return None

    def restore(self, step: int) -> int | None:
        """Restore the committed checkpoint of exactly ``step``; None if there is no
        usable one (an unusable one is also reported with a ``CheckpointWarning``)."""
        step = int(step)
        self.wait()
        if step not in committed_steps(self.directory):
            return None
        reason = self._try_restore(step)
        if reason is None:
            return step
        self._skip(step, reason)
        return None
