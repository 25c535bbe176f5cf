"""``examples/research/custom_model.py`` runs as a user runs it, end to end.

It builds the digits dataset, trains its subclassed model through the Task API, kills
the training process with SIGKILL after a checkpoint, resumes, publishes, serves with
the gateway and predicts over gRPC. Then ``slipway train`` on the example's YAML, which
names the same model function, builds the same architecture: it restores the finished
run's checkpoint and publishes it as the next version.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[2]
EXAMPLE = REPOSITORY / "examples" / "research"
TIMEOUT_S = 600
# The example's YAML reaches its data through ../../out/custom-model, from its directory.
YAML_HOME = Path("examples", "research")
WORKDIR = Path("out", "custom-model")

pytestmark = [pytest.mark.process, pytest.mark.timeout(2 * TIMEOUT_S + 60)]


def _run(command: list[str], cwd: Path) -> str:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    result = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False
    )
    assert result.returncode == 0, f"{command}\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    return result.stdout


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("custom-model-example")


@pytest.fixture(scope="module")
def printed(root: Path) -> str:
    script = EXAMPLE / "custom_model.py"
    return _run([sys.executable, str(script), "--workdir", str(root / WORKDIR)], cwd=root)


def _match(pattern: str, text: str) -> re.Match[str]:
    found = re.search(pattern, text)
    assert found, f"no line matching {pattern!r} in:\n{text}"
    return found


def test_training_is_killed_and_resumed_to_the_final_step(printed: str, root: Path) -> None:
    killed = int(_match(r"SIGKILL\); its last committed checkpoint: step (\d+)", printed)[1])
    resumed = _match(r"resumed from step (\d+) and finished at step (\d+) of (\d+)", printed)
    start, final, total = (int(value) for value in resumed.groups())
    assert 0 < killed == start < final == total
    assert (root / WORKDIR / "killed-run.log").is_file()


def test_the_model_is_published_and_served(printed: str, root: Path) -> None:
    published = _match(r"the model repository holds version (\d+) of the model: (\S+)", printed)
    assert published[1] == "1"
    version = Path(published[2])
    assert version == root / WORKDIR / "models" / "digits-custom" / "1"
    signature = json.loads((version / "slipway.json").read_text())["signature"]
    assert list(signature["inputs"]) == ["image"]
    assert list(signature["outputs"]) == ["label", "label_classes"]
    served = _match(
        r"gRPC Predict digits-custom version 1: predicted \[([\d, ]+)\], true \[([\d, ]+)\]",
        printed,
    )
    predicted, true = ([int(v) for v in group.split(",")] for group in served.groups())
    assert len(predicted) == len(true) == 8
    assert sum(p == t for p, t in zip(predicted, true, strict=True)) >= 6


def test_slipway_train_builds_the_same_model_from_the_yaml(printed: str, root: Path) -> None:
    home = root / YAML_HOME
    home.mkdir(parents=True)
    for name in ("custom_model.yaml", "custom_model.py"):
        shutil.copy(EXAMPLE / name, home / name)
    output = _run([sys.executable, "-m", "slipway", "train", str(home / "custom_model.yaml")], root)
    assert re.search(r"published version 2: ", output), output
    assert (root / WORKDIR / "models" / "digits-custom" / "2" / "slipway.json").is_file()
