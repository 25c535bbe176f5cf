"""The model artifact: a SavedModel with named signature plus ``slipway.json``, published
as an integer version in a TensorFlow Serving-style repository ``<root>/<model>/<version>/``.

The serving gateway reads this contract from disk without importing this package, so
everything it relies on is spelled out in files: the ``serving_default`` signature uses
the model's own input and output names, and ``slipway.json`` vouches for every other file
(SHA-256 and size), the signature, held-out metrics and provenance. A version directory
appears with one ``rename``, so a reader polling the repository sees either nothing or a
complete, checksummed version.
"""

from __future__ import annotations

import contextlib
import logging
import re
import subprocess
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf
import tf_keras as keras
from tensorflow.core.protobuf import saved_model_pb2

from contracts.model_manifest import CLASSES_SUFFIX, SIGNATURE_KEY
from research.preprocessing.preprocessor import FeaturePreprocessor


class ExportError(RuntimeError):
    """The model cannot be exported as the artifact contract requires."""


class NonFiniteWeightsError(ExportError):
    """The weights hold NaN or infinity: publishing them would serve garbage."""


def nonfinite_check(variables: Sequence[tf.Variable]) -> Callable[[], list[str]]:
    """A check that names the floating-point ``variables`` holding a NaN or an infinity.

    Checked before every checkpoint is committed and before a model is exported, because
    a poisoned update can leave every loss finite while the weights are not. Compiled
    once: a run checks the same variables before every save, and one call costs far
    less than two eager ops per variable (a model and its optimizer have hundreds).
    """
    floating = [variable for variable in variables if variable.dtype.is_floating]

    @tf.function
    def finite() -> tf.Tensor:
        return tf.stack([tf.reduce_all(tf.math.is_finite(variable)) for variable in floating])

    def check() -> list[str]:
        if not floating:
            return []
        flags = finite().numpy()
        return [variable.name for variable, ok in zip(floating, flags, strict=True) if not ok]

    return check


def nonfinite_variables(variables: Iterable[tf.Variable]) -> list[str]:
    """Names of the floating-point variables holding a NaN or an infinity, checked once
    (a compiled check, ``nonfinite_check``, pays off only when repeated: tracing one per
    export made a process that exports several models retrace again and again)."""
    return [
        variable.name
        for variable in variables
        if variable.dtype.is_floating and not np.isfinite(variable.numpy()).all()
    ]


# -- the SavedModel -------------------------------------------------------------------


def _named_inputs(model: keras.Model) -> dict[str, Any]:
    """Input name -> KerasTensor, in the order the model declares them."""
    structure = model.input
    if isinstance(structure, Mapping):
        return dict(structure)
    return dict(zip(model.input_names, tf.nest.flatten(structure), strict=True))


def _named_outputs(model: keras.Model, outputs: Any) -> dict[str, Any]:
    if isinstance(outputs, Mapping):
        return dict(outputs)
    return dict(zip(model.output_names, tf.nest.flatten(outputs), strict=True))


def _describe(spec: Any) -> dict[str, Any]:
    shape = tf.TensorShape(spec.shape)
    dims = None if shape.rank is None else [-1 if d is None else d for d in shape.as_list()]
    return {"dtype": tf.as_dtype(spec.dtype).name, "shape": dims}


def class_names_output(head: str) -> str:
    """The output holding the class names of classification head ``head``."""
    return f"{head}{CLASSES_SUFFIX}"


def _with_class_names(
    outputs: dict[str, tf.Tensor], class_names: Mapping[str, Sequence[str]]
) -> dict[str, tf.Tensor]:
    """``outputs`` plus, per head in ``class_names``, its class names for every row, the
    way TensorFlow Serving's classification signatures return ``classes`` beside
    ``scores``."""
    named = dict(outputs)
    for head, names in class_names.items():
        scores = outputs[head]
        rows = tf.shape(scores)[0]
        named[class_names_output(head)] = tf.broadcast_to(
            tf.constant(list(names), tf.string)[tf.newaxis, :], [rows, len(names)]
        )
    return named


# The signature that takes images as float arrays in [0, 1] rather than encoded files.
IMAGE_ARRAYS_SIGNATURE = "serving_image_arrays"


