"""Quantization-aware training: fine-tune with int8 rounding simulated, then convert.

tfmot inserts fake-quantization around the layers its 8-bit registry supports, so the
weights learn to live with int8 before the converter makes them int8 for real. Layers it
cannot quantize (the zoo's attention, layer norms and embeddings over integer token ids)
are not annotated and stay float; they are listed by name, as are the quantized ones,
so the report says exactly how much of the model runs in int8.

When the source weights are pruned, their zeros are kept through quantization-aware
training (``preserve_sparsity``: tfmot's prune-preserving scheme where it applies, and
the pruning masks re-applied after every step), which is how pruning and quantization
combine into one small, sparse int8 model.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import tensorflow as tf
import tensorflow_model_optimization as tfmot
import tf_keras as keras

from compression.convert import to_tflite
from compression.errors import CompressionError
from compression.finetune import (
    DEFAULT_EPOCHS,
    DEFAULT_LEARNING_RATE,
    TrainingData,
    copy_model,
    fine_tune,
    infer_heads,
)
from compression.pruning import Schedule, prune_weights, zero_fraction
from compression.ptq import io_types
from compression.result import CompressedModel
from research.models import HeadSpec

quantize = tfmot.quantization.keras


DEFAULT_SCHEME = quantize.default_8bit.Default8BitQuantizeScheme
PRUNE_PRESERVE_SCHEME = tfmot.experimental.combine.Default8BitPrunePreserveQuantizeScheme


def _reads_integers(layer: keras.layers.Layer) -> bool:
    """True when ``layer`` consumes integer tensors (also through keyword arguments, as
    mean pooling takes its token ids): fake-quantization has nothing to round there."""
    return any(
        not tf.as_dtype(tensor.dtype).is_floating
        for node in layer.inbound_nodes
        for tensor in node.keras_inputs
    )


_FOLDS_BATCH_NORM = (keras.layers.Conv2D, keras.layers.DepthwiseConv2D, keras.layers.Dense)


def _folds_into(layer: keras.layers.Layer, annotated: Sequence[str]) -> bool:
    """A batch norm right after an annotated Conv2D/Dense, which tfmot's transforms fold."""
    if not isinstance(layer, keras.layers.BatchNormalization) or len(layer.inbound_nodes) != 1:
        return False
    producers = tf.nest.flatten(layer.inbound_nodes[0].inbound_layers)
    return (
        len(producers) == 1
        and isinstance(producers[0], _FOLDS_BATCH_NORM)
        and producers[0].name in annotated
    )


def annotate_supported(model: keras.Model) -> tuple[keras.Model, list[str], list[str]]:
    """(model with every quantizable layer annotated, quantized names, float names).

    Annotating every layer is what ``quantize_model`` does; annotating only the layers
    tfmot supports is the documented way to quantize part of a model, and gives the
    same model when all are supported. Supported means: in the 8-bit registry, or a
    batch norm its transforms fold into the preceding convolution; and never a layer
    reading integer ids, where fake-quantization has nothing to round.
    """
    registry = DEFAULT_SCHEME().get_quantize_registry()
    quantized: list[str] = []
    floating: list[str] = []

    def annotate(layer: keras.layers.Layer) -> keras.layers.Layer:
        if not _reads_integers(layer) and (
            registry.supports(layer) or _folds_into(layer, quantized)
        ):
            quantized.append(layer.name)
            return quantize.quantize_annotate_layer(layer)
        floating.append(layer.name)
        return layer

    annotated = keras.models.clone_model(model, clone_function=annotate)
    return annotated, quantized, floating


class KeepZeros(keras.callbacks.Callback):
    """Put the pruned zeros back after every training step.

    The prune-preserving scheme masks only the weights it fake-quantizes, and tfmot
    leaves the kernel of a Dense or Conv2D followed by a ReLU layer out of
    fake-quantization (tensorflow/model-optimization#523); the default scheme masks
    nothing. Re-applying each weight's initial zero mask keeps every pruned weight at
    zero whichever scheme trains.
    """

    def __init__(self, weights: Iterable[tf.Variable]) -> None:
        super().__init__()
        self._masks = [
            (weight, tf.cast(tf.not_equal(weight, 0), weight.dtype))
            for weight in weights
            if weight.shape.rank >= 2 and not bool(tf.reduce_all(tf.not_equal(weight, 0)))
        ]

    def on_train_batch_end(self, batch: int, logs: Mapping[str, Any] | None = None) -> None:
        for weight, mask in self._masks:
            weight.assign(weight * mask)


def _sparsity_by_weight_name(
    model: keras.Model, weight_names: Mapping[str, Sequence[str]]
) -> dict[str, float]:
    """Zeros per layer in the model's variables of the given names (kept through cloning)."""
    variables = {weight.name: weight for weight in model.weights}
    missing = [name for names in weight_names.values() for name in names if name not in variables]
    if missing:
        raise CompressionError(f"weights {missing} are not in the quantization-aware model")
    return {
        layer: zero_fraction([variables[name].numpy() for name in names])
        for layer, names in weight_names.items()
    }


