"""Magnitude pruning with tfmot: zero the smallest weights while fine-tuning.

Every layer tfmot knows how to prune is wrapped (others are left dense and listed), the
sparsity ramps up over the fine-tuning steps (polynomial) or is imposed at once
(constant), and the wrappers are stripped so the result is the source architecture with
sparse weights. What is reported is *measured*: the fraction of exact zeros in each
pruned layer's stripped weights, not the schedule's promise.

``structured_2_4`` prunes two of every four consecutive weights along the input
dimension (the pattern sparse kernels such as XNNPack's and NVIDIA's 2:4 use), so only
Dense and Conv2D kernels whose input width is a multiple of four are pruned.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import tensorflow as tf
import tensorflow_model_optimization as tfmot
import tf_keras as keras
from ai_edge_litert.interpreter import Interpreter

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
from compression.result import CompressedModel
from research.models import HeadSpec

Schedule = Literal["polynomial", "constant"]
SCHEDULES: tuple[str, ...] = ("polynomial", "constant")
M_BY_N = (2, 4)


def zero_fraction(weights: Sequence[np.ndarray]) -> float:
    """Fraction of exact zeros over all elements of ``weights``."""
    total = sum(int(np.size(w)) for w in weights)
    zeros = sum(int(np.size(w) - np.count_nonzero(w)) for w in weights)
    return zeros / total if total else 0.0


def _fits_m_by_n(layer: keras.layers.Layer, weights: Sequence[Any]) -> str | None:
    """Why ``layer`` cannot take the 2:4 pattern, or None when it can."""
    if not isinstance(layer, (keras.layers.Dense, keras.layers.Conv2D)) or isinstance(
        layer, keras.layers.DepthwiseConv2D
    ):
        return "2:4 sparsity applies to Dense and Conv2D kernels only"
    for weight in weights:
        if weight.shape.rank not in (2, 4) or weight.shape[-2] % M_BY_N[1]:
            return f"input width {weight.shape[-2]} is not a multiple of {M_BY_N[1]}"
    return None


def _schedule(kind: str, target: float, total_steps: int) -> tfmot.sparsity.keras.PruningSchedule:
    """A schedule that reaches ``target`` within the fine-tuning steps.

    The mask is recomputed about twenty times; the polynomial ramp ends two thirds of the
    way through, leaving the last third to recover accuracy at the final sparsity.
    """
    frequency = max(1, total_steps // 20)
    if kind == "constant":
        return tfmot.sparsity.keras.ConstantSparsity(target, begin_step=0, frequency=frequency)
    end_step = max(frequency, (total_steps * 2 // 3) // frequency * frequency)
    return tfmot.sparsity.keras.PolynomialDecay(
        initial_sparsity=0.0,
        final_sparsity=target,
        begin_step=0,
        end_step=end_step,
        frequency=frequency,
    )


def _wrap(
    model: keras.Model, params: dict[str, Any], structured: bool
) -> tuple[keras.Model, list[str], dict[str, str]]:
    """(model with pruning wrappers, pruned layer names, {left dense: why})."""
    pruned: list[str] = []
    unpruned: dict[str, str] = {}

    def wrap(layer: keras.layers.Layer) -> keras.layers.Layer:
        if isinstance(layer, keras.Model):
            unpruned[layer.name] = "nested models are not pruned"
            return layer
        try:
            wrapper = tfmot.sparsity.keras.prune_low_magnitude(layer, **params)
        except ValueError:
            if layer.weights:
                unpruned[layer.name] = f"tfmot cannot prune {type(layer).__name__}"
            return layer
        weights = wrapper.layer.get_prunable_weights()
        if not weights:
            return layer
        reason = _fits_m_by_n(layer, weights) if structured else None
        if reason is not None:
            unpruned[layer.name] = reason
            return layer
        pruned.append(layer.name)
        return wrapper

    wrapped = keras.models.clone_model(model, clone_function=wrap)
    return wrapped, pruned, unpruned


def layer_sparsity(model: keras.Model, layer_names: Sequence[str]) -> dict[str, float]:
    """Measured fraction of zeros in each named layer's prunable weights."""
    sparsity = {}
    for name in layer_names:
        layer = model.get_layer(name)
        sparsity[name] = zero_fraction([w.numpy() for w in layer.get_prunable_weights()])
    return sparsity


def overall_sparsity(model: keras.Model, layer_names: Sequence[str]) -> float:
    """Fraction of zeros over all prunable weights of the named layers together."""
    return zero_fraction(
        [w.numpy() for name in layer_names for w in model.get_layer(name).get_prunable_weights()]
    )


