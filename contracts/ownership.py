"""Directories and files a live process owns, told apart from what a killed one left.

A process killed with SIGKILL runs no clean-up: its scratch directories stay behind,
and nothing else knows whether their owner is still at work. Ownership is therefore
recorded where the kernel keeps it honest: an exclusive ``flock`` that the owner holds
for as long as it works, and that the kernel drops the moment the owner dies (for every
process holding the open file, so a forked helper keeps it too). The owner's host and
pid are also in the scratch directory's name, so a directory created a moment ago,
before its owner could lock it, is never taken for a leftover, and another machine
sharing the filesystem never removes this machine's work.

Used for the model repository's ``.staging-*`` versions, a dataset build's
``.NAME.building-*`` directory, and the lock that lets one group of workers at a time
train in a run directory.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import shutil
import socket
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class Lock:
    """An exclusive ``flock`` on a file or directory, held until ``release``."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    def record(self, text: str) -> None:
        """Replace the locked file's contents (who holds it, for the next one to read)."""
        assert self._fd is not None, "the lock was released"
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, text.encode(), 0)

    def release(self) -> None:
        """Drop the lock (closing the descriptor does it; once only)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def try_lock(path: str | os.PathLike[str], *, create: bool = False) -> Lock | None:
    """Lock ``path`` (a directory, or a file made when ``create``); None when another
    live process holds it. The descriptor is not inherited by programs this process
    starts (Python opens files non-inheritable)."""
    flags = os.O_RDWR | os.O_CREAT if create else os.O_RDONLY
    fd = os.open(path, flags, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            return None
        raise
    return Lock(fd)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def _host() -> str:
    """This machine's name, made safe for a file name."""
    return re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "localhost"


def owned_name(prefix: str) -> str:
    """A fresh name ``<prefix><host>-<pid>-<random>`` for a directory this process owns."""
    return f"{prefix}{_host()}-{os.getpid()}-{uuid.uuid4().hex[:12]}"


def _owner_pid(name: str, prefix: str) -> int | None:
    """The pid in an owned name made on this host, else None."""
    match = re.fullmatch(rf"{re.escape(prefix)}(.+)-(\d+)-[0-9a-f]+", name)
    if match is None or match.group(1) != _host():
        return None
    return int(match.group(2))


@contextmanager
def owned_directory(parent: str | os.PathLike[str], prefix: str) -> Iterator[Path]:
    """A new directory ``parent/<prefix><host>-<pid>-<random>``, locked while in use.

    Leftovers of dead owners with the same prefix are removed first. The directory
    itself is left to the caller (renamed into place, or deleted on failure).
    """
    parent = Path(parent)
    remove_stale(parent, prefix)
    directory = parent / owned_name(prefix)
    directory.mkdir()
    lock = try_lock(directory)
    if lock is None:  # cannot happen: the name is new and this process's own
        raise RuntimeError(f"{directory} is locked by another process")
    try:
        yield directory
    finally:
        lock.release()


def remove_stale(parent: str | os.PathLike[str], prefix: str) -> list[Path]:
    """Remove ``parent``'s ``<prefix>*`` directories whose owner is dead; those removed.

    Only this host's directories are judged, and one is stale only when its owner pid
    is gone *and* nobody holds its lock: a live owner, even one whose pid was reused or
    one that has not locked its new directory yet, keeps it.
    """
    removed = []
    try:
        entries = list(os.scandir(parent))
    except FileNotFoundError:
        return removed
    for entry in entries:
        pid = _owner_pid(entry.name, prefix)
        if pid is None or _alive(pid) or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            lock = try_lock(entry.path)
        except FileNotFoundError:  # another process cleaned it first
            continue
        if lock is None:
            continue
        try:
            shutil.rmtree(entry.path, ignore_errors=True)
        finally:
            lock.release()
        removed.append(Path(entry.path))
    return removed
