"""A researcher's own script: ``train(task, workers=2)`` with a model of its own."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tests.support.experiments import write_experiment
from training.checkpoints import latest_committed_step

pytestmark = pytest.mark.process

SCRIPT = '''\
"""Train an experiment with this script's own model, on two local workers."""
import sys

import tf_keras as keras

from research.experiments import load_experiment
from research.experiments.task import ExperimentTask
from training.run import train


def build(inputs, heads):
    pixels = keras.Input(inputs["pixels"].shape, name="pixels")
    hidden = keras.layers.Dense(32, activation="relu")(pixels)
    label = keras.layers.Dense(heads["label"].num_classes, activation="softmax", name="label")
    return keras.Model({"pixels": pixels}, {"label": label(hidden)})


if __name__ == "__main__":
    task = ExperimentTask(load_experiment(sys.argv[1]), model_fn=build)
    outcome = train(task, workers=2, progress=False)
    print(f"launcher: exit {outcome.exit_code} at step {outcome.step}")
    sys.exit(outcome.exit_code)
'''
DIGEST = re.compile(r"weights sha256 ([0-9a-f]{64})")


def test_a_script_trains_its_own_model_on_two_workers(tmp_path, digits_dataset):
    experiment = write_experiment(tmp_path, digits_dataset, model=None, training__steps=20)
    script = tmp_path / "train_digits.py"
    script.write_text(SCRIPT)

    done = subprocess.run(
        [sys.executable, str(script), str(experiment)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # The code after train() ran once, in the launching process; the workers exited in it.
    assert done.stdout.count("launcher: exit 0 at step 20") == 1
    assert latest_committed_step(tmp_path / "run" / "checkpoints") == 20
    logs = [(tmp_path / "run" / "workers" / f"worker-{i}.log").read_text() for i in (0, 1)]
    assert all("trained 20 steps" in log and "launcher:" not in log for log in logs)
    assert DIGEST.findall(logs[0]) == DIGEST.findall(logs[1])  # one model, two replicas
    assert "published version 1" in logs[0] and "published version" not in logs[1]
    manifest = json.loads((tmp_path / "models" / "mlp" / "1" / "slipway.json").read_text())
    assert manifest["provenance"]["model_fn"] == "__main__:build"
    assert list(manifest["signature"]["outputs"]) == ["label", "label_classes"]