def prune_weights(
    model: keras.Model,
    train: TrainingData,
    validation: TrainingData | None = None,
    *,
    heads: Mapping[str, HeadSpec] | None = None,
    target_sparsity: float = 0.5,
    schedule: Schedule = "polynomial",
    structured_2_4: bool = False,
    epochs: int = DEFAULT_EPOCHS,
    learning_rate: float = DEFAULT_LEARNING_RATE,
    seed: int = 0,
    verbose: int = 0,
) -> tuple[keras.Model, dict[str, Any]]:
    """(stripped sparse copy of ``model``, pruning details): :func:`prune` without the
    conversion, for methods that keep training the pruned weights."""
    if schedule not in SCHEDULES:
        raise CompressionError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if structured_2_4:
        target_sparsity = M_BY_N[0] / M_BY_N[1]
    elif not 0.0 < target_sparsity < 1.0:
        raise CompressionError(f"target_sparsity must be in (0, 1), got {target_sparsity}")
    heads = dict(heads) if heads is not None else infer_heads(model)
    keras.utils.set_random_seed(seed)
    total_steps = train.steps * epochs
    params: dict[str, Any] = {"pruning_schedule": _schedule(schedule, target_sparsity, total_steps)}
    if structured_2_4:
        params["sparsity_m_by_n"] = M_BY_N
    wrapped, pruned, unpruned = _wrap(copy_model(model), params, structured_2_4)
    if not pruned:
        raise CompressionError(
            f"{model.name}: no layer can be pruned ({unpruned or 'no prunable weights'})"
        )
    history = fine_tune(
        wrapped,
        train,
        heads,
        epochs=epochs,
        learning_rate=learning_rate,
        seed=seed,
        callbacks=[tfmot.sparsity.keras.UpdatePruningStep()],
        validation=validation,
        verbose=verbose,
    )
    stripped = tfmot.sparsity.keras.strip_pruning(wrapped)
    details: dict[str, Any] = {
        "target_sparsity": target_sparsity,
        "schedule": "2:4" if structured_2_4 else schedule,
        "sparsity": layer_sparsity(stripped, pruned),
        "overall_sparsity": overall_sparsity(stripped, pruned),
        "unpruned_layers": unpruned,
        "history": history,
    }
    if structured_2_4:
        details["m_by_n"] = list(M_BY_N)
    return stripped, details


def prune(
    model: keras.Model,
    train: TrainingData,
    validation: TrainingData | None = None,
    *,
    heads: Mapping[str, HeadSpec] | None = None,
    target_sparsity: float = 0.5,
    schedule: Schedule = "polynomial",
    structured_2_4: bool = False,
    epochs: int = DEFAULT_EPOCHS,
    learning_rate: float = DEFAULT_LEARNING_RATE,
    seed: int = 0,
    verbose: int = 0,
) -> CompressedModel:
    """Prune a copy of ``model`` while fine-tuning it on ``train``; ``model`` is untouched.

    The result's Keras model is the stripped, sparse model (same names and signature);
    its TFLite is the float conversion with the sparse weights stored sparse
    (:func:`sparse_tflite`; ``details["weight_encoding"]`` says which).
    ``details`` has the measured ``sparsity`` per pruned layer, ``overall_sparsity``,
    ``unpruned_layers`` with reasons, and the fine-tuning ``history``.
    """
    stripped, details = prune_weights(
        model,
        train,
        validation,
        heads=heads,
        target_sparsity=target_sparsity,
        schedule=schedule,
        structured_2_4=structured_2_4,
        epochs=epochs,
        learning_rate=learning_rate,
        seed=seed,
        verbose=verbose,
    )
    method = "prune_2_4" if structured_2_4 else "prune"
    flatbuffer, details["weight_encoding"] = sparse_tflite(stripped)
    return CompressedModel(method, flatbuffer, stripped, details)


def sparse_tflite(model: keras.Model) -> tuple[bytes, str]:
    """The float conversion storing sparse weight tensors in TFLite's sparse format, and
    how the weights are stored.

    A dense file keeps every zero as four bytes, so pruning would shrink it only once
    gzipped; the sparse format stores the non-zeros and their positions, and LiteRT
    densifies them once at load, so inference runs the same kernels at the same speed.
    The converter's sparse encoding is experimental: a file LiteRT cannot prepare is
    replaced by the dense conversion, and the reason recorded.
    """
    try:
        flatbuffer = to_tflite(model, optimizations=[tf.lite.Optimize.EXPERIMENTAL_SPARSITY])
        Interpreter(model_content=flatbuffer).allocate_tensors()
    except (CompressionError, RuntimeError, ValueError) as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return to_tflite(model), f"dense (the sparse encoding does not run: {reason})"
    return flatbuffer, "sparse"
