"""Experiment mistakes reported as one line naming the file, line and key, before
TensorFlow loads: exit 2, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPOSITORY = Path(__file__).resolve().parents[2]

EXPERIMENT = {
    "name": "mlp",
    "data": {"dataset": "dataset"},
    "model": {"type": "mlp"},
    "training": {"steps": 10, "optimizer": {"learning_rate": 0.01}},
}


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    """The output with the console's line wrapping undone."""
    return " ".join((result.stdout + result.stderr).split())


def slipway_without_tensorflow(*args: str) -> subprocess.CompletedProcess[str]:
    """Run ``slipway ARGS`` in a fresh interpreter that fails if TensorFlow was imported."""
    probe = (
        "import sys; from slipway.cli import main\n"
        f"code = main({list(args)!r})\n"
        "assert 'tensorflow' not in sys.modules, 'TensorFlow was imported'\n"
        "sys.exit(code)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPOSITORY,
        check=False,
    )


@pytest.mark.parametrize(
    ("key", "value", "wording"),
    [
        ("learning_rate", 1e39, "finite float32"),
        ("learning_rate", float("inf"), "finite float32"),
        ("epsilon", 1e-50, "is 0 in float32"),
        ("clip_global_norm", 5e38, "finite float32"),
    ],
)
def test_values_float32_cannot_hold_are_config_errors(tmp_path, key, value, wording):
    experiment = {**EXPERIMENT, "training": {"steps": 10, "optimizer": {key: value}}}
    path = tmp_path / "experiment.yaml"
    path.write_text(yaml.safe_dump(experiment, sort_keys=False))
    line = next(
        number
        for number, text in enumerate(path.read_text().splitlines(), start=1)
        if text.strip().startswith(f"{key}:")
    )
    result = slipway_without_tensorflow("train", str(path))
    assert result.returncode == 2, result.stdout + result.stderr
    output = one_line(result)
    assert f"experiment.yaml:{line}: training.optimizer.{key}" in output
    assert wording in output
    assert "Traceback" not in output


def test_a_missing_experiment_is_reported_without_loading_tensorflow(tmp_path):
    result = slipway_without_tensorflow("train", str(tmp_path / "nowhere.yaml"))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "nowhere.yaml" in result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
