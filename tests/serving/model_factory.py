"""Tiny real models for the serving tests, built once per test process.

A tf_keras functional model with two named inputs and two named outputs is exported the
way training exports it (``save_serving_model`` + ``slipway.json``) and converted to
TFLite; tests copy these artifacts into their own repositories, so only the first test
that asks pays for building them.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
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


@functools.cache
def _workdir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="slipway-serving-models-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


@functools.cache
def keras_model() -> keras.Model:
    """``image`` float32 [-1, 8, 8, 1] and ``extra`` int64 [-1, 3] -> ``label`` [-1, 10]
    (softmax) and ``value`` [-1, 1]."""
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


@functools.cache
def _export() -> tuple[Path, dict[str, Any]]:
    directory = _workdir() / "savedmodel"
    signature = save_serving_model(keras_model(), directory)
    return directory, signature


def saved_model_dir() -> Path:
    """A plain SavedModel export (no slipway.json)."""
    return _export()[0]


def signature_json() -> dict[str, Any]:
    """The ``signature`` section slipway.json carries for the model."""
    return _export()[1]


@functools.cache
def tflite_bytes() -> bytes:
    converter = tf.lite.TFLiteConverter.from_saved_model(str(saved_model_dir()))
    return converter.convert()


def sample_inputs(batch: int = 4, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "image": rng.normal(size=(batch, 8, 8, 1)).astype(np.float32),
        "extra": rng.integers(0, 5, size=(batch, 3)).astype(np.int64),
    }


def keras_outputs(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    label, value = keras_model()(inputs, training=False)
    return {"label": label.numpy(), "value": value.numpy()}


def write_version(
    directory: Path, *, kind: str = "savedmodel", manifest: bool = True, name: str = MODEL_NAME
) -> None:
    """Fill ``directory`` with the model as ``kind`` (``savedmodel`` or ``tflite``)."""
    if kind == "savedmodel":
        shutil.copytree(saved_model_dir(), directory, dirs_exist_ok=True)
    else:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "model.tflite").write_bytes(tflite_bytes())
    if manifest:
        write_model_manifest(
            directory,
            {
                "name": name,
                "signature": signature_json(),
                "labels": {"label": {"kind": "classification", "classes": CLASSES}},
            },
        )


def publish(
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
        lambda staging: write_version(staging, kind=kind, manifest=manifest, name=name),
        version=version,
    )
    return path
