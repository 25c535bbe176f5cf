"""The tiny real model the serving and ops tests serve, built once per test run.

A tf_keras functional model with two named inputs and two named outputs is exported the
way training exports it (``save_serving_model`` + ``slipway.json``) and converted to
TFLite. Exporting and converting cost seconds, so the ``serving_model`` fixture builds
them once per run as a shared artefact (every pytest-xdist worker reads the same
directory) and tests copy them into their own repositories. The artefact keeps the
model's weights too, so a test compares what a gateway answers with what Keras computes
from the very same weights.
"""

from __future__ import annotations

import functools
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf
import tf_keras as keras

from contracts.model_manifest import write_model_manifest
from contracts.model_repository import publish_version
from training.export import save_serving_model

MODEL_NAME = "digits"
CLASSES = [str(i) for i in range(10)]

SAVED_MODEL = "savedmodel"
TFLITE = "model.tflite"
WEIGHTS = "weights.npz"
SIGNATURE = "signature.json"


def keras_model() -> keras.Model:
    """``image`` float32 [-1, 8, 8, 1] and ``extra`` int64 [-1, 3] -> ``label`` [-1, 10]
    (softmax) and ``value`` [-1, 1], freshly initialised from seed 0."""
    keras.utils.set_random_seed(0)
    image = keras.Input((8, 8, 1), name="image")
    extra = keras.Input((3,), name="extra", dtype="int64")
    features = keras.layers.Concatenate()(
        [
            keras.layers.Flatten()(image),
            keras.layers.Lambda(lambda t: tf.cast(t, "float32"))(extra),
        ]
    )
    hidden = keras.layers.Dense(16, activation="relu")(features)
    label = keras.layers.Dense(10, activation="softmax", name="label")(hidden)
    value = keras.layers.Dense(1, name="value")(hidden)
    return keras.Model([image, extra], [label, value])


def build(directory: Path) -> None:
    """Fill an artefact directory: the SavedModel export, its TFLite conversion, the
    signature slipway.json carries and the weights, for ``ServingModel`` to read."""
    model = keras_model()
    signature = save_serving_model(model, directory / SAVED_MODEL)
    (directory / SIGNATURE).write_text(json.dumps(signature), encoding="utf-8")
    np.savez(directory / WEIGHTS, *model.get_weights())
    converter = tf.lite.TFLiteConverter.from_saved_model(str(directory / SAVED_MODEL))
    (directory / TFLITE).write_bytes(converter.convert())


def sample_inputs(batch: int = 4, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs the model accepts: ``batch`` rows drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    return {
        "image": rng.normal(size=(batch, 8, 8, 1)).astype(np.float32),
        "extra": rng.integers(0, 5, size=(batch, 3)).astype(np.int64),
    }


def sample_instances(rows: int = 1, seed: int = 0) -> dict[str, Any]:
    """A REST predict body of ``rows`` sample inputs in the row (``instances``) format."""
    inputs = sample_inputs(rows, seed)
    return {"instances": [{n: a[i].tolist() for n, a in inputs.items()} for i in range(rows)]}


@functools.cache
def _trained(directory: Path) -> keras.Model:
    """The Keras model holding the artefact's weights, made once per test process."""
    model = keras_model()
    with np.load(directory / WEIGHTS) as weights:
        model.set_weights([weights[f"arr_{index}"] for index in range(len(weights.files))])
    return model


@dataclass(frozen=True)
class ServingModel:
    """The built artefact, and the ways tests put it into a model repository."""

    directory: Path

    @property
    def saved_model_dir(self) -> Path:
        """A plain SavedModel export (no slipway.json); read-only."""
        return self.directory / SAVED_MODEL

    def signature_json(self) -> dict[str, Any]:
        """The ``signature`` section slipway.json carries for the model."""
        return json.loads((self.directory / SIGNATURE).read_text(encoding="utf-8"))

    def tflite_bytes(self) -> bytes:
        return (self.directory / TFLITE).read_bytes()

    def keras_outputs(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """What Keras computes for ``inputs`` with the exported weights."""
        label, value = _trained(self.directory)(inputs, training=False)
        return {"label": label.numpy(), "value": value.numpy()}

    def write_version(
        self,
        directory: Path,
        *,
        kind: str = "savedmodel",
        manifest: bool = True,
        name: str = MODEL_NAME,
    ) -> None:
        """Fill ``directory`` with the model as ``kind`` (``savedmodel`` or ``tflite``)."""
        if kind == "savedmodel":
            shutil.copytree(self.saved_model_dir, directory, dirs_exist_ok=True)
        else:
            directory.mkdir(parents=True, exist_ok=True)
            (directory / "model.tflite").write_bytes(self.tflite_bytes())
        if manifest:
            write_model_manifest(
                directory,
                {
                    "name": name,
                    "signature": self.signature_json(),
                    "labels": {"label": {"kind": "classification", "classes": CLASSES}},
                },
            )

    def publish(
        self,
        root: Path,
        version: int,
        *,
        kind: str = "savedmodel",
        manifest: bool = True,
        name: str = MODEL_NAME,
    ) -> Path:
        """Publish the model as ``root/name/version``, renamed into place as training does."""
        _, path = publish_version(
            root,
            name,
            lambda staging: self.write_version(staging, kind=kind, manifest=manifest, name=name),
            version=version,
        )
        return path
