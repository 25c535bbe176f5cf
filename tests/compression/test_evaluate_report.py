"""Evaluation numbers, the report files, the accuracy gate and publishing, on a small MLP.

Every figure is checked against an independent computation: accuracy against the Keras
model's own predictions, sizes against the bytes on disk, agreement of the float TFLite
conversion against the SavedModel it came from.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import shutil
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras
from ai_edge_litert.interpreter import Interpreter

from compression import ptq
from compression.errors import CompressionError
from compression.evaluate import (
    EvalSettings,
    TFLiteRunner,
    directory_gzip_size,
    evaluate_saved_model,
    evaluate_tflite,
)
from compression.loading import load_version
from compression.pipeline import (
    CompressOptions,
    MethodOptions,
    MethodRunner,
    choose,
    compress,
)
from compression.publish import publish_compressed
from compression.quality_gate import QualityGate
from compression.report import FAILED, PASSED
from compression.result import CompressedModel
from contracts.dataset_manifest import load_manifest
from contracts.model_manifest import MANIFEST_FILE, verify_model_dir, write_model_manifest
from contracts.model_repository import publish_version
from contracts.serving_contract import ContractChangeError, contract_differences
from research.data.input_pipeline import make_dataset
from serving.backends import open_backend
from tests.support.compression_models import SourceModel
from training.export import save_serving_model

FAST = EvalSettings(latency_runs=30, warmup_runs=3, throughput_seconds=0.0)


@pytest.fixture(scope="module")
def baseline(mlp_source: SourceModel):
    return evaluate_saved_model(mlp_source.version_dir, mlp_source.dataset_dir, settings=FAST)


def options(tmp_path: Path, methods: list[str], **overrides) -> CompressOptions:
    return CompressOptions(
        methods=methods,
        settings=FAST,
        method_options=MethodOptions(epochs=1),
        repository=tmp_path / "repo",
        **overrides,
    )


def versions(repository: Path) -> list[Path]:
    return sorted(p for p in repository.glob("*/*") if p.is_dir()) if repository.exists() else []


# -- evaluation -------------------------------------------------------------------------


def test_accuracy_equals_a_direct_computation(mlp_source: SourceModel, baseline) -> None:
    model = keras.models.load_model(mlp_source.version_dir, compile=False)
    hits, count = 0, 0
    for features, labels in make_dataset(
        mlp_source.dataset_dir, "test", batch_size=50, shuffle=False
    ):
        predicted = np.argmax(model(features, training=False)["label"].numpy(), axis=-1)
        hits += int(np.sum(predicted == labels.numpy()))
        count += len(predicted)
    assert count == load_manifest(mlp_source.dataset_dir).splits["test"].num_records
    assert baseline.examples == count
    assert baseline.accuracy == {"label": pytest.approx(hits / count, abs=1e-12)}
    assert baseline.agreement is None and baseline.max_abs_diff is None
    assert 0 < baseline.latency_p50_ms <= baseline.latency_p99_ms
    assert baseline.throughput > 0


def test_float_tflite_agrees_with_the_saved_model(mlp_source: SourceModel, baseline) -> None:
    model = load_version(mlp_source.version_dir).model
    tflite = ptq.float32(model).tflite
    evaluation = evaluate_tflite(
        tflite, mlp_source.dataset_dir, reference_outputs=baseline.outputs, settings=FAST
    )
    assert evaluation.agreement == {"label": 1.0}
    assert evaluation.max_abs_diff < 1e-4
    assert evaluation.accuracy == baseline.accuracy
    np.testing.assert_allclose(evaluation.outputs["label"], baseline.outputs["label"], atol=1e-4)


def test_sizes_are_the_files_sizes_and_gzip_is_smaller(mlp_source: SourceModel, baseline) -> None:
    model = load_version(mlp_source.version_dir).model
    tflite = ptq.float32(model).tflite
    evaluation = evaluate_tflite(tflite, mlp_source.dataset_dir, settings=FAST)
    assert evaluation.size_bytes == len(tflite)
    assert evaluation.gzip_bytes == len(gzip.compress(tflite, compresslevel=9))
    assert evaluation.gzip_bytes < evaluation.size_bytes
    files = [
        p for p in mlp_source.version_dir.rglob("*") if p.is_file() and p.name != MANIFEST_FILE
    ]
    assert baseline.size_bytes == sum(p.stat().st_size for p in files)
    assert baseline.gzip_bytes == directory_gzip_size(mlp_source.version_dir)
    assert baseline.gzip_bytes < baseline.size_bytes


def test_int8_io_inputs_are_quantized_with_the_tensor_parameters(
    mlp_source: SourceModel, baseline
) -> None:
    runner = MethodRunner(
        load_version(mlp_source.version_dir), mlp_source.dataset_dir, MethodOptions()
    )
    tflite = runner.run("int8_io").tflite
    signature = TFLiteRunner(tflite).signature()
    assert signature["inputs"]["pixels"]["dtype"] == "int8"
    assert signature["inputs"]["pixels"]["quantization"]["scale"] > 0
    evaluation = evaluate_tflite(
        tflite, mlp_source.dataset_dir, reference_outputs=baseline.outputs, settings=FAST
    )
    # Dequantized outputs are probabilities on the float model's scale.
    assert evaluation.max_abs_diff < 0.2
    assert evaluation.agreement["label"] > 0.9
    assert abs(evaluation.accuracy["label"] - baseline.accuracy["label"]) < 0.05


# -- report and gate ------------------------------------------------------------------


def test_report_is_written_with_the_baseline_first(mlp_source: SourceModel, tmp_path: Path) -> None:
    run = compress(
        mlp_source.version_dir,
        mlp_source.dataset_dir,
        options(tmp_path, ["int8"]),
        tmp_path / "report",
    )
    report = json.loads(run.files.json.read_text())
    methods = [(r["method"], r["artifact"], r["status"]) for r in report["results"]]
    assert methods[0] == ("float32", "SavedModel", "baseline")
    assert [m[:2] for m in methods[1:]] == [("float32", "TFLite"), ("int8", "TFLite")]
    int8 = report["results"][2]
    assert int8["size_bytes"] == len(run.outcomes["int8"].compressed.tflite)
    # Both files are stripped alike; what the converter wrote is recorded beside them.
    for row in report["results"][1:]:
        assert row["size_bytes"] < row["details"]["converter_bytes"]
    assert int8["size_ratio"] == pytest.approx(
        int8["size_bytes"] / report["results"][1]["size_bytes"]
    )
    # Judged against the float32 TFLite, the file it replaces, not the SavedModel.
    assert int8["accuracy_drop"] == pytest.approx(
        100 * (report["results"][1]["accuracy"] - int8["accuracy"])
    )
    assert report["published"] is None

    table = [line for line in run.files.markdown.read_text().splitlines() if line.startswith("|")]
    assert table[0].startswith("| method | artifact | accuracy |")
    assert table[2].startswith("| float32 | SavedModel |")
    assert table[3].startswith("| float32 | TFLite |") and table[4].startswith("| int8 | TFLite |")

    image = run.files.plot.read_bytes()
    assert image[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    height, width, _ = matplotlib.image.imread(run.files.plot).shape
    assert width > 1000 and height > 500


def test_gate_marks_a_drop_beyond_the_limit_failed(baseline) -> None:
    worse = {"label": baseline.accuracy["label"] - 0.02}
    failing = dataclasses.replace(baseline, accuracy=worse)
    status, drop, note = QualityGate(max_accuracy_drop=1.0).judge(baseline, failing)
    assert (status, drop) == (FAILED, pytest.approx(2.0))
    assert "2.00 points" in note
    assert QualityGate(max_accuracy_drop=2.5).judge(baseline, failing)[0] == PASSED


@pytest.mark.parametrize("figure", ["accuracy", "mae"])
def test_gate_fails_a_result_whose_figures_are_not_finite(baseline, figure: str) -> None:
    broken = dataclasses.replace(baseline, **{figure: {"label": float("nan")}})
    status, drop, note = QualityGate(max_accuracy_drop=100.0).judge(baseline, broken)
    assert (status, drop) == (FAILED, None)
    assert f"{figure} of 'label' is nan" in note


def test_a_failing_result_is_marked_and_never_published(
    mlp_source: SourceModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An int8 model of untrained weights: a real, measured result far below the gate."""
    original = MethodRunner.run

    def untrained(self: MethodRunner, method: str) -> CompressedModel:
        if method != "int8":
            return original(self, method)
        fresh = keras.models.clone_model(self.model)  # new random weights
        return ptq.full_integer(fresh, self.representative())

    monkeypatch.setattr(MethodRunner, "run", untrained)
    run = compress(
        mlp_source.version_dir,
        mlp_source.dataset_dir,
        options(tmp_path, ["int8"], publish="int8"),
        tmp_path / "report",
    )
    row = run.outcomes["int8"].row
    assert row.status == FAILED and row.accuracy_drop > 1.0
    assert run.published is None
    assert run.refusal.startswith("int8 failed the quality gate")
    assert choose(run.outcomes, "auto") == (None, "no integer result passed the quality gate; "
                                            "nothing published")  # fmt: skip
    assert versions(tmp_path / "repo") == []
    report = json.loads(run.files.json.read_text())
    assert report["results"][2]["status"] == "failed" and report["published"] is None
    assert "| failed: accuracy drops" in run.files.markdown.read_text()


