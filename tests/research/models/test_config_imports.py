"""Experiment and model configs load without TensorFlow, so a bad file fails in a blink."""

from __future__ import annotations

import pytest

from tests.support.fresh_interpreter import run_python


@pytest.mark.process  # only a fresh interpreter shows what an import loads
@pytest.mark.parametrize("module", ["research.experiments.config", "research.models"])
def test_configs_import_no_tensorflow(module: str) -> None:
    check = (
        f"import {module}, sys; "
        "assert 'tensorflow' not in sys.modules and 'tf_keras' not in sys.modules"
    )
    result = run_python(check, timeout=60)
    assert result.returncode == 0, result.stderr[-3000:]
