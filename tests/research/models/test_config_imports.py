"""Experiment and model configs load without TensorFlow, so a bad file fails in a blink."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[3]


@pytest.mark.process  # only a fresh interpreter shows what an import loads
@pytest.mark.parametrize("module", ["research.experiments.config", "research.models"])
def test_configs_import_no_tensorflow(module: str) -> None:
    check = (
        f"import {module}, sys; "
        "assert 'tensorflow' not in sys.modules and 'tf_keras' not in sys.modules"
    )
    result = subprocess.run(
        [sys.executable, "-c", check],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPOSITORY,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
