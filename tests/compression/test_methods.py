"""Compression methods on real zoo models: names kept, sizes, sparsity and layer reports.

Every method runs on an MLP, a CNN and a Transformer classifier trained on real data and
published through training's export, and every result is checked by running its TFLite
flatbuffer in LiteRT with the source model's input and output names.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras
from ai_edge_litert.interpreter import Interpreter

from compression import clustering, pruning, ptq, qat
from compression.errors import CompressionError
from compression.finetune import (
    TrainingData,
    copy_model,
    fine_tune,
    infer_heads,
    sequence_length,
    training_data,
)
from compression.loading import LoadedModel, load_version, named_inputs
from compression.result import CompressedModel
from research.data.input_pipeline import make_dataset
from tests.support.compression_models import SourceModel, published_source
from training.export import save_serving_model

FAMILIES = ("mlp", "cnn", "transformer")
# Fine-tuning methods on every family: the MLP in the fast tier, the larger two in test-all.
FINE_TUNED_FAMILIES = [
    "mlp",
    pytest.param("cnn", marks=pytest.mark.slow),
    pytest.param("transformer", marks=pytest.mark.slow),
]
BATCH = 64
TRAIN_BATCH = 128  # few steps per fine-tuning epoch: the tests check behaviour, not accuracy


class Zoo:
    """A published source model, loaded, with its training and test batches."""

    def __init__(self, source: SourceModel) -> None:
        self.source = source
        self.loaded: LoadedModel = load_version(source.version_dir)
        self.model = self.loaded.model
        self.heads = infer_heads(self.model, self.loaded.manifest["labels"])
        self.train: TrainingData = training_data(
            source.dataset_dir, self.model, self.heads, batch_size=TRAIN_BATCH
        )
        self.test_features, self.test_labels = _first_batch(source.dataset_dir, self.model)

    @cached_property
    def float_tflite(self) -> bytes:
        return ptq.float32(self.model).tflite

    def accuracy(self, predictions: Mapping[str, np.ndarray]) -> float:
        (name,) = self.heads
        return float(np.mean(np.argmax(predictions[name], -1) == self.test_labels))


def m_by_n_violations(
    kernel: np.ndarray, m: int = pruning.M_BY_N[0], n: int = pruning.M_BY_N[1]
) -> int:
    """Groups of ``n`` consecutive input-dimension weights with fewer than ``m`` zeros.

    The input dimension of a Dense ``(in, out)`` or Conv2D ``(h, w, in, out)`` kernel is
    the second to last axis; groups are taken along it for every output (and position).
    """
    inputs = np.moveaxis(np.asarray(kernel), -2, -1).reshape(-1, kernel.shape[-2])
    if inputs.shape[1] % n:
        raise ValueError(f"input width {inputs.shape[1]} is not a multiple of {n}")
    groups = inputs.reshape(inputs.shape[0], -1, n)
    return int(np.sum(np.sum(groups == 0, axis=-1) < m))


def _first_batch(dataset_dir: Path, model: keras.Model) -> tuple[dict[str, np.ndarray], Any]:
    """One unshuffled test batch: inputs by model name, and the class labels."""
    inputs = named_inputs(model)
    batches = make_dataset(
        dataset_dir,
        "test",
        batch_size=BATCH,
        shuffle=False,
        features=list(inputs),
        sequence_length=sequence_length(inputs),
    )
    features, labels = next(iter(batches.as_numpy_iterator()))
    return {name: np.asarray(features[name]) for name in inputs}, np.asarray(labels)


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Zoo]:
    """Each family trained and published once for the whole run."""
    keras.backend.clear_session()
    return {family: Zoo(published_source(tmp_path_factory, family)) for family in FAMILIES}


def run_tflite(flatbuffer: bytes, features: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run the ``serving_default`` signature example by example, (de)quantizing int8 I/O."""
    runner = Interpreter(model_content=flatbuffer).get_signature_runner("serving_default")
    input_details = runner.get_input_details()
    output_details = runner.get_output_details()
    count = len(next(iter(features.values())))
    rows: dict[str, list[np.ndarray]] = {name: [] for name in output_details}
    for index in range(count):
        feed = {}
        for name, detail in input_details.items():
            value = features[name][index : index + 1]
            if detail["dtype"] == np.int8 and not np.issubdtype(value.dtype, np.integer):
                scale, zero = detail["quantization"]
                value = np.clip(np.round(value / scale + zero), -128, 127)
            feed[name] = value.astype(detail["dtype"])
        for name, value in runner(**feed).items():
            detail = output_details[name]
            if detail["dtype"] == np.int8:
                scale, zero = detail["quantization"]
                value = (value.astype(np.float32) - zero) * scale
            rows[name].append(value)
    return {name: np.concatenate(values) for name, values in rows.items()}


