"""Post-training quantization: smaller TFLite models without any retraining.

Three levels, each a trade of accuracy for size and speed: dynamic range (int8 weights,
float activations), float16 weights, and full integer (int8 weights and activations,
calibrated on samples of the *training* split so the test split stays unseen). A float32
conversion of the untouched model is the baseline every level is compared with.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf
import tf_keras as keras
from ai_edge_litert.interpreter import Interpreter

from compression.convert import to_tflite
from compression.errors import CompressionError
from compression.finetune import check_inputs, open_dataset, sequence_length
from compression.loading import named_inputs
from compression.result import CompressedModel
from contracts.model_manifest import SIGNATURE_KEY
from research.data.input_pipeline import make_dataset

DEFAULT_SAMPLES = 200


def io_types(flatbuffer: bytes) -> dict[str, dict[str, str]]:
    """``{"inputs": {name: dtype}, "outputs": {name: dtype}}`` of the serving signature.

    Recorded so a client (and the evaluation) knows which tensors it must quantize.
    """
    runner = Interpreter(model_content=flatbuffer).get_signature_runner(SIGNATURE_KEY)
    return {
        "inputs": {n: np.dtype(d["dtype"]).name for n, d in runner.get_input_details().items()},
        "outputs": {n: np.dtype(d["dtype"]).name for n, d in runner.get_output_details().items()},
    }


def float32(model: keras.Model) -> CompressedModel:
    """The unquantized TFLite conversion: the baseline, and the source SavedModel as is."""
    return CompressedModel("float32", to_tflite(model), model, {})


def dynamic_range(model: keras.Model) -> CompressedModel:
    """int8 weights, float activations (quantized on the fly): no data needed."""
    flatbuffer = to_tflite(model, optimizations=[tf.lite.Optimize.DEFAULT])
    return CompressedModel("dynamic_range", flatbuffer, None, {"weights": "int8"})


def float16(model: keras.Model) -> CompressedModel:
    """float16 weights: half the size, float accuracy, fast on GPUs that compute in fp16."""
    flatbuffer = to_tflite(model, optimizations=[tf.lite.Optimize.DEFAULT], float16=True)
    return CompressedModel("float16", flatbuffer, None, {"weights": "float16"})


def full_integer(
    model: keras.Model,
    representative: Iterable[dict[str, np.ndarray]],
    *,
    int8_io: bool = False,
) -> CompressedModel:
    """int8 weights and activations, with ranges calibrated on ``representative`` samples.

    Every op must have an int8 kernel (a model that needs a float op is an error naming
    the conversion problem, rather than a silently mixed model). With ``int8_io`` the
    float inputs and outputs become int8 too, for integer-only accelerators; integer id
    inputs (token ids) are left as they are.
    """
    samples = list(representative)
    check_samples(model, samples)
    flatbuffer = to_tflite(
        model,
        optimizations=[tf.lite.Optimize.DEFAULT],
        representative_dataset=lambda: iter(samples),
        int8_io=int8_io,
        integer_only=True,
    )
    details: dict[str, Any] = {
        "weights": "int8",
        "activations": "int8",
        "int8_io": int8_io,
        "calibration_samples": len(samples),
        **io_types(flatbuffer),
    }
    return CompressedModel("int8_io" if int8_io else "int8", flatbuffer, None, details)


def check_samples(model: keras.Model, samples: Sequence[dict[str, np.ndarray]]) -> None:
    """Calibration needs samples, each keyed exactly by the model's input names."""
    if not samples:
        raise CompressionError("integer quantization needs representative samples")
    expected = set(named_inputs(model))
    for index, sample in enumerate(samples):
        if set(sample) != expected:
            raise CompressionError(
                f"representative sample {index} has inputs {sorted(sample)}, "
                f"the model reads {sorted(expected)}"
            )


def representative_dataset(
    dataset_dir: str | Path,
    model: keras.Model,
    *,
    num_samples: int = DEFAULT_SAMPLES,
    split: str = "train",
    seed: int = 0,
) -> list[dict[str, np.ndarray]]:
    """``num_samples`` single examples of ``split``, keyed and typed as ``model`` reads them.

    Drawn from the training split by default: calibrating on the test split would leak
    it into the model. Shuffled with a fixed seed, so calibration is repeatable.
    """
    if num_samples < 1:
        raise CompressionError(f"num_samples must be >= 1, got {num_samples}")
    manifest = open_dataset(dataset_dir, split)
    inputs = named_inputs(model)
    check_inputs(manifest, inputs, dataset_dir)
    dataset = make_dataset(
        dataset_dir,
        split,
        batch_size=1,
        shuffle=True,
        seed=seed,
        features=list(inputs),
        sequence_length=sequence_length(inputs),
    )
    dtypes = {name: tf.as_dtype(tensor.dtype).as_numpy_dtype for name, tensor in inputs.items()}
    samples = []
    for element in dataset.take(num_samples).as_numpy_iterator():
        features = element[0] if isinstance(element, tuple) else element
        samples.append({name: features[name].astype(dtypes[name]) for name in inputs})
    return samples