def _train_aware(
    model: keras.Model,
    train: TrainingData,
    validation: TrainingData | None,
    heads: Mapping[str, HeadSpec] | None,
    *,
    epochs: int,
    learning_rate: float,
    preserve_sparsity: bool,
    seed: int,
    verbose: int,
) -> tuple[keras.Model, bytes, dict[str, Any]]:
    """(trained quantization-aware model, its int8 TFLite, details)."""
    heads = dict(heads) if heads is not None else infer_heads(model)
    keras.utils.set_random_seed(seed)
    # A fresh copy: layers of a model that was itself cloned (a stripped, pruned model)
    # also belong to earlier graphs, which would blur which layer feeds which.
    annotated, quantized, floating = annotate_supported(copy_model(model))
    if not quantized:
        raise CompressionError(
            f"{model.name}: tfmot's 8-bit scheme supports none of its layers ({floating})"
        )
    # The prune-preserving scheme only applies to a model quantized throughout: its
    # registry claims every weightless layer (the zoo's pooling) and then asks the 8-bit
    # registry for a config that layer does not have. KeepZeros keeps the zeros anyway.
    preserving = preserve_sparsity and not floating
    scheme = PRUNE_PRESERVE_SCHEME() if preserving else DEFAULT_SCHEME()
    try:
        with quantize.quantize_scope():
            aware = quantize.quantize_apply(annotated, scheme)
    except (ValueError, RuntimeError) as exc:
        raise CompressionError(f"{model.name}: quantization-aware model failed: {exc}") from None
    callbacks = [KeepZeros(aware.trainable_weights)] if preserve_sparsity else []
    history = fine_tune(
        aware,
        train,
        heads,
        epochs=epochs,
        learning_rate=learning_rate,
        seed=seed,
        callbacks=callbacks,
        validation=validation,
        verbose=verbose,
    )
    flatbuffer = to_tflite(aware, optimizations=[tf.lite.Optimize.DEFAULT])
    details: dict[str, Any] = {
        "quantized_layers": quantized,
        "float_layers": floating,
        "scheme": "prune_preserve" if preserving else "default_8bit",
        "history": history,
        **io_types(flatbuffer),
    }
    return aware, flatbuffer, details


def quantize_aware(
    model: keras.Model,
    train: TrainingData,
    validation: TrainingData | None = None,
    *,
    heads: Mapping[str, HeadSpec] | None = None,
    epochs: int = DEFAULT_EPOCHS,
    learning_rate: float = DEFAULT_LEARNING_RATE,
    preserve_sparsity: bool = False,
    seed: int = 0,
    verbose: int = 0,
) -> CompressedModel:
    """Quantization-aware fine-tuning of a copy of ``model``, converted to int8 TFLite.

    ``details`` lists ``quantized_layers`` and ``float_layers`` by name (the source
    model's layer names) and the fine-tuning ``history``. There is no Keras result: the
    fake-quantized model only means something once converted.
    """
    _, flatbuffer, details = _train_aware(
        model,
        train,
        validation,
        heads,
        epochs=epochs,
        learning_rate=learning_rate,
        preserve_sparsity=preserve_sparsity,
        seed=seed,
        verbose=verbose,
    )
    return CompressedModel("qat", flatbuffer, None, details)


def prune_quantize_aware(
    model: keras.Model,
    train: TrainingData,
    validation: TrainingData | None = None,
    *,
    heads: Mapping[str, HeadSpec] | None = None,
    target_sparsity: float = 0.5,
    schedule: Schedule = "polynomial",
    epochs: int = DEFAULT_EPOCHS,
    learning_rate: float = DEFAULT_LEARNING_RATE,
    seed: int = 0,
    verbose: int = 0,
) -> CompressedModel:
    """Prune, then quantization-aware train with the zeros kept: one sparse int8 model.

    ``details`` has the pruning report (``sparsity`` measured after pruning), the QAT
    layer lists, the ``scheme`` used, and ``sparsity_after_qat`` measured on the
    quantization-aware weights, which shows the zeros were kept.
    """
    pruned, prune_details = prune_weights(
        model,
        train,
        validation,
        heads=heads,
        target_sparsity=target_sparsity,
        schedule=schedule,
        epochs=epochs,
        learning_rate=learning_rate,
        seed=seed,
        verbose=verbose,
    )
    pruned_weights = {
        name: [w.name for w in pruned.get_layer(name).get_prunable_weights()]
        for name in prune_details["sparsity"]
    }
    aware, flatbuffer, aware_details = _train_aware(
        pruned,
        train,
        validation,
        heads,
        epochs=epochs,
        learning_rate=learning_rate,
        preserve_sparsity=True,
        seed=seed,
        verbose=verbose,
    )
    details = {
        **{key: value for key, value in prune_details.items() if key != "history"},
        **{key: value for key, value in aware_details.items() if key != "history"},
        "sparsity_after_qat": _sparsity_by_weight_name(aware, pruned_weights),
        "history": {"prune": prune_details["history"], "qat": aware_details["history"]},
    }
    return CompressedModel("prune+qat", flatbuffer, None, details)