def signature(flatbuffer: bytes) -> tuple[list[str], list[str]]:
    entry = Interpreter(model_content=flatbuffer).get_signature_list()["serving_default"]
    return sorted(entry["inputs"]), sorted(entry["outputs"])


def assert_keeps_names(result: CompressedModel, zoo: Zoo) -> None:
    """Same signature names in TFLite and, when present, the Keras model predicts by name."""
    loaded = zoo.loaded
    assert signature(result.tflite) == (sorted(loaded.input_names), sorted(loaded.output_names))
    if result.keras_model is not None:
        outputs = result.keras_model(zoo.test_features, training=False)
        assert sorted(outputs) == sorted(loaded.output_names)


def agreement(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> float:
    (name,) = a
    return float(np.mean(np.argmax(a[name], -1) == np.argmax(b[name], -1)))


def reference(zoo: Zoo) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in zoo.model(zoo.test_features, training=False).items()}


def zeros(values: Any) -> float:
    array = np.asarray(values)
    return float(np.mean(array == 0))


# -- loading --------------------------------------------------------------------------


def test_load_version_reads_the_signature_and_manifest(zoo: dict[str, Zoo]) -> None:
    loaded = zoo["transformer"].loaded
    assert loaded.signature["inputs"] == {"text": {"dtype": "int64", "shape": [-1, 24]}}
    assert loaded.signature["outputs"] == {"topic": {"dtype": "float32", "shape": [-1, 3]}}
    assert loaded.manifest["labels"]["topic"]["classes"] == ["finance", "food", "health"]
    assert zoo["transformer"].heads["topic"].num_classes == 3


def test_load_version_refuses_what_is_not_a_servable_saved_model(
    zoo: dict[str, Zoo], tmp_path: Path
) -> None:
    with pytest.raises(CompressionError, match="not a SavedModel"):
        load_version(tmp_path)
    (tmp_path / "saved_model.pb").write_bytes(b"\x00definitely not a protobuf\xff" * 3)
    with pytest.raises(CompressionError, match="not a SavedModel"):
        load_version(tmp_path)

    module = tf.Module()
    module.double = tf.function(
        lambda x: {"y": 2 * x}, input_signature=[tf.TensorSpec([None], tf.float32, name="x")]
    )
    unnamed = tmp_path / "unnamed"
    tf.saved_model.save(module, str(unnamed), signatures={"double": module.double})
    with pytest.raises(CompressionError, match=r"no 'serving_default' signature .*\['double'\]"):
        load_version(unnamed)
    plain = tmp_path / "plain"
    tf.saved_model.save(module, str(plain), signatures={"serving_default": module.double})
    with pytest.raises(CompressionError, match="no keras_metadata.pb"):
        load_version(plain)

    class Twice(keras.layers.Layer):  # never registered with Keras
        def call(self, x: tf.Tensor) -> tf.Tensor:
            return 2 * x

    inputs = keras.Input((3,), name="x")
    custom = tmp_path / "custom"
    save_serving_model(
        keras.Model({"x": inputs}, {"y": keras.layers.Dense(2, name="y")(Twice()(inputs))}),
        custom,
    )
    with pytest.raises(CompressionError, match=r"layers \['twice \(Twice\)'\] are not registered"):
        load_version(custom)

    tampered = tmp_path / "tampered"
    shutil.copytree(zoo["mlp"].source.version_dir, tampered)
    with (tampered / "variables" / "variables.data-00000-of-00001").open("ab") as handle:
        handle.write(b"\x00")
    with pytest.raises(CompressionError, match="does not match its slipway.json"):
        load_version(tampered)


