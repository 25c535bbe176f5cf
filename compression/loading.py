"""Opening a model repository version as the Keras model compression works on.

Compression needs the Keras model (tfmot rewrites Keras layers), but what it must keep
is the *served* contract: the ``serving_default`` signature's input and output names.
So the signature is read from ``saved_model.pb`` itself (cheaply, without tracing any
function) and checked against the reloaded Keras model before any method runs; every
way this can fail is a ``CompressionError`` that names the directory and the problem.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tensorflow as tf
import tf_keras as keras
from google.protobuf.message import DecodeError
from tensorflow.core.protobuf import saved_model_pb2

import research.models.attention  # noqa: F401  (registers the Transformer blocks' token reshapes)
import research.models.layers  # noqa: F401  (and the zoo's other custom layers, for deserialisation)
import research.models.losses  # noqa: F401  (and its custom losses)
import research.models.moe  # noqa: F401  (and the mixture-of-experts layer)
from compression.errors import CompressionError
from contracts.model_manifest import (
    MANIFEST_FILE,
    SAVED_MODEL_FILE,
    SIGNATURE_KEY,
    verify_model_dir,
)
from training.export import class_names_output

_KERAS_METADATA_FILE = "keras_metadata.pb"
# Keras rebuilds a layer class it does not know from the SavedModel's traced functions, as
# a class created in this module: the layer runs, but its code and config are gone.
_REVIVED_MODULE = "tf_keras.src.saving.legacy.saved_model.load"


@dataclass
class LoadedModel:
    """A source model version: its Keras model, ``slipway.json`` and served signature.

    ``manifest`` is empty for a plain SavedModel without ``slipway.json``; ``signature``
    describes the Keras model compression works on in ``slipway.json``'s layout
    (``{"name", "inputs": {name: {"dtype", "shape"}}, "outputs": {...}}``): the served
    ``serving_default`` without what the export adds around the model, the
    preprocessing of ``raw_inputs`` before it and class names after it.
    """

    model: keras.Model
    manifest: dict[str, Any]
    signature: dict[str, Any]

    @property
    def raw_inputs(self) -> list[str]:
        """The inputs the served graph takes raw and preprocesses itself."""
        return raw_inputs(self.manifest)

    @property
    def input_names(self) -> list[str]:
        return list(self.signature["inputs"])

    @property
    def output_names(self) -> list[str]:
        return list(self.signature["outputs"])


def _describe(info: Any) -> dict[str, Any]:
    shape = tf.TensorShape(info.tensor_shape)
    dims = None if shape.rank is None else [-1 if d is None else d for d in shape.as_list()]
    return {"dtype": tf.as_dtype(info.dtype).name, "shape": dims}


def raw_inputs(manifest: Mapping[str, Any]) -> list[str]:
    """The inputs a version's ``slipway.json`` says its served graph takes raw."""
    return list((manifest.get("preprocessing") or {}).get("inputs", []))


def served_raw_inputs(directory: str | Path) -> list[str]:
    """``raw_inputs`` of the version in ``directory`` (none without ``slipway.json``)."""
    path = Path(directory) / MANIFEST_FILE
    if not path.is_file():
        return []
    return raw_inputs(json.loads(path.read_text(encoding="utf-8")))


def read_signature(directory: str | Path) -> dict[str, Any]:
    """The ``serving_default`` signature of the SavedModel in ``directory``.

    Parsed from the protobuf so a refused model costs milliseconds, not a model load.
    """
    root = Path(directory)
    path = root / SAVED_MODEL_FILE
    if not root.is_dir():
        raise CompressionError(f"{root}: not a directory")
    if not path.is_file():
        raise CompressionError(f"{root}: not a SavedModel (no {SAVED_MODEL_FILE})")
    saved = saved_model_pb2.SavedModel()
    try:
        saved.ParseFromString(path.read_bytes())
    except DecodeError as exc:
        raise CompressionError(f"{path}: not a SavedModel protobuf: {exc}") from None
    if not saved.meta_graphs:
        raise CompressionError(f"{path}: the SavedModel holds no graph")
    signatures = saved.meta_graphs[0].signature_def
    if SIGNATURE_KEY not in signatures:
        raise CompressionError(
            f"{root}: the SavedModel has no {SIGNATURE_KEY!r} signature "
            f"(it has {sorted(key for key in signatures if not key.startswith('__'))}); "
            "export it with named inputs and outputs (training.export.save_serving_model)"
        )
    definition = signatures[SIGNATURE_KEY]
    return {
        "name": SIGNATURE_KEY,
        "inputs": {name: _describe(info) for name, info in sorted(definition.inputs.items())},
        "outputs": {name: _describe(info) for name, info in sorted(definition.outputs.items())},
    }


