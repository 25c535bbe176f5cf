"""A model trained under a mixed-precision policy is compressed from its float32 twin."""

from __future__ import annotations

import numpy as np
import tf_keras as keras

from compression import ptq
from compression.loading import load_version
from contracts.model_manifest import write_model_manifest
from training.export import save_serving_model


def test_a_bfloat16_trained_model_loads_as_float32_and_converts(tmp_path):
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        inputs = keras.Input((8, 8, 1), name="image")
        x = keras.layers.Conv2D(4, 3, name="conv")(inputs)
        x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
        x = keras.layers.Dense(3, name="dense")(x)
        outputs = keras.layers.Activation("softmax", dtype="float32", name="label")(x)
        model = keras.Model(inputs, {"label": outputs})
    finally:
        keras.mixed_precision.set_global_policy("float32")
    version = tmp_path / "digits" / "1"
    signature = save_serving_model(model, version)
    write_model_manifest(version, {"name": "digits", "signature": signature})

    loaded = load_version(version).model

    assert {layer.dtype_policy.name for layer in loaded.layers} == {"float32"}
    images = np.random.default_rng(0).random((4, 8, 8, 1), dtype=np.float32)
    np.testing.assert_allclose(
        loaded(images)["label"].numpy(), model(images)["label"].numpy(), atol=2e-2
    )
    assert ptq.dynamic_range(loaded).tflite  # bfloat16 compute would not convert
