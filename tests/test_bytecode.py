"""The install-time compile covers every module of the project's packages."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from slipway import PACKAGES, bytecode
from slipway.bytecode import project_modules

ROOT = Path(__file__).resolve().parents[1]


def test_every_module_of_every_package_is_imported() -> None:
    on_disk = {
        ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
    }
    assert set(project_modules()) == on_disk


def test_nothing_is_imported_while_bytecode_writing_is_off(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.setattr(bytecode, "project_modules", lambda: pytest.fail("imported"))
    assert bytecode.main() == 1
    assert "bytecode writing is off" in capsys.readouterr().err
