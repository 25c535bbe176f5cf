"""Fit any tf_keras model to the dataset it trains on, or say exactly why it does not fit.

Slipway feeds a model a dict of features keyed by dataset feature name, takes each
head's loss on the output of the same name, and exports a ``serving_default`` signature
with those names. Zoo models are built that way; a researcher's model often is not: a
subclassed model has no inputs until it is called, a Sequential model has one input
with a name of its own, outputs come as a list, or as float16 under mixed precision.

``conform_model`` wraps such a model into a functional model with the contract's names
and float32 outputs, since that changes nothing the model computes. What would change
it (a missing input, a wrong dtype or shape, an output too few) is a
``ModelInterfaceError`` naming both sides. A model that already conforms (every zoo
model) is returned as it is, so the checkpoints of existing runs still load.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import tensorflow as tf
import tf_keras as keras

from research.models.endpoints import Tensors, keras_inputs
from research.models.specs import HeadSpec, InputSpec, ModelInterfaceError


def conform_model(
    model: Any,
    inputs: Mapping[str, InputSpec],
    heads: Mapping[str, HeadSpec],
    *,
    source: str,
) -> keras.Model:
    """``model`` itself when it fits ``inputs`` and ``heads``, else a functional wrapper.

    Conforming means: a tf_keras model built on ``keras.Input`` layers named after the
    features (with their dtypes and per-example shapes), returning a dict keyed by head
    name of float32 tensors shaped ``[batch, num_classes]`` (classification, probabilities),
    ``[batch, units]`` (regression) or ``[batch, time, vocab_size]`` (language_model,
    logits). The wrapper feeds a subclassed or unbuilt model the features dict (a
    Sequential one its single tensor), maps a single output to the single head and a
    list of outputs by layer name or else in head order, and casts every output to
    float32. ``source`` (the function or config that made the model) starts every message.
    """
    _check_is_keras_model(model, source)
    if not model.inputs:
        return _wrap(model, None, inputs, heads, source)
    features = _match_inputs(_named_inputs(model), inputs, source)
    outputs = _by_head(model.output, model.output_names, heads, source)
    _check_outputs(outputs, heads, inputs, source)
    renamed = any(name != feature for name, feature in features.items())
    as_dict = isinstance(model.output, Mapping)
    if not renamed and as_dict and all(t.dtype == tf.float32 for t in outputs.values()):
        return model
    return _wrap(model, features, inputs, heads, source)


def _check_is_keras_model(model: Any, source: str) -> None:
    if isinstance(model, keras.Model):
        return
    kind = type(model)
    name = f"{kind.__module__}.{kind.__qualname__}"
    if any(cls.__module__.partition(".")[0] == "keras" for cls in kind.__mro__):
        raise ModelInterfaceError(
            f"{source}: expected a tf_keras Model, got a Keras 3 object. Slipway trains "
            "Keras 2 models (the compression tools work only with them): build it with "
            f"`import tf_keras as keras` (or `tf.keras`, which is tf_keras in Slipway), not "
            f"`import keras`. Received: {name}"
        )
    raise ModelInterfaceError(f"{source}: expected a tf_keras Model. Received: {name}")


def _named_inputs(model: keras.Model) -> Tensors:
    """Input name -> symbolic input, by the name a features dict must use to reach it."""
    if isinstance(model.input, Mapping):
        return dict(model.input)
    return dict(zip(model.input_names, tf.nest.flatten(model.input), strict=True))


def _match_inputs(
    model_inputs: Tensors, inputs: Mapping[str, InputSpec], source: str
) -> dict[str, str]:
    """Model input name -> feature name, each checked for dtype and shape.

    Names must match, except that a model with one input reads the one feature whatever
    its input is called (a Sequential model names it after its first layer).
    """
    if set(model_inputs) == set(inputs):
        features = {name: name for name in model_inputs}
    elif len(model_inputs) == len(inputs) == 1:
        features = {next(iter(model_inputs)): next(iter(inputs))}
    else:
        missing = sorted(set(inputs) - set(model_inputs))
        extra = sorted(set(model_inputs) - set(inputs))
        raise ModelInterfaceError(
            f"{source}: the model's inputs must be named after the dataset's features. "
            f"Features the model lacks: {missing}; model inputs that are no feature: {extra} "
            "(data.features selects the features a model reads). "
            f"Received: model inputs {sorted(model_inputs)}, dataset features {sorted(inputs)}"
        )
    for name, feature in features.items():
        _check_input(feature, model_inputs[name], inputs[feature], source)
    return features


def _check_input(feature: str, tensor: Any, spec: InputSpec, source: str) -> None:
    if tensor.dtype.name != spec.dtype:
        raise ModelInterfaceError(
            f"{source}: input {feature!r} ({spec.kind}) must have dtype {spec.dtype}, the "
            f"dtype the dataset delivers and clients send. Received: dtype={tensor.dtype.name}"
        )
    got = tuple(tensor.shape)[1:]
    fits = len(got) == len(spec.shape) and all(
        dim is None or dim == wanted for dim, wanted in zip(got, spec.shape, strict=True)
    )
    if not fits:
        raise ModelInterfaceError(
            f"{source}: input {feature!r} ({spec.kind}) must have shape "
            f"{_dims((None, *spec.shape))}. Received: shape={_dims(tensor.shape)}"
        )


def _by_head(
    structure: Any, output_names: Sequence[str] | None, heads: Mapping[str, HeadSpec], source: str
) -> Tensors:
    """Head name -> output tensor: by dict key, the only one, by layer name, or in order."""
    names = list(heads)
    if isinstance(structure, Mapping):
        missing = [name for name in names if name not in structure]
        extra = [key for key in structure if key not in heads]
        if missing or extra:
            raise ModelInterfaceError(
                f"{source}: the model's outputs must be keyed by the dataset's heads. Heads "
                f"without an output: {missing}; outputs that are no head: {extra}. "
                f"Received: outputs {list(structure)}, heads {names}"
            )
        return {name: structure[name] for name in names}
    flat = tf.nest.flatten(structure)
    if len(flat) == len(names) == 1:
        return {names[0]: flat[0]}
    if output_names and sorted(output_names) == sorted(names):
        by_layer = dict(zip(output_names, flat, strict=True))
        return {name: by_layer[name] for name in names}
    if len(flat) == len(names):
        return dict(zip(names, flat, strict=True))
    raise ModelInterfaceError(
        f"{source}: the model returns {len(flat)} output(s) for {len(names)} head(s): return "
        f"a dict keyed by head name. Received: {len(flat)} output(s), heads {names}"
    )


def _check_outputs(
    outputs: Tensors, heads: Mapping[str, HeadSpec], inputs: Mapping[str, InputSpec], source: str
) -> None:
    for name, tensor in outputs.items():
        spec = heads[name]
        if not tensor.dtype.is_floating:
            raise ModelInterfaceError(
                f"{source}: output {name!r} ({spec.kind} head) must be floating point "
                f"(probabilities, values or logits). Received: dtype={tensor.dtype.name}"
            )
        expected, meaning = _expected_output(spec, inputs)
        if not tf.TensorShape(expected).is_compatible_with(tensor.shape):
            raise ModelInterfaceError(
                f"{source}: output {name!r} ({spec.kind} head) must have shape "
                f"{_dims(expected)} ({meaning}). Received: shape={_dims(tensor.shape)}"
            )


def _expected_output(
    spec: HeadSpec, inputs: Mapping[str, InputSpec]
) -> tuple[tuple[int | None, ...], str]:
    """The output shape a head needs, with what its sizes mean."""
    if spec.kind == "classification":
        return (None, spec.num_classes), f"class probabilities, num_classes={spec.num_classes}"
    if spec.kind == "regression":
        return (None, spec.units), f"units={spec.units}"
    tokens = [(name, token) for name, token in inputs.items() if token.kind == "tokens"]
    if len(tokens) != 1:
        return (None, None, None), "next-token logits"
    ((name, token),) = tokens
    return (
        (None, token.shape[0], token.vocab_size),
        f"next-token logits over input {name!r}, vocab_size={token.vocab_size}",
    )


def _wrap(
    model: keras.Model,
    features: Mapping[str, str] | None,
    inputs: Mapping[str, InputSpec],
    heads: Mapping[str, HeadSpec],
    source: str,
) -> keras.Model:
    """A functional model over named ``keras.Input``s whose outputs are float32 heads.

    ``features`` maps a graph model's input names to feature names (None: the model has
    no inputs of its own yet).
    """
    if model.name in inputs or model.name in heads:
        raise ModelInterfaceError(
            f"{source}: the model's name is also a feature or head name, and a wrapped "
            f"model needs the three to differ: rename the model. Received: name={model.name!r}"
        )
    tensors = keras_inputs(inputs)
    feed = _feed(model, features, tensors)
    try:
        raw = model(feed)
    except Exception as exc:
        received = {
            name: f"{spec.dtype} {_dims((None, *spec.shape))}" for name, spec in inputs.items()
        }
        raise ModelInterfaceError(
            f"{source}: calling the model on the dataset's features failed (a model without "
            f"keras.Input layers is called with a dict keyed by feature name). Received: "
            f"{received}\n{type(exc).__name__}: {exc}"
        ) from exc
    outputs = _by_head(raw, model.output_names if features is not None else None, heads, source)
    _check_outputs(outputs, heads, inputs, source)
    named = {
        name: keras.layers.Activation("linear", dtype="float32", name=name)(tensor)
        for name, tensor in outputs.items()
    }
    return keras.Model(inputs=tensors, outputs=named, name=model.name)


def _feed(model: keras.Model, features: Mapping[str, str] | None, tensors: Tensors) -> Any:
    """What ``model`` is called with: the structure of its inputs, else the features dict."""
    if features is not None:
        by_name = {name: tensors[feature] for name, feature in features.items()}
        if isinstance(model.input, Mapping):
            return by_name
        flat = [by_name[name] for name in model.input_names]
        return tf.nest.pack_sequence_as(model.input, flat)
    if isinstance(model, keras.Sequential) and len(tensors) == 1:
        return next(iter(tensors.values()))
    return tensors


def _dims(shape: Any) -> str:
    """``[batch, 8, 8, 1]``: how shapes read in messages (unknown sizes as None)."""
    dims = tf.TensorShape(shape)
    if dims.rank is None:
        return "unknown"
    return "[" + ", ".join(["batch", *(str(dim) for dim in dims.as_list()[1:])]) + "]"