# -- post-training quantization -------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_post_training_quantization_keeps_names_and_predictions(
    zoo: dict[str, Zoo], family: str
) -> None:
    current = zoo[family]
    model = current.model
    baseline = CompressedModel("float32", current.float_tflite, model, {})
    samples = ptq.representative_dataset(current.source.dataset_dir, model, num_samples=64)
    results = [
        baseline,
        ptq.dynamic_range(model),
        ptq.float16(model),
        ptq.full_integer(model, samples),
    ]
    expected = reference(current)
    for result in results:
        assert_keeps_names(result, current)
        predictions = run_tflite(result.tflite, current.test_features)
        assert agreement(predictions, expected) >= (0.999 if result is baseline else 0.9)
    sizes = {result.method: len(result.tflite) for result in results}
    assert sizes["dynamic_range"] < sizes["float32"]
    assert sizes["float16"] < sizes["float32"]
    assert sizes["int8"] < sizes["float32"]
    assert results[-1].details["calibration_samples"] == 64


def test_int8_cnn_is_at_most_a_third_of_the_float_model(zoo: dict[str, Zoo]) -> None:
    cnn = zoo["cnn"]
    samples = ptq.representative_dataset(cnn.source.dataset_dir, cnn.model, num_samples=32)
    quantized = ptq.full_integer(cnn.model, samples, int8_io=True)
    float_size = len(cnn.float_tflite)
    assert len(quantized.tflite) <= 0.35 * float_size
    assert quantized.details["inputs"] == {"image": "int8"}
    assert quantized.details["outputs"] == {"label": "int8"}
    assert quantized.method == "int8_io"
    predictions = run_tflite(quantized.tflite, cnn.test_features)
    assert agreement(predictions, reference(cnn)) >= 0.9
    assert cnn.accuracy(predictions) >= 0.9


def test_int8_io_keeps_token_id_inputs_integer(zoo: dict[str, Zoo]) -> None:
    text = zoo["transformer"]
    samples = ptq.representative_dataset(text.source.dataset_dir, text.model, num_samples=32)
    quantized = ptq.full_integer(text.model, samples, int8_io=True)
    assert quantized.details["inputs"] == {"text": "int64"}
    assert quantized.details["outputs"] == {"topic": "int8"}
    assert agreement(run_tflite(quantized.tflite, text.test_features), reference(text)) >= 0.9


def test_calibration_samples_come_from_the_training_split(zoo: dict[str, Zoo]) -> None:
    mlp = zoo["mlp"]
    dataset = mlp.source.dataset_dir
    samples = ptq.representative_dataset(dataset, mlp.model, num_samples=50)
    again = ptq.representative_dataset(dataset, mlp.model, num_samples=50)
    assert all(
        np.array_equal(a["pixels"], b["pixels"]) for a, b in zip(samples, again, strict=True)
    )

    def rows(split: str) -> set[bytes]:
        batches = make_dataset(dataset, split, batch_size=512, shuffle=False)
        return {row.tobytes() for f, _ in batches.as_numpy_iterator() for row in f["pixels"]}

    train, test = rows("train"), rows("test")
    drawn = {sample["pixels"][0].tobytes() for sample in samples}
    assert len(drawn) > 40
    assert drawn <= train
    assert not drawn & (test - train)
    assert all(sample["pixels"].shape == (1, 64) for sample in samples)


def test_full_integer_refuses_samples_for_other_inputs(zoo: dict[str, Zoo]) -> None:
    with pytest.raises(CompressionError, match=r"inputs \['image'\], the model reads \['pixels'\]"):
        ptq.full_integer(zoo["mlp"].model, [{"image": np.zeros((1, 8, 8, 1), np.float32)}])


# -- pruning --------------------------------------------------------------------------


