"""``slipway publish``: any SavedModel with a serving_default signature becomes a verified
version of a model repository, atomically; anything else is a clear error, exit 2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import tensorflow as tf

from contracts.model_manifest import verify_model_dir
from serving.repository import ModelRepository
from slipway.cli import main
from tests.support.serving_models import ServingModel

MODEL = "foreign"


@pytest.fixture(scope="module")
def plain_saved_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SavedModel exported by plain TensorFlow code, with no slipway.json."""

    class Doubler(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="x")])
        def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"y": x * 2.0}

    directory = tmp_path_factory.mktemp("export") / "doubler"
    module = Doubler()
    tf.saved_model.save(module, str(directory), signatures={"serving_default": module.serve})
    return directory


def test_publish_writes_a_verified_version_the_gateway_serves(
    plain_saved_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "models"
    assert (
        main(["publish", str(plain_saved_model), "--model", MODEL, "--model-root", str(root)]) == 0
    )
    assert f"published {MODEL} version 1" in capsys.readouterr().out
    version_dir = root / MODEL / "1"
    assert verify_model_dir(version_dir) == []
    manifest = json.loads((version_dir / "slipway.json").read_text())
    assert manifest["name"] == MODEL and manifest["version"] == 1
    assert manifest["signature"] == {
        "name": "serving_default",
        "inputs": {"x": {"dtype": "float32", "shape": [-1, 3]}},
        "outputs": {"y": {"dtype": "float32", "shape": [-1, 3]}},
    }
    assert "saved_model.pb" in manifest["files"]
    assert all(len(entry["sha256"]) == 64 for entry in manifest["files"].values())
    # Nothing is left behind: no staging directory, the source untouched.
    assert sorted(p.name for p in (root / MODEL).iterdir()) == ["1"]
    assert not (plain_saved_model / "slipway.json").exists()

    # The next publish takes the next number; strict mode serves both.
    assert (
        main(["publish", str(plain_saved_model), "--model", MODEL, "--model-root", str(root)]) == 0
    )
    repository = ModelRepository(root, strict=True)
    try:
        repository.poll()
        assert repository.versions(MODEL) == [2]
        with repository.servable(MODEL) as servable:
            out = servable.run("serving_default", {"x": tf.ones([1, 3]).numpy()})
        assert out["y"].tolist() == [[2.0, 2.0, 2.0]]
    finally:
        repository.stop()


def test_a_keras_export_keeps_its_signature(tmp_path: Path, serving_model: ServingModel) -> None:
    root = tmp_path / "models"
    source = tmp_path / "keras"
    shutil.copytree(serving_model.saved_model_dir, source)
    args = ["publish", str(source), "--model", "digits", "--model-root", str(root)]
    assert main([*args, "--version", "7"]) == 0
    manifest = json.loads((root / "digits" / "7" / "slipway.json").read_text())
    assert manifest["signature"]["inputs"] == serving_model.signature_json()["inputs"]
    assert manifest["signature"]["outputs"] == serving_model.signature_json()["outputs"]
    # An existing version is never replaced.
    assert main([*args, "--version", "7"]) == 2


def test_a_directory_that_is_not_a_saved_model_is_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    root = tmp_path / "models"
    assert main(["publish", str(empty), "--model", MODEL, "--model-root", str(root)]) == 2
    assert "not a SavedModel directory" in capsys.readouterr().err
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "saved_model.pb").write_bytes(b"\xff\xfenot a proto")
    assert main(["publish", str(garbage), "--model", MODEL, "--model-root", str(root)]) == 2
    assert "not a readable SavedModel" in capsys.readouterr().err
    assert not (root / MODEL).exists() or not any((root / MODEL).iterdir())


def test_a_saved_model_without_serving_default_is_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    class Other(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
        def other(self, x: tf.Tensor) -> tf.Tensor:
            return x

    module = Other()
    source = tmp_path / "other"
    tf.saved_model.save(module, str(source), signatures={"score": module.other})
    root = tmp_path / "models"
    assert main(["publish", str(source), "--model", MODEL, "--model-root", str(root)]) == 2
    err = capsys.readouterr().err
    assert "no 'serving_default' signature" in err and "score" in err
    assert not (root / MODEL).exists()


def test_a_bad_model_name_is_exit_2(plain_saved_model: Path, tmp_path: Path) -> None:
    root = tmp_path / "models"
    assert (
        main(["publish", str(plain_saved_model), "--model", "../x", "--model-root", str(root)]) == 2
    )


def test_a_version_that_would_change_the_models_contract_is_exit_2_naming_each_change(
    plain_saved_model: Path,
    tmp_path: Path,
    serving_model: ServingModel,
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = tmp_path / "models"
    args = ["--model", MODEL, "--model-root", str(root)]
    assert main(["publish", str(serving_model.saved_model_dir), *args]) == 0
    capsys.readouterr()

    assert main(["publish", str(plain_saved_model), *args]) == 2
    error = " ".join(capsys.readouterr().err.split())
    assert f"the serving contract differs from {MODEL} version 1:" in error
    for inputs in serving_model.signature_json()["inputs"]:
        assert f"input {inputs!r} is missing" in error
    assert "input 'x' is new" in error and "output 'y' is new" in error
    assert "--allow-contract-change publishes it anyway" in error
    assert sorted(p.name for p in (root / MODEL).iterdir()) == ["1"]

    assert main(["publish", str(plain_saved_model), *args, "--allow-contract-change"]) == 0
    assert sorted(p.name for p in (root / MODEL).iterdir()) == ["1", "2"]
