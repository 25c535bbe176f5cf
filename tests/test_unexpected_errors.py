"""An exception nobody expected reaches the user as one line and a crash log, never as a
traceback, and with its own exit code: 1 keeps meaning "a check failed" (or, for
``slipway train``, "the worker group gave up") and 2 "the input is wrong"."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

import training.cli
from slipway.cli import EXIT_INTERNAL, main


def fails_deep_inside(args: argparse.Namespace) -> int:
    def evaluate() -> None:
        raise ValueError(
            "Can not squeeze dim[0], expected a dimension of 1, got 16\n\n  graph details..."
        )

    evaluate()
    return 0


def test_an_unexpected_error_exits_70_with_one_line_naming_its_crash_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SLIPWAY_CRASH_DIR", str(tmp_path / "crashes"))
    monkeypatch.setattr(training.cli, "run_train", fails_deep_inside)
    experiment = tmp_path / "experiment.yaml"

    assert main(["train", str(experiment)]) == EXIT_INTERNAL

    err = capsys.readouterr().err
    assert "Traceback" not in err
    (line,) = err.strip().splitlines()
    assert "unexpected ValueError: Can not squeeze dim[0]" in line
    assert "graph details" not in line
    named = re.search(r"the traceback is in (\S+)\)", line)
    assert named, line
    log = Path(named.group(1))
    assert log.parent == tmp_path / "crashes"
    text = log.read_text(encoding="utf-8")
    assert f"command: slipway train {experiment}" in text
    assert "Traceback (most recent call last)" in text
    assert "in evaluate" in text and "graph details" in text


def test_every_crash_gets_its_own_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SLIPWAY_CRASH_DIR", str(tmp_path))
    monkeypatch.setattr(training.cli, "run_train", fails_deep_inside)
    for _ in range(2):
        assert main(["train", "x.yaml"]) == EXIT_INTERNAL
    assert len(list(tmp_path.glob("*.log"))) == 2
