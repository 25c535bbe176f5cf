"""What every compression method hands back, so evaluation and publishing treat them alike."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import tf_keras as keras


@dataclass
class CompressedModel:
    """One compressed variant of a source model.

    ``tflite`` is always present because every method ends in a deployable flatbuffer whose
    ``serving_default`` signature keeps the source model's input and output names.
    ``keras_model`` is kept only when a SavedModel of the result is meaningful (pruned,
    clustered or float weights); post-training quantization exists only as TFLite.
    ``details`` records what the method did (sparsity per layer, quantized and float
    layers, cluster count, int8 I/O) in JSON-serialisable values.
    """

    method: str
    tflite: bytes
    keras_model: keras.Model | None = None
    details: dict[str, Any] = field(default_factory=dict)
