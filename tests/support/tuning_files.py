"""The experiment and search space files the search space and search tests share.

A tiny CNN experiment (and the MLP that replaces its model where a search only exercises
the tuner) and a search space of every parameter type, small enough for a search of two
one-epoch trials.
"""

from __future__ import annotations

from pathlib import Path

EXPERIMENT = """\
name: tiny-cnn
seed: 3
data: {dataset: data/tiny, batch_size: 16, test_split: null}
model: {type: cnn, stem_filters: 4, stages: [4], dropout: 0.1}
training:
  epochs: 3
  precision: float32
  optimizer: {learning_rate: 0.003}
export: {model_root: models}
"""

MLP = "{type: mlp, hidden_units: [16]}"

SPACE = """\
tuner: {type: random, max_trials: 2, max_epochs: 1, objective: val_label_accuracy}
parameters:
  training.optimizer.learning_rate: {type: log_uniform, min: 1.0e-3, max: 3.0e-2}
  model.dropout: {type: uniform, min: 0.0, max: 0.3}
  model.stem_filters: {type: int, min: 4, max: 8, step: 4}
  model.stages: {type: choice, values: [[4], [4, 8]]}
"""


def write(path: Path, text: str) -> Path:
    """``text`` as the file ``path``, its directory made first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path
