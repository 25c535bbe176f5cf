"""The one way compression turns a model into a TFLite flatbuffer.

Every method converts through :func:`to_tflite`, so every ``.tflite`` file carries a
``serving_default`` signature with the source model's input and output names: a LiteRT
client calls ``get_signature_runner("serving_default")(pixels=...)`` exactly as it would
call the SavedModel, whatever was done to the weights.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf
import tf_keras as keras
from ai_edge_litert.interpreter import Interpreter

from compression.converter_log import native_output_captured, refusal
from compression.errors import CompressionError
from compression.loading import named_inputs, output_names, read_signature
from contracts.model_manifest import SIGNATURE_KEY

Representative = Callable[[], Iterable[dict[str, np.ndarray]]]


def serving_function(model: keras.Model) -> tf.types.experimental.ConcreteFunction:
    """The model as a concrete function with named inputs (free batch) and named outputs."""
    inputs = named_inputs(model)
    names = list(inputs)
    specs = [
        tf.TensorSpec([None, *tensor.shape[1:]], tensor.dtype, name=name)
        for name, tensor in inputs.items()
    ]
    outputs = output_names(model)
    structure = model.input

    @tf.autograph.experimental.do_not_convert
    def serve(*tensors: tf.Tensor) -> dict[str, tf.Tensor]:
        by_name = dict(zip(names, tensors, strict=True))
        if isinstance(structure, Mapping):
            feed: Any = by_name
        else:
            feed = tf.nest.pack_sequence_as(structure, [by_name[name] for name in names])
        result = model(feed, training=False)
        if not isinstance(result, Mapping):
            result = dict(zip(outputs, tf.nest.flatten(result), strict=True))
        return {name: result[name] for name in outputs}

    return tf.function(serve, input_signature=specs).get_concrete_function()


def _converter(model_or_saved_model: keras.Model | str | Path) -> tf.lite.TFLiteConverter:
    """A converter that writes a ``serving_default`` signature with the model's names.

    The converter only writes signatures when it can save the function with an object
    tracking its variables. Handing it the Keras model would make it save every layer's
    traced calls (most of the conversion time); a bare module holding just the variables
    gives the same signature and weights several times faster.
    """
    if not isinstance(model_or_saved_model, keras.Model):
        return tf.lite.TFLiteConverter.from_saved_model(
            str(model_or_saved_model), signature_keys=[SIGNATURE_KEY]
        )
    holder = tf.Module()
    holder.model_variables = list(model_or_saved_model.variables)
    function = serving_function(model_or_saved_model)
    return tf.lite.TFLiteConverter.from_concrete_functions([function], holder)


def to_tflite(
    model_or_saved_model: keras.Model | str | Path,
    *,
    optimizations: Iterable[tf.lite.Optimize] = (),
    representative_dataset: Representative | None = None,
    int8_io: bool = False,
    float16: bool = False,
    integer_only: bool = False,
    int16_activations: bool = False,
    float_tensors: Iterable[str] = (),
    float_ops: Iterable[str] = (),
    per_tensor: bool = False,
) -> bytes:
    """Convert a Keras model (or a SavedModel directory) to a TFLite flatbuffer.

    - ``optimizations`` alone quantizes weights (dynamic range);
    - with ``representative_dataset`` (a callable yielding ``{input name: batch}``, matched
      to the signature by name) the activations are calibrated too (full integer);
    - ``integer_only`` refuses any op without an int8 kernel instead of leaving it float;
    - ``int8_io`` makes float inputs and outputs int8 (integer id inputs stay as they are);
    - ``float16`` stores weights as float16;
    - ``int16_activations`` calibrates activations to int16 with int8 weights ("16x8"),
      falling back to float kernels for ops without a 16x8 one;
    - ``float_tensors`` (output tensor names) and ``float_ops`` (builtin op names) stay
      float in an otherwise int8 model: selective quantization through the
      quantization debugger, whose deny lists are the converter's only way to say so;
    - ``per_tensor`` quantizes each weight tensor at one scale instead of one per output
      channel (the selective path honours it too: the debugger reads the same flag).
    The flatbuffer's signature names are checked against the model's before returning.
    """
    float_tensors, float_ops = list(float_tensors), list(float_ops)
    if (float_tensors or float_ops) and representative_dataset is None:
        raise CompressionError("selective quantization needs a representative dataset")
    converter = _converter(model_or_saved_model)
    converter.optimizations = list(optimizations)
    if representative_dataset is not None:
        converter.representative_dataset = representative_dataset
    if integer_only:
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    if int16_activations:
        converter.target_spec.supported_ops = [
            tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8,
            tf.lite.OpsSet.TFLITE_BUILTINS,
        ]
    if int8_io:
        converter.inference_input_type = tf.int8
        converter.inference_output_type = tf.int8
    if float16:
        converter.target_spec.supported_types = [tf.float16]
    converter._experimental_disable_per_channel = per_tensor  # the converter's only switch
    try:
        with warnings.catch_warnings():
            # The converter calibrates int8 with TensorFlow's own deprecated interpreter;
            # its deprecation warning is addressed to TensorFlow, not to our users.
            warnings.filterwarnings("ignore", message=r"\s*Warning: tf\.lite\.Interpreter")
            with native_output_captured():
                if float_tensors or float_ops:
                    flatbuffer = _selective(converter, float_tensors, float_ops)
                else:
                    flatbuffer = converter.convert()
    except Exception as exc:  # the converter raises ConverterError, RuntimeError, ValueError...
        raise CompressionError(f"TFLite conversion failed: {refusal(str(exc))}") from None
    check_signature(flatbuffer, *_expected_names(model_or_saved_model))
    return flatbuffer


def _selective(
    converter: tf.lite.TFLiteConverter, float_tensors: list[str], float_ops: list[str]
) -> bytes:
    """Quantize all but the deny-listed tensors and ops (which get float kernels)."""
    options = tf.lite.experimental.QuantizationDebugOptions(
        denylisted_nodes=float_tensors or None, denylisted_ops=float_ops or None
    )
    # The debugger calibrates through the converter's own representative dataset; its
    # debug dataset is only read by debugger.run(), which selective conversion skips.
    debugger = tf.lite.experimental.QuantizationDebugger(
        converter=converter, debug_dataset=converter.representative_dataset, debug_options=options
    )
    return debugger.get_nondebug_quantized_model()


def _expected_names(model_or_saved_model: keras.Model | str | Path) -> tuple[list[str], list[str]]:
    if isinstance(model_or_saved_model, keras.Model):
        return list(named_inputs(model_or_saved_model)), output_names(model_or_saved_model)
    signature = read_signature(model_or_saved_model)
    return list(signature["inputs"]), list(signature["outputs"])


def signature_names(flatbuffer: bytes) -> tuple[list[str], list[str]]:
    """(input names, output names) of the flatbuffer's ``serving_default`` signature."""
    signatures = Interpreter(model_content=flatbuffer).get_signature_list()
    if SIGNATURE_KEY not in signatures:
        raise CompressionError(
            f"the TFLite model has no {SIGNATURE_KEY!r} signature (it has {sorted(signatures)})"
        )
    entry = signatures[SIGNATURE_KEY]
    return list(entry["inputs"]), list(entry["outputs"])


def check_signature(flatbuffer: bytes, inputs: list[str], outputs: list[str]) -> None:
    """Refuse a flatbuffer whose signature would make clients send or read other names."""
    got_inputs, got_outputs = signature_names(flatbuffer)
    if sorted(got_inputs) != sorted(inputs) or sorted(got_outputs) != sorted(outputs):
        raise CompressionError(
            f"the TFLite signature {sorted(got_inputs)} -> {sorted(got_outputs)} differs from "
            f"the model's {sorted(inputs)} -> {sorted(outputs)}"
        )
