"""A model's named inputs and heads, and the compile arguments that match the heads.

Every family builds its trunk between the tensors made here and the heads attached
here, so naming, dtypes and losses follow one rule across the zoo:
inputs are named after features, outputs after labels, and every output is float32
(a float32 ``Activation`` ends each head) even under a mixed precision policy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import tf_keras as keras

from research.models.losses import (
    PaddedSequenceCrossentropy,
    RegressionMeanAbsoluteError,
    RegressionMeanSquaredError,
    RegressionR2,
)
from research.models.specs import HeadSpec, InputSpec

Tensors = dict[str, Any]


def keras_inputs(specs: Mapping[str, InputSpec]) -> Tensors:
    """One ``keras.Input`` per spec, named after its feature."""
    return {
        name: keras.Input(shape=spec.shape, dtype=spec.dtype, name=name)
        for name, spec in specs.items()
    }


def only_input(specs: Mapping[str, InputSpec], kinds: Sequence[str], family: str) -> str:
    """The name of the single input a one-input family reads; anything else is an error."""
    if len(specs) != 1:
        raise ValueError(f"{family} models read exactly one input, got {sorted(specs)}")
    ((name, spec),) = specs.items()
    if spec.kind not in kinds:
        raise ValueError(
            f"{family} models need one input of kind {' or '.join(kinds)}; {name!r} is {spec.kind}"
        )
    return name


def head_output(
    features: Any,
    name: str,
    spec: HeadSpec,
    *,
    tower_units: Sequence[int] = (),
    tower_activation: str = "relu",
    tower_dropout: float = 0.0,
) -> Any:
    """One task head on pooled trunk features, optionally with its own hidden tower."""
    x = features
    for index, units in enumerate(tower_units):
        x = keras.layers.Dense(units, activation=tower_activation, name=f"{name}_hidden_{index}")(x)
        if tower_dropout:
            x = keras.layers.Dropout(tower_dropout, name=f"{name}_dropout_{index}")(x)
    if spec.kind == "classification":
        x = keras.layers.Dense(spec.num_classes, name=f"{name}_logits")(x)
        return keras.layers.Activation("softmax", dtype="float32", name=name)(x)
    if spec.kind == "regression":
        x = keras.layers.Dense(spec.units, name=f"{name}_dense")(x)
        # In float32: a target of mean 150 would keep about 2 significant digits in bfloat16.
        return keras.layers.Rescaling(
            spec.target_std, spec.target_mean, dtype="float32", name=name
        )(x)
    raise ValueError(f"head {name!r}: a {spec.kind} head needs the gpt model type")


def assemble(
    model_name: str,
    inputs: Mapping[str, InputSpec],
    heads: Mapping[str, HeadSpec],
    trunk: Callable[[Tensors], Any],
    **tower: Any,
) -> keras.Model:
    """Inputs -> ``trunk`` (pooled features) -> one head per label, as a functional model."""
    tensors = keras_inputs(inputs)
    features = trunk(tensors)
    outputs = {name: head_output(features, name, spec, **tower) for name, spec in heads.items()}
    return keras.Model(inputs=tensors, outputs=outputs, name=model_name)


def compile_args(heads: Mapping[str, HeadSpec]) -> dict[str, dict[str, Any]]:
    """``loss``, ``loss_weights`` and ``metrics`` for ``model.compile(**compile_args(heads))``.

    Keyed by head name, so each label gets the loss its kind needs and the weight its
    spec gives; the total loss Keras minimises is the weighted sum.
    """
    losses: dict[str, Any] = {}
    metrics: dict[str, list[Any]] = {}
    for name, spec in heads.items():
        if spec.kind == "classification":
            losses[name] = keras.losses.SparseCategoricalCrossentropy()
            metrics[name] = [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
        elif spec.kind == "regression":
            losses[name] = RegressionMeanSquaredError()
            metrics[name] = [RegressionMeanAbsoluteError(), RegressionR2(spec.units)]
        else:
            losses[name] = PaddedSequenceCrossentropy()
            metrics[name] = []
    weights = {name: spec.loss_weight for name, spec in heads.items()}
    return {"loss": losses, "loss_weights": weights, "metrics": metrics}