@pytest.mark.parametrize("family", FINE_TUNED_FAMILIES)
def test_pruning_reaches_the_target_sparsity_measured_on_the_weights(
    zoo: dict[str, Zoo], family: str
) -> None:
    current = zoo[family]
    before = [w.copy() for w in current.model.get_weights()]
    result = pruning.prune(
        current.model, current.train, heads=current.heads, target_sparsity=0.6, epochs=1
    )
    assert result.method == "prune"
    assert_keeps_names(result, current)
    stripped = result.keras_model
    assert stripped is not None
    assert not [layer for layer in stripped.layers if "prune" in type(layer).__name__.lower()]
    assert result.details["sparsity"]
    for name, reported in result.details["sparsity"].items():
        kernel = stripped.get_layer(name).get_prunable_weights()[0].numpy()
        assert abs(reported - 0.6) <= 0.05, name
        assert abs(zeros(kernel) - 0.6) <= 0.05, name
    assert abs(result.details["overall_sparsity"] - 0.6) <= 0.05
    for old, new in zip(before, current.model.get_weights(), strict=True):
        np.testing.assert_array_equal(old, new)  # the source model is left untouched
    keras_predictions = {
        k: np.asarray(v) for k, v in stripped(current.test_features, training=False).items()
    }
    tflite_predictions = run_tflite(result.tflite, current.test_features)
    assert agreement(tflite_predictions, keras_predictions) >= 0.99
    assert current.accuracy(keras_predictions) >= 0.6
    # The zeros are not stored: the file itself is smaller, not only once gzipped. Embedding
    # tables stay dense (a lookup reads them whole), and in this small Transformer they are
    # most of the weights.
    assert result.details["weight_encoding"] == "sparse"
    dense_bytes = len(ptq.float32(stripped).tflite)
    assert len(result.tflite) < (dense_bytes if family == "transformer" else 0.85 * dense_bytes)


def test_a_sparse_encoding_litert_cannot_run_falls_back_to_the_dense_file(
    zoo: dict[str, Zoo], monkeypatch: pytest.MonkeyPatch
) -> None:
    class Unpreparable:
        def __init__(self, model_content: bytes) -> None:
            pass

        def allocate_tensors(self) -> None:
            raise RuntimeError("failed to delegate CONV_2D node #3\nmore")

    model = zoo["cnn"].model
    monkeypatch.setattr(pruning, "Interpreter", Unpreparable)
    flatbuffer, encoding = pruning.sparse_tflite(model)
    assert (
        encoding == "dense (the sparse encoding does not run: failed to delegate CONV_2D node #3)"
    )
    assert flatbuffer == ptq.float32(model).tflite


def test_structured_2_4_pruning_zeroes_two_of_every_four_inputs(zoo: dict[str, Zoo]) -> None:
    current = zoo["cnn"]
    result = pruning.prune(
        current.model, current.train, heads=current.heads, structured_2_4=True, epochs=1
    )
    assert result.method == "prune_2_4"
    assert_keeps_names(result, current)
    assert result.keras_model is not None
    for name in result.details["sparsity"]:
        kernel = result.keras_model.get_layer(name).kernel.numpy()
        groups = np.moveaxis(kernel, -2, -1).reshape(-1, 4)  # runs of 4 along the input dim
        assert np.all(np.sum(groups == 0, axis=1) >= 2), name
        assert m_by_n_violations(kernel) == 0
    assert {"stage0_block0_2_conv", "label_logits"} <= set(result.details["sparsity"])
    # One input channel cannot be split into groups of four: the stem stays dense.
    assert "input width 1" in result.details["unpruned_layers"]["stem_conv"]
    assert "stem_conv" not in result.details["sparsity"]


def test_fine_tuning_is_deterministic_for_a_seed(zoo: dict[str, Zoo]) -> None:
    mlp = zoo["mlp"]

    def run(seed: int) -> list[np.ndarray]:
        model = copy_model(mlp.model)
        fine_tune(model, mlp.train, mlp.heads, epochs=1, seed=seed)
        return model.get_weights()

    first, second = run(3), run(3)
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(first[0], mlp.model.get_weights()[0])


def test_pruning_refuses_bad_arguments(zoo: dict[str, Zoo]) -> None:
    mlp = zoo["mlp"]
    with pytest.raises(CompressionError, match="schedule must be one of"):
        pruning.prune(mlp.model, mlp.train, schedule="cubic")  # type: ignore[arg-type]
    with pytest.raises(CompressionError, match="target_sparsity"):
        pruning.prune(mlp.model, mlp.train, target_sparsity=1.0)


# -- quantization-aware training ------------------------------------------------------


