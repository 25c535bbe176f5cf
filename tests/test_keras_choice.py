"""Every Slipway process has one Keras: ``tf.keras`` is tf_keras, and Keras 3 is never loaded
on the way, unless a user chose otherwise before starting it."""

from __future__ import annotations

import os

import pytest
import tensorflow as tf
import tf_keras as keras

from tests.support.fresh_interpreter import run_python


def test_tf_keras_is_the_keras_the_project_builds_with() -> None:
    assert os.environ["TF_USE_LEGACY_KERAS"] == "1"
    assert tf.keras.Model is keras.Model
    assert isinstance(tf.keras.layers.Dense(2), keras.layers.Layer)


def loaded_after(statement: str, choice: str | None = None) -> set[str]:
    """The heavy modules a fresh interpreter holds after ``statement``, started from a shell
    that sets ``TF_USE_LEGACY_KERAS`` to ``choice`` (or leaves it unset)."""
    script = f"import sys; {statement}; print(*sorted({{'keras', 'sklearn'}} & set(sys.modules)))"
    environment = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    if choice is not None:
        environment["TF_USE_LEGACY_KERAS"] = choice
    result = run_python(script, environment=environment)
    assert result.returncode == 0, result.stderr[-3000:]
    return set(result.stdout.split())


@pytest.mark.process
def test_a_training_process_starts_without_keras_3_or_scikit_learn() -> None:
    assert loaded_after("import training.run; import tensorflow as tf; tf.keras.Model") == set()


@pytest.mark.process
def test_a_users_own_choice_of_keras_3_is_kept() -> None:
    assert "keras" in loaded_after("import training.run", choice="0")