def _serving_function(
    model: keras.Model,
    preprocessor: FeaturePreprocessor | None,
    class_names: Mapping[str, Sequence[str]],
    *,
    as_given: Sequence[str] = (),
) -> Any:
    """A signature function: the model's inputs by name, raw where ``preprocessor``
    reads them (except the inputs ``as_given``, which take the model's own tensors),
    and the model's outputs plus their class names."""
    inputs = _named_inputs(model)
    names = list(inputs)
    raw = preprocessor.raw_specs if preprocessor is not None else {}
    preprocessed = [name for name in names if name in raw and name not in as_given]
    specs = [
        raw[name]
        if name in preprocessed
        else tf.TensorSpec([None, *tensor.shape[1:]], tensor.dtype, name=name)
        for name, tensor in inputs.items()
    ]
    structure = model.input

    @tf.autograph.experimental.do_not_convert
    def serve(*tensors: tf.Tensor) -> dict[str, tf.Tensor]:
        by_name = dict(zip(names, tensors, strict=True))
        if preprocessed:
            by_name.update(preprocessor({name: by_name[name] for name in preprocessed}))
        if isinstance(structure, Mapping):
            feed: Any = by_name
        else:
            feed = tf.nest.pack_sequence_as(structure, [by_name[name] for name in names])
        outputs = _named_outputs(model, model(feed, training=False))
        return _with_class_names(outputs, class_names)

    # The tf.function itself (not a concrete function) is what SavedModel can re-trace when
    # the model's variables are distributed (a multi-worker run).
    return tf.function(serve, input_signature=specs)


def save_serving_model(
    model: keras.Model,
    directory: str | Path,
    preprocessor: FeaturePreprocessor | None = None,
    class_names: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, Any]:
    """Save ``model`` as a SavedModel whose ``serving_default`` uses the model's names.

    Inputs are keyed by the model's input names with a free batch dimension, outputs by
    its output names (a Keras default signature would call them ``output_0``…). With
    ``preprocessor`` the signature takes the raw features it reads (category and text
    strings, encoded images, unscaled numbers) and runs it before the model, so clients
    send what they have; a model with images also gets ``IMAGE_ARRAYS_SIGNATURE``, for
    clients that hold pixels rather than files. ``class_names`` (head -> its classes, in
    score order) adds an output ``<head>_classes`` beside each classification head's
    scores, so an answer says what it means by itself. Saved via ``Model.save`` (which
    calls ``tf.saved_model.save``) without the optimizer: serving needs no slot
    variables, and the Keras metadata lets compression rebuild the model from its layers'
    configs. Each layer's call functions are traced into the file only when a layer's
    class is unknown to Keras (see ``_needs_layer_traces``). The signature is read back
    from disk and returned as ``slipway.json`` describes it.
    """
    if model.inputs is None:
        raise ExportError("the model has no defined inputs; build it from keras.Input")
    poisoned = nonfinite_variables(model.weights)
    if poisoned:
        raise NonFiniteWeightsError(
            f"not exported: weights hold NaN or infinity ({', '.join(poisoned[:5])}"
            f"{', ...' if len(poisoned) > 5 else ''})"
        )
    names = list(_named_inputs(model))
    class_names = _checked_class_names(model, class_names or {})
    function = _serving_function(model, preprocessor, class_names)
    signatures = {SIGNATURE_KEY: function}
    images = [name for name in names if preprocessor and name in preprocessor.image_inputs]
    if images:
        signatures[IMAGE_ARRAYS_SIGNATURE] = _serving_function(
            model, preprocessor, class_names, as_given=images
        )
    output_names = list(function.get_concrete_function().structured_outputs)
    with _tracked(model, preprocessor), _without_compile_warning():
        model.save(
            str(directory),
            save_format="tf",
            include_optimizer=False,
            save_traces=_needs_layer_traces(model),
            signatures=signatures,
        )
    saved_inputs, saved_outputs = _saved_signature(Path(directory))
    if set(saved_inputs) != set(names) or set(saved_outputs) != set(output_names):
        raise ExportError(
            f"{directory}: signature names {sorted(saved_inputs)} -> {sorted(saved_outputs)} "
            f"differ from the model's {names} -> {output_names}"
        )
    return {
        "name": SIGNATURE_KEY,
        "inputs": {name: saved_inputs[name] for name in names},
        "outputs": {name: saved_outputs[name] for name in output_names},
    }


def _needs_layer_traces(model: keras.Model) -> bool:
    """Whether some layer of ``model`` (or the model) is of a class Keras cannot rebuild.

    Everything that reads a version calls its signatures (the gateway, compression's
    runners); only compression rebuilds the Keras model, which for built-in and registered
    classes comes from their configs alone. Traces are kept for other classes, so that
    loading still revives them and compression names them. Tracing every layer made a
    Transformer's export five to eight times slower and its reload four times.
    """
    for layer in [model, *model.submodules]:
        cls = type(layer)
        if not isinstance(layer, keras.layers.Layer) or cls.__module__.startswith("tf_keras."):
            continue
        if keras.saving.get_registered_object(keras.saving.get_registered_name(cls)) is not cls:
            return True
    return False