# -- publishing -----------------------------------------------------------------------


def test_published_version_loads_and_predicts_like_the_result(
    mlp_source: SourceModel, tmp_path: Path
) -> None:
    run = compress(
        mlp_source.version_dir,
        mlp_source.dataset_dir,
        options(tmp_path, ["prune"], publish="prune", max_accuracy_drop=5.0),
        tmp_path / "report",
    )
    assert run.published is not None
    version, path = run.published
    assert (version, path) == (1, (tmp_path / "repo" / "mlp" / "1").resolve())
    assert verify_model_dir(path) == []
    result = run.outcomes["prune"].compressed
    features = {"pixels": run.data.features["pixels"][:16]}
    expected = result.keras_model(features, training=False)["label"].numpy()

    # served from raw pixels, which the version standardizes in its graph as training did
    (raw, _), *_ = make_dataset(
        mlp_source.dataset_dir, "test", batch_size=16, shuffle=False, raw=True
    )
    serving = tf.saved_model.load(str(path)).signatures["serving_default"]
    answer = serving(pixels=raw["pixels"])
    np.testing.assert_allclose(answer["label"].numpy(), expected, atol=1e-5)
    assert answer["label_classes"].numpy()[0].tolist() == [str(i).encode() for i in range(10)]
    assert (path / "model.tflite").read_bytes() == result.tflite
    interpreter = Interpreter(model_path=str(path / "model.tflite"))
    from_disk = interpreter.get_signature_runner("serving_default")(pixels=features["pixels"])
    in_memory = TFLiteRunner(result.tflite)
    np.testing.assert_allclose(
        from_disk["label"], in_memory.invoke(in_memory.feed(features))["label"], atol=0
    )
    np.testing.assert_allclose(from_disk["label"], expected, atol=1e-4)

    manifest = json.loads((path / MANIFEST_FILE).read_text())
    assert manifest["compression"]["method"] == "prune"
    assert manifest["compression"]["details"]["overall_sparsity"] == pytest.approx(0.5, abs=0.02)
    assert (
        manifest["metrics"]["test"]["label_accuracy"]
        == run.outcomes["prune"].row.evaluation.accuracy["label"]
    )
    assert manifest["provenance"]["source"]["version"] == 1
    assert manifest["provenance"]["source"]["provenance"]["dataset"] == "digits-vectors"
    assert manifest["labels"]["label"]["kind"] == "classification"
    assert json.loads(run.files.json.read_text())["published"]["version"] == 1
    assert load_version(path).signature["inputs"]["pixels"]["shape"] == [-1, 64]


