"""Artefacts built once per test run and shared by every test and every pytest-xdist worker.

Building the digits dataset with Beam or training a source model costs seconds to minutes;
a test run builds each once. The first caller builds under a file lock, in place (artefacts
may hold their own absolute paths, such as an experiment naming its dataset), and marks the
directory complete last; a caller that finds it unmarked, after a build that failed,
builds it again. Artefacts are read-only by convention: a test that changes one works on
``private_copy``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock

COMPLETE = ".complete"


def run_directory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory this test run's artefacts live in, one for all xdist workers."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # each worker's base temp sits inside the run's own
    return base / "shared-artefacts"


def shared_artefact(
    tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], object]
) -> Path:
    """The directory ``build(directory)`` fills, built by the first caller of this run only."""
    root = run_directory(tmp_path_factory)
    root.mkdir(parents=True, exist_ok=True)
    target = root / name
    with FileLock(str(root / f"{name}.lock")):
        if not (target / COMPLETE).exists():
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir()
            build(target)
            (target / COMPLETE).touch()
    return target


def private_copy(artefact: Path, directory: Path) -> Path:
    """A copy of ``artefact`` under ``directory`` that a test may change freely."""
    copy = directory / artefact.name
    shutil.copytree(artefact, copy, ignore=shutil.ignore_patterns(COMPLETE))
    return copy
