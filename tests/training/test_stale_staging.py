"""Staging directories a killed publisher or data build left behind are removed by the
next run; those of a run still at work never are."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from contracts.model_repository import STAGING_PREFIX, publish_version
from research.data.pipeline import build_dataset
from research.data.publish import staging_area
from research.data.spec import load_spec
from tests.support.raw_data import tabular_rows, write_tabular_dataset_inputs

pytestmark = pytest.mark.process  # each test starts a process owning a staging directory
REPOSITORY = Path(__file__).resolve().parents[2]
TIMEOUT = 60

# A process that owns a staging directory the way a publisher or build does, says where,
# and keeps it until its stdin closes (or it is killed).
OWNER = """
import sys
from contracts.ownership import owned_directory
with owned_directory(sys.argv[1], sys.argv[2]) as directory:
    (directory / "half-written").write_text("x")
    print(directory, flush=True)
    sys.stdin.read()
"""


class Owner:
    def __init__(self, parent: Path, prefix: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", OWNER, str(parent), prefix],
            cwd=REPOSITORY,
            env={**os.environ, "PYTHONPATH": str(REPOSITORY)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        line = self.process.stdout.readline().strip()
        assert line, "the owner exited before creating its directory"
        self.directory = Path(line)

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=TIMEOUT)

    def finish(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            self.process.wait(timeout=TIMEOUT)


@pytest.fixture
def owners() -> Iterator[list[Owner]]:
    started: list[Owner] = []
    yield started
    for owner in started:
        owner.finish()


def killed_and_live(owners: list[Owner], parent: Path, prefix: str) -> tuple[Path, Path]:
    killed, live = Owner(parent, prefix), Owner(parent, prefix)
    owners.extend([killed, live])
    killed.kill()
    assert killed.directory.is_dir() and live.directory.is_dir()
    return killed.directory, live.directory


def test_a_publish_removes_a_killed_publishers_staging_but_not_a_live_ones(tmp_path, owners):
    model_dir = tmp_path / "models" / "digits"
    model_dir.mkdir(parents=True)
    leftover, in_use = killed_and_live(owners, model_dir, STAGING_PREFIX)
    foreign = model_dir / f"{STAGING_PREFIX}another-host-1-0a1b2c"  # not this machine's
    foreign.mkdir()

    version, path = publish_version(
        tmp_path / "models", "digits", lambda d: (d / "saved_model.pb").write_text("m")
    )

    assert (version, path) == (1, model_dir / "1")
    assert not leftover.exists()
    assert in_use.is_dir() and (in_use / "half-written").exists()
    assert foreign.is_dir()
    assert sorted(p.name for p in model_dir.iterdir() if p.name.startswith(STAGING_PREFIX)) == (
        sorted([in_use.name, foreign.name])
    )


def test_a_dataset_build_removes_a_killed_builds_staging_but_not_a_live_ones(tmp_path, owners):
    leftover, in_use = killed_and_live(owners, tmp_path, ".dataset.building-")
    spec = write_tabular_dataset_inputs(tmp_path / "raw", "table", tabular_rows(40, seed=2))
    build_dataset(load_spec(spec), tmp_path / "dataset")
    assert (tmp_path / "dataset" / "manifest.json").is_file()
    assert not leftover.exists()
    assert in_use.is_dir()


def test_a_build_owns_its_staging_while_it_runs(tmp_path):
    with staging_area(str(tmp_path / "dataset")) as staging:
        prober = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from contracts.ownership import remove_stale; "
                "print(len(remove_stale(sys.argv[1], '.dataset.building-')))",
                str(tmp_path),
            ],
            cwd=REPOSITORY,
            env={**os.environ, "PYTHONPATH": str(REPOSITORY)},
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=True,
        )
        assert prober.stdout.strip() == "0"
        assert Path(staging).is_dir()