def test_integer_only_result_is_published_as_tflite(
    mlp_source: SourceModel, tmp_path: Path
) -> None:
    run = compress(
        mlp_source.version_dir,
        mlp_source.dataset_dir,
        options(tmp_path, ["int8"], publish="auto", max_accuracy_drop=5.0),
        tmp_path / "report",
    )
    _, path = run.published
    assert sorted(p.name for p in path.iterdir()) == [
        "model.tflite", "preprocessing", MANIFEST_FILE
    ]  # fmt: skip
    manifest = json.loads((path / MANIFEST_FILE).read_text())
    assert manifest["provenance"]["method"] == "int8"
    assert manifest["signature"]["inputs"]["pixels"]["dtype"] == "float32"
    assert verify_model_dir(path) == []
    # the gateway's backend takes raw pixels through the preprocessing beside the core
    (raw, _), *_ = make_dataset(
        mlp_source.dataset_dir, "test", batch_size=16, shuffle=False, raw=True
    )
    backend = open_backend(path)
    try:
        answers = backend.run("serving_default", {"pixels": raw["pixels"].numpy()})
        served_signature = backend.signatures["serving_default"]
    finally:
        backend.close()
    runner = TFLiteRunner(run.outcomes["int8"].compressed.tflite)
    direct = runner.invoke(runner.feed({"pixels": run.data.features["pixels"][:16]}))["label"]
    np.testing.assert_allclose(answers["label"], direct, atol=1e-6)

    # the float version's serving contract, class names included, kept to the letter
    source = json.loads((mlp_source.version_dir / MANIFEST_FILE).read_text())["signature"]
    assert manifest["signature"]["outputs"] == source["outputs"]
    assert contract_differences(source, manifest["signature"]) == []
    assert sorted(served_signature.outputs) == ["label", "label_classes"]
    assert answers["label_classes"].shape == (16, 10)
    assert answers["label_classes"][3].tolist() == [str(i).encode() for i in range(10)]


