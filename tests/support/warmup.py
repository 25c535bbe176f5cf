"""TensorFlow Serving's ``half_plus_two`` model and a backend that records what it runs.

Warm-up and the REST fidelity tests need a model that parses serialized ``tf.Example``
inputs in its graph, as TF Serving's own test model does, and a way to see which batches
warm-up sent to a backend.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf
from tensorflow.core.example.example_pb2 import Example

from serving.backends import Backend


def write_half_plus_two(directory: Path) -> None:
    """TF Serving's half_plus_two layout: serialized tf.Examples parsed in the graph with
    a required feature ``x``; ``y = 0.5 * x + 2``. Classify/regress signatures included."""

    spec = {"x": tf.io.FixedLenFeature([1], tf.float32)}

    class HalfPlusTwo(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
        def regress(self, serialized: tf.Tensor) -> dict[str, tf.Tensor]:
            x = tf.io.parse_example(serialized, spec)["x"]
            return {"outputs": 0.5 * x + 2.0}

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
        def classify(self, serialized: tf.Tensor) -> dict[str, tf.Tensor]:
            x = tf.io.parse_example(serialized, spec)["x"]
            return {"scores": tf.concat([x, 0.5 * x + 2.0], axis=1)}

    module = HalfPlusTwo()
    tf.saved_model.save(
        module,
        str(directory),
        signatures={
            "serving_default": module.regress,
            "regress_x_to_y": module.regress,
            "classify_x_to_y": module.classify,
        },
    )


def example(x: float) -> Example:
    """The ``tf.Example`` half_plus_two reads: one float feature ``x``."""
    parsed = Example()
    parsed.features.feature["x"].float_list.value.append(x)
    return parsed


class Recording:
    """Wraps a backend and records the batches it runs."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.signatures = backend.signatures
        self.calls: list[tuple[str, dict[str, np.ndarray]]] = []

    def run(self, name: str, inputs: dict, timeout: float | None = None) -> dict:
        self.calls.append((name, inputs))
        return self.backend.run(name, inputs, timeout)

    def close(self) -> None:
        self.backend.close()
