"""Every example dataset spec and experiment parses as the README tells users to run it,
so an option renamed in the code cannot leave an example behind."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from research.data.spec import load_spec
from research.experiments import load_experiment

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("path", sorted((EXAMPLES / "data").glob("*.yaml")), ids=lambda p: p.name)
def test_dataset_spec_parses(path: Path, tmp_path: Path) -> None:
    """Beside stand-ins for its source files, which the README has users copy there."""
    spec = Path(shutil.copy(path, tmp_path / path.name))
    for source in yaml.safe_load(path.read_text())["sources"]:
        stand_in = tmp_path / source["path"]
        if stand_in.suffix:
            stand_in.touch()
        else:
            stand_in.mkdir()
    assert load_spec(spec).name


@pytest.mark.parametrize(
    "path",
    sorted(p for p in (EXAMPLES / "experiments").glob("*.yaml") if not p.stem.endswith("_space")),
    ids=lambda p: p.name,
)
def test_experiment_parses(path: Path) -> None:
    assert load_experiment(path).name