@pytest.mark.parametrize("family", FINE_TUNED_FAMILIES)
def test_quantization_aware_training_reports_quantized_and_float_layers(
    zoo: dict[str, Zoo], family: str
) -> None:
    current = zoo[family]
    before = [w.copy() for w in current.model.get_weights()]
    result = qat.quantize_aware(current.model, current.train, heads=current.heads, epochs=1)
    for old, new in zip(before, current.model.get_weights(), strict=True):
        np.testing.assert_array_equal(old, new)
    assert result.method == "qat"
    assert result.keras_model is None
    assert_keeps_names(result, current)
    quantized, floating = result.details["quantized_layers"], result.details["float_layers"]
    assert not set(quantized) & set(floating)
    assert set(quantized) | set(floating) == {
        layer.name
        for layer in current.model.layers
        if not isinstance(layer, keras.layers.InputLayer)
    }
    if family == "transformer":
        assert {"encoder_embedding", "encoder_block0_attention", "encoder_mask"} <= set(floating)
        assert {"encoder_block0_attention_norm", "encoder_final_norm"} <= set(floating)
        assert {"encoder_block0_ffn_in", "topic_logits"} <= set(quantized)
    else:
        assert floating == []
        # Float attention and embeddings dominate the Transformer; elsewhere int8 shrinks.
        assert len(result.tflite) < 0.6 * len(current.float_tflite)
    predictions = run_tflite(result.tflite, current.test_features)
    assert agreement(predictions, reference(current)) >= 0.85


@pytest.mark.parametrize("family", ["mlp", pytest.param("transformer", marks=pytest.mark.slow)])
def test_pruning_then_qat_keeps_the_zeros_in_the_int8_weights(
    zoo: dict[str, Zoo], family: str
) -> None:
    current = zoo[family]
    result = qat.prune_quantize_aware(
        current.model, current.train, heads=current.heads, target_sparsity=0.5, epochs=1
    )
    assert result.method == "prune+qat"
    assert_keeps_names(result, current)
    assert result.details["sparsity_after_qat"].keys() == result.details["sparsity"].keys()
    for name, value in result.details["sparsity_after_qat"].items():
        assert value >= 0.45, name
    if family == "transformer":  # float attention: tfmot's prune-preserving scheme cannot apply
        assert result.details["scheme"] == "default_8bit"
        assert "encoder_block0_attention" in result.details["float_layers"]
        return
    assert result.details["scheme"] == "prune_preserve"
    interpreter = Interpreter(model_content=result.tflite)
    interpreter.allocate_tensors()
    kernels = [
        interpreter.get_tensor(detail["index"])
        for detail in interpreter.get_tensor_details()
        if detail["dtype"] == np.int8
        and len(detail["shape"]) == 2
        and "MatMul" in detail["name"]
        and detail["shape"][0] > 1
    ]
    assert len(kernels) == 2  # both Dense kernels, stored as int8
    assert all(zeros(kernel) >= 0.45 for kernel in kernels)


# -- clustering -----------------------------------------------------------------------


@pytest.mark.parametrize("family", FINE_TUNED_FAMILIES)
def test_clustering_leaves_at_most_the_requested_distinct_values(
    zoo: dict[str, Zoo], family: str
) -> None:
    current = zoo[family]
    result = clustering.cluster(
        current.model, current.train, heads=current.heads, number_of_clusters=8, epochs=1
    )
    assert result.method == "cluster"
    assert_keeps_names(result, current)
    assert result.keras_model is not None
    for name in result.details["clustered_layers"]:
        layer = result.keras_model.get_layer(name)
        kernels = [w.numpy() for w in layer.weights if "kernel" in w.name]
        assert kernels and all(len(np.unique(kernel)) <= 8 for kernel in kernels), name
    if family == "transformer":
        assert "encoder_embedding" in result.details["unclustered_layers"]
        assert "encoder_block0_attention" in result.details["clustered_layers"]
    predictions = run_tflite(result.tflite, current.test_features)
    assert agreement(predictions, reference(current)) >= 0.7


# -- data that does not fit the model --------------------------------------------------


def test_training_data_refuses_a_dataset_without_the_model_inputs(zoo: dict[str, Zoo]) -> None:
    mlp, text = zoo["mlp"], zoo["transformer"]
    with pytest.raises(CompressionError, match=r"reads \['pixels'\].*\['text'\]"):
        training_data(text.source.dataset_dir, mlp.model, mlp.heads)
    with pytest.raises(CompressionError, match="no split 'holdout'"):
        training_data(mlp.source.dataset_dir, mlp.model, mlp.heads, split="holdout")