def _read_manifest(root: Path) -> dict[str, Any]:
    if not (root / MANIFEST_FILE).exists():
        return {}
    problems = verify_model_dir(root)
    if problems:
        raise CompressionError(
            f"{root}: the version does not match its {MANIFEST_FILE}: {problems}"
        )
    manifest = json.loads((root / MANIFEST_FILE).read_text(encoding="utf-8"))
    return manifest


def _load_keras(root: Path) -> keras.Model:
    if not (root / _KERAS_METADATA_FILE).is_file():
        raise CompressionError(
            f"{root}: the SavedModel has no {_KERAS_METADATA_FILE}, so its Keras layers cannot "
            "be rebuilt; compress a model saved by Keras (training.export.save_serving_model)"
        )
    try:
        model = keras.models.load_model(root, compile=False)
    except (ValueError, TypeError, KeyError, OSError) as exc:
        raise CompressionError(
            f"{root}: cannot rebuild the Keras model (is every custom layer registered?): {exc}"
        ) from None
    if not isinstance(model, keras.Model) or model.inputs is None:
        raise CompressionError(f"{root}: the SavedModel is not a Keras functional model")
    revived = [
        f"{layer.name} ({type(layer).__name__})"
        for layer in model.layers
        if type(layer).__module__ == _REVIVED_MODULE
    ]
    if revived:
        raise CompressionError(
            f"{root}: layers {revived} are not registered with Keras, so only their traced "
            "graphs were restored and they cannot be pruned, quantized or cloned; import the "
            "module that registers them (keras.saving.register_keras_serializable)"
        )
    return in_float32(model)


def _float32_config(node: Any) -> Any:
    """A layer config with every mixed-precision dtype policy replaced by float32."""
    if isinstance(node, dict):
        if node.get("class_name") in ("Policy", "DTypePolicy"):
            name = str(node.get("config", {}).get("name", ""))
            if name.startswith("mixed_"):
                return "float32"
        return {key: _float32_config(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_float32_config(item) for item in node]
    if isinstance(node, str) and node.startswith("mixed_"):
        return "float32"
    return node


def in_float32(model: keras.Model) -> keras.Model:
    """The same model computing in float32.

    A model trained under ``mixed_bfloat16``/``mixed_float16`` keeps float32 variables but
    computes in 16 bits, which the TFLite converter and tfmot cannot take; compression starts
    from the float32 model with the very same weights.
    """
    mixed = any(
        getattr(getattr(layer, "dtype_policy", None), "name", "float32").startswith("mixed_")
        for layer in model.layers
    )
    if not mixed:
        return model
    rebuilt = keras.Model.from_config(_float32_config(model.get_config()))
    rebuilt.set_weights(model.get_weights())
    return rebuilt


def named_inputs(model: keras.Model) -> dict[str, Any]:
    """Input name -> Keras tensor; the names a serving signature and a dataset speak."""
    if isinstance(model.input, Mapping):
        return dict(model.input)
    return dict(zip(model.input_names, tf.nest.flatten(model.input), strict=True))


def output_names(model: keras.Model) -> list[str]:
    """The model's output names, as its ``serving_default`` keys them."""
    if isinstance(model.output, Mapping):
        return list(model.output)
    return list(model.output_names)


def _model_signature(root: Path, model: keras.Model, signature: dict[str, Any]) -> dict[str, Any]:
    """The Keras model's own signature: the served one's names, checked to be the
    model's (a model whose names differ would move outputs), with the model's input
    specs (the served graph may take them raw and preprocess them) and without the
    class names the export adds beside its heads' scores."""
    model_inputs, model_outputs = sorted(named_inputs(model)), sorted(output_names(model))
    added = {class_names_output(output) for output in model_outputs}
    outputs = {name: spec for name, spec in signature["outputs"].items() if name not in added}
    served_inputs, served_outputs = sorted(signature["inputs"]), sorted(outputs)
    if model_inputs != served_inputs or model_outputs != served_outputs:
        raise CompressionError(
            f"{root}: the Keras model's names {model_inputs} -> {model_outputs} differ from "
            f"its {SIGNATURE_KEY} signature {served_inputs} -> {served_outputs}"
        )
    inputs = {name: _describe_tensor(tensor) for name, tensor in named_inputs(model).items()}
    return {**signature, "inputs": inputs, "outputs": outputs}


def _describe_tensor(tensor: Any) -> dict[str, Any]:
    dims = [-1 if d is None else int(d) for d in tensor.shape.as_list()]
    return {"dtype": tf.as_dtype(tensor.dtype).name, "shape": dims}


def load_version(version_dir: str | Path) -> LoadedModel:
    """Load ``<root>/<model>/<version>/`` for compression, refusing what cannot be kept.

    The checks run cheapest first: the directory, the SavedModel protobuf and its
    signature, ``slipway.json`` checksums, then the Keras model itself.
    """
    root = Path(version_dir)
    signature = read_signature(root)
    manifest = _read_manifest(root)
    model = _load_keras(root)
    signature = _model_signature(root, model, signature)
    return LoadedModel(model=model, manifest=manifest, signature=signature)