def test_a_result_whose_contract_differs_from_the_newest_version_is_not_published(
    mlp_source: SourceModel, tmp_path: Path
) -> None:
    """The repository's newest version answers ``label`` as ``[-1, 12]`` and has no
    ``label_classes``: publishing int8 there would change what its clients get."""
    newest = tmp_path / "repo" / "mlp" / "3"
    shutil.copytree(mlp_source.version_dir, newest)
    manifest = json.loads((newest / MANIFEST_FILE).read_text())
    manifest["signature"]["outputs"] = {"label": {"dtype": "float32", "shape": [-1, 12]}}
    (newest / MANIFEST_FILE).write_text(json.dumps(manifest))

    run = compress(
        mlp_source.version_dir,
        mlp_source.dataset_dir,
        options(tmp_path, ["int8"], publish="int8", max_accuracy_drop=5.0),
        tmp_path / "report",
    )
    assert run.published is None
    assert run.refusal == (
        "int8: the serving contract differs from mlp version 3: output 'label_classes' is new; "
        "output 'label' shape [-1, 12] -> [-1, 10] (clients of that version would break; "
        "--allow-contract-change publishes it anyway)"
    )
    assert versions(tmp_path / "repo") == [newest]

    outcome = run.outcomes["int8"]
    published = partial(
        publish_compressed,
        outcome.compressed,
        outcome.row.evaluation,
        source=run.source,
        data_manifest=load_manifest(mlp_source.dataset_dir),
        dataset_dir=mlp_source.dataset_dir,
        split="test",
        repository=tmp_path / "repo",
    )
    with pytest.raises(ContractChangeError, match="output 'label_classes' is new"):
        published()
    assert published(allow_contract_change=True)[0] == 4


# -- bad input ------------------------------------------------------------------------


def test_unsupported_method_is_named_before_anything_runs(tmp_path: Path) -> None:
    with pytest.raises(CompressionError, match="unsupported compression method 'int4'"):
        options(tmp_path, ["int8", "int4"])


def test_model_without_serving_default_is_refused(mlp_source: SourceModel, tmp_path: Path) -> None:
    model = load_version(mlp_source.version_dir).model
    plain = tmp_path / "plain" / "1"
    function = tf.function(lambda pixels: model(pixels), input_signature=[
        tf.TensorSpec([None, 64], tf.float32, name="pixels")])  # fmt: skip
    tf.saved_model.save(model, str(plain), signatures={"predict": function})
    with pytest.raises(CompressionError, match="no 'serving_default' signature"):
        compress(plain, mlp_source.dataset_dir, options(tmp_path, ["int8"], publish="auto"),
                 tmp_path / "report")  # fmt: skip
    assert versions(tmp_path / "repo") == []


def _edited_dataset(mlp_source: SourceModel, tmp_path: Path, edit) -> Path:  # noqa: ANN001
    copy = tmp_path / "dataset"
    shutil.copytree(mlp_source.dataset_dir, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    edit(manifest["features"])
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda f: f.update(pix=f.pop("pixels")), r"reads \['pixels'\].*does not have"),
        (lambda f: f["pixels"].update(shape=[32]), r"input 'pixels' has shape \[64\].*\[32\]"),
    ],
    ids=["input-name", "shape"],
)
def test_dataset_that_does_not_match_the_model_is_refused(
    mlp_source: SourceModel,
    tmp_path: Path,
    edit,
    message: str,  # noqa: ANN001
) -> None:
    dataset = _edited_dataset(mlp_source, tmp_path, edit)
    with pytest.raises(CompressionError, match=message):
        compress(mlp_source.version_dir, dataset, options(tmp_path, ["int8"], publish="auto"),
                 tmp_path / "report")  # fmt: skip
    assert versions(tmp_path / "repo") == []
    assert not (tmp_path / "report").exists()


def test_dataset_dtype_that_does_not_match_the_model_is_refused(
    mlp_source: SourceModel, tmp_path: Path
) -> None:
    """A model taking integer ids under the dataset's float feature name."""
    ids = keras.Input((64,), dtype="int64", name="pixels")
    hidden = keras.layers.Dense(4)(ids)  # Dense casts integer inputs itself
    label = keras.layers.Dense(10, activation="softmax", name="label")(hidden)
    model = keras.Model({"pixels": ids}, {"label": label})

    def write(directory: Path) -> None:
        write_model_manifest(
            directory, {"name": "ids", "signature": save_serving_model(model, directory)}
        )

    _, version_dir = publish_version(tmp_path / "models", "ids", write)
    with pytest.raises(
        CompressionError, match="'pixels': the model takes int64 but the dataset holds float32"
    ):
        compress(version_dir, mlp_source.dataset_dir, options(tmp_path, ["int8"], publish="auto"),
                 tmp_path / "report")  # fmt: skip
    assert versions(tmp_path / "repo") == []