def _saved_signature(directory: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``serving_default`` inputs and outputs as written to ``saved_model.pb``.

    Read from the file's signature definition rather than by loading the SavedModel back:
    the names, dtypes and shapes are all the contract needs, and a load restores every
    function of the model (a tenth to half a second each export).
    """
    saved = saved_model_pb2.SavedModel.FromString((directory / "saved_model.pb").read_bytes())
    (graph,) = [g for g in saved.meta_graphs if tf.saved_model.SERVING in g.meta_info_def.tags]
    definition = graph.signature_def[SIGNATURE_KEY]
    return (
        {name: _describe_tensor_info(info) for name, info in definition.inputs.items()},
        {name: _describe_tensor_info(info) for name, info in definition.outputs.items()},
    )


def _describe_tensor_info(info: Any) -> dict[str, Any]:
    return _describe(tf.TensorSpec(tf.TensorShape(info.tensor_shape), tf.as_dtype(info.dtype)))


def _checked_class_names(
    model: keras.Model, class_names: Mapping[str, Sequence[str]]
) -> dict[str, list[str]]:
    """``class_names`` for the heads that output one score per class, checked against
    the model's outputs (a name list that does not fit its scores would mislabel them)."""
    outputs = dict(zip(model.output_names, tf.nest.flatten(model.output), strict=True))
    if isinstance(model.output, Mapping):
        outputs = dict(model.output)
    checked = {}
    for head, names in class_names.items():
        if head not in outputs:
            raise ExportError(f"class names for {head!r}, which is no output of the model")
        taken = class_names_output(head)
        if taken in outputs:
            raise ExportError(f"output {taken!r} would hold {head!r}'s class names: rename it")
        width = outputs[head].shape[-1]
        if width != len(names):
            raise ExportError(
                f"{len(names)} class names for output {head!r}, which has {width} scores"
            )
        checked[head] = [str(name) for name in names]
    return checked


def save_preprocessing(preprocessor: FeaturePreprocessor, directory: str | Path) -> dict[str, Any]:
    """Save ``preprocessor`` alone as a SavedModel: raw features -> the model's inputs.

    For a model that cannot hold string ops and lookup tables itself (a quantized TFLite
    core), so that the version still takes raw features: the gateway runs this first.
    Returns its signature as ``slipway.json`` describes one.
    """
    specs = list(preprocessor.raw_specs.values())
    names = [spec.name for spec in specs]

    @tf.autograph.experimental.do_not_convert
    def preprocess(*tensors: tf.Tensor) -> dict[str, tf.Tensor]:
        return preprocessor(dict(zip(names, tensors, strict=True)))

    function = tf.function(preprocess, input_signature=specs)
    tf.saved_model.save(preprocessor, str(directory), signatures={SIGNATURE_KEY: function})
    concrete = function.get_concrete_function()
    return {
        "name": SIGNATURE_KEY,
        "inputs": {spec.name: _describe(spec) for spec in specs},
        "outputs": {
            name: _describe(output) for name, output in concrete.structured_outputs.items()
        },
    }


class _CompileWarningFilter(logging.Filter):
    """Drops Keras' "compiled metrics have yet to be built" warning.

    Keras' SavedModel writer logs it for every model that was never compiled, which is
    every model a trainer with its own loop exports: a warning about nothing, twice per
    export, on the screen of every ``slipway train``.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(COMPILE_WARNING)


COMPILE_WARNING = "Compiled the loaded model, but the compiled metrics have yet to be built"


@contextlib.contextmanager
def _without_compile_warning() -> Iterator[None]:
    logger = tf.get_logger()
    quiet = _CompileWarningFilter()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


@contextlib.contextmanager
def _tracked(model: keras.Model, preprocessor: FeaturePreprocessor | None) -> Iterator[None]:
    """``preprocessor`` attached to ``model`` while it is saved.

    A SavedModel keeps the lookup tables and constants of the objects reachable from
    its root, and the root must stay the Keras model for compression to reload it.
    """
    if preprocessor is None:
        yield
        return
    model.serving_preprocessor = preprocessor
    try:
        yield
    finally:
        del model.serving_preprocessor


# -- provenance -----------------------------------------------------------------------


def git_commit(path: str | Path) -> str | None:
    """The commit checked out in the repository containing ``path``; None outside git."""
    start = Path(path)
    if not start.is_dir():
        start = start.parent
    try:
        result = subprocess.run(
            ["git", "-C", str(start), "rev-parse", "--verify", "HEAD"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = result.stdout.strip()
    if result.returncode != 0 or not re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", commit):
        return None
    return commit
