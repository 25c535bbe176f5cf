"""The fast tier's promise, watched while it runs: a test not marked ``process`` starts no process.

``make test`` deselects the ``process`` marker, and is fast only while nothing in it starts
a child process: a Python child imports TensorFlow for 5-10 s. A test that starts one
without the marker (directly, through a fixture, or deep inside the code under test) fails
here with the command it ran, instead of slowing the fast tier quietly.
``tests/test_test_tiers.py`` reads the same rule in the code, before anything runs.

Short-lived tools that never import TensorFlow (``git``, which provenance records ask, and
``uname``) are allowed.
"""

from __future__ import annotations

import multiprocessing.process
import os
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

PROCESS_MARKER = "process"

# Executables a fast test may run: quick, and none of them Python. (TensorFlow's first import
# asks ``uname -p`` through h5py.)
ALLOWED_EXECUTABLES = frozenset({"git", "uname"})

_watched: pytest.Item | None = None
_started: dict[str, list[str]] = {}


def _executable(args: Any) -> str:
    """The program a Popen call runs (a shell command string: its first word)."""
    first = args if isinstance(args, str | bytes | os.PathLike) else next(iter(args), "")
    words = os.fsdecode(first).split(maxsplit=1)
    return os.path.basename(words[0]) if words else ""


def _refuse(what: str) -> None:
    """Record ``what`` against the watched test and stop it from starting."""
    item = _watched
    if item is None:
        return
    _started.setdefault(item.nodeid, []).append(what)
    raise RuntimeError(
        f"{item.nodeid} starts a child process ({what}) but is not marked "
        f"@pytest.mark.{PROCESS_MARKER}: mark it, or keep the work in this process"
    )


_popen_init = subprocess.Popen.__init__
_process_start = multiprocessing.process.BaseProcess.start


def _watched_popen_init(self: subprocess.Popen, args: Any, *rest: Any, **options: Any) -> None:
    if _executable(args) not in ALLOWED_EXECUTABLES:
        _refuse(f"command {str(args)[:160]}")
    _popen_init(self, args, *rest, **options)


def _watched_process_start(self: multiprocessing.process.BaseProcess) -> None:
    _refuse(f"multiprocessing {self.name}")
    _process_start(self)


def pytest_configure(config: pytest.Config) -> None:
    """Put the watch on the two doors every child process goes through."""
    subprocess.Popen.__init__ = _watched_popen_init  # type: ignore[method-assign]
    multiprocessing.process.BaseProcess.start = _watched_process_start  # type: ignore[method-assign]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Watch a test from its first fixture to its last teardown, unless it is in the process tier."""
    global _watched
    _watched = None if item.get_closest_marker(PROCESS_MARKER) else item
    try:
        yield
    finally:
        _watched = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """Fail a watched test that tried to start a process, even if the code under test hid the error."""
    outcome = yield
    report = outcome.get_result()
    started = _started.get(item.nodeid)
    if started and report.when == "call" and not report.failed:
        report.outcome = "failed"
        report.longrepr = (
            f"started a child process outside the process tier: {started[0]}; "
            f"mark the test @pytest.mark.{PROCESS_MARKER}"
        )
