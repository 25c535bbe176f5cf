"""The model artifact: named serving signature, checksummed slipway.json, and versions
that appear atomically, never overwrite one another and never collide."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras
from tensorflow.core.protobuf import saved_model_pb2

from contracts.model_manifest import (
    MANIFEST_FILE,
    file_checksums,
    verify_model_dir,
    write_model_manifest,
)
from contracts.model_repository import VersionExistsError, existing_versions, publish_version
from training.export import COMPILE_WARNING, git_commit, save_serving_model


@pytest.fixture(scope="module")
def model() -> keras.Model:
    """Two named inputs (one int64) and two named outputs, with an optimizer attached."""
    keras.utils.set_random_seed(0)
    image = keras.Input((8, 8, 1), name="image")
    extra = keras.Input((3,), name="extra", dtype="int64")
    features = keras.layers.Concatenate()(
        [keras.layers.Flatten()(image), keras.layers.Lambda(lambda t: tf.cast(t, "float32"))(extra)]
    )
    hidden = keras.layers.Dense(16, activation="relu")(features)
    label = keras.layers.Dense(10, activation="softmax", name="label")(hidden)
    value = keras.layers.Dense(1, name="value")(hidden)
    built = keras.Model([image, extra], [label, value])
    built.compile("adam", ["sparse_categorical_crossentropy", "mse"])
    return built


@pytest.fixture(scope="module")
def exported(model: keras.Model, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    directory = tmp_path_factory.mktemp("export") / "model"
    return directory, save_serving_model(model, directory)


def batch(size: int = 5) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "image": rng.normal(size=(size, 8, 8, 1)).astype(np.float32),
        "extra": rng.integers(0, 5, size=(size, 3)).astype(np.int64),
    }


def test_signature_uses_the_model_names(exported: tuple[Path, dict]) -> None:
    directory, signature = exported
    assert signature == {
        "name": "serving_default",
        "inputs": {
            "image": {"dtype": "float32", "shape": [-1, 8, 8, 1]},
            "extra": {"dtype": "int64", "shape": [-1, 3]},
        },
        "outputs": {
            "label": {"dtype": "float32", "shape": [-1, 10]},
            "value": {"dtype": "float32", "shape": [-1, 1]},
        },
    }
    loaded = tf.saved_model.load(str(directory)).signatures["serving_default"]
    assert set(loaded.structured_input_signature[1]) == {"image", "extra"}
    assert set(loaded.structured_outputs) == {"label", "value"}


def test_reloaded_signature_predicts_like_the_model(
    model: keras.Model, exported: tuple[Path, dict]
) -> None:
    directory, _ = exported
    inputs = batch()
    served = tf.saved_model.load(str(directory)).signatures["serving_default"](
        **{name: tf.constant(value) for name, value in inputs.items()}
    )
    label, value = model.predict([inputs["image"], inputs["extra"]], verbose=0)
    np.testing.assert_allclose(served["label"].numpy(), label, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(served["value"].numpy(), value, rtol=1e-5, atol=1e-6)


def test_export_leaves_out_the_optimizer_and_reloads_in_keras(
    model: keras.Model, exported: tuple[Path, dict]
) -> None:
    directory, _ = exported
    reader = tf.train.load_checkpoint(str(directory / "variables" / "variables"))
    assert not [key for key in reader.get_variable_to_shape_map() if "optimizer" in key]
    reloaded = keras.models.load_model(directory, compile=False)
    assert reloaded.input_names == model.input_names


def test_single_output_dict_input_model_is_keyed_by_names(tmp_path: Path) -> None:
    inputs = {"tokens": keras.Input((4,), name="tokens")}
    outputs = {"score": keras.layers.Dense(2, name="score")(inputs["tokens"])}
    signature = save_serving_model(keras.Model(inputs, outputs), tmp_path / "m")
    assert list(signature["inputs"]) == ["tokens"]
    assert list(signature["outputs"]) == ["score"]


def test_an_uncompiled_model_is_exported_without_keras_compile_warnings(tmp_path: Path) -> None:
    """Keras warns that "compiled metrics have yet to be built" when saving any model it
    never compiled (as a trainer with its own loop never does): noise on every
    ``slipway train``'s screen, about nothing."""
    inputs = {"x": keras.Input((3,), name="x")}
    model = keras.Model(inputs, {"y": keras.layers.Dense(1, name="y")(inputs["x"])})
    records: list[logging.LogRecord] = []
    collect = logging.Handler()
    collect.emit = records.append  # type: ignore[method-assign]
    logger = tf.get_logger()
    logger.addHandler(collect)
    try:
        save_serving_model(model, tmp_path / "export")
    finally:
        logger.removeHandler(collect)
    assert [r.getMessage() for r in records if COMPILE_WARNING in r.getMessage()] == []
    leftover = [f for f in logger.filters if type(f).__name__ == "_CompileWarningFilter"]
    assert leftover == []  # the filter is removed after the save


def test_manifest_checksums_verify_and_tampering_is_detected(
    exported: tuple[Path, dict], tmp_path: Path
) -> None:
    directory = tmp_path / "model"
    shutil.copytree(exported[0], directory)
    written = write_model_manifest(directory, {"name": "digits", "signature": exported[1]})
    on_disk = json.loads((directory / MANIFEST_FILE).read_text())
    assert on_disk == written
    assert on_disk["format"] == "slipway.model/1"
    assert on_disk["created"].endswith("Z")
    assert {"saved_model.pb", "variables/variables.index"} <= set(on_disk["files"])
    assert MANIFEST_FILE not in on_disk["files"]
    assert verify_model_dir(directory) == []

    (data,) = (directory / "variables").glob("variables.data-*")
    content = bytearray(data.read_bytes())
    content[-1] ^= 0x01
    data.write_bytes(bytes(content))
    (directory / "stray.txt").write_text("not vouched for")
    (directory / "fingerprint.pb").unlink()
    problems = verify_model_dir(directory)
    assert f"variables/{data.name}: SHA-256 does not match" in problems
    assert "stray.txt: not listed in slipway.json" in problems
    assert "fingerprint.pb: missing" in problems
    assert len(problems) == 3


def test_manifest_problems_are_reported(tmp_path: Path) -> None:
    assert verify_model_dir(tmp_path) == ["slipway.json: missing"]
    (tmp_path / MANIFEST_FILE).write_text("{not json")
    assert verify_model_dir(tmp_path)[0].startswith("slipway.json: unreadable")
    with pytest.raises(ValueError, match="name"):
        write_model_manifest(tmp_path, {"signature": {}})
    with pytest.raises(ValueError, match="JSON"):
        write_model_manifest(tmp_path, {"name": "m", "signature": {}, "metrics": {"x": object()}})
    assert sorted(p.name for p in tmp_path.iterdir()) == [MANIFEST_FILE]


def write_files(content: str):
    def write(directory: Path) -> None:
        (directory / "saved_model.pb").write_text(content)
        write_model_manifest(directory, {"name": "digits", "signature": {}})

    return write


def test_versions_are_numbered_and_stamped_into_the_manifest(tmp_path: Path) -> None:
    assert publish_version(tmp_path, "digits", write_files("a")) == (1, tmp_path / "digits" / "1")
    assert publish_version(tmp_path, "digits", write_files("b"))[0] == 2
    assert publish_version(tmp_path, "digits", write_files("c"), version=10)[0] == 10
    number, path = publish_version(tmp_path, "digits", write_files("d"))
    assert number == 11
    assert json.loads((path / MANIFEST_FILE).read_text())["version"] == 11
    assert verify_model_dir(path) == []
    assert existing_versions(tmp_path / "digits") == [1, 2, 10, 11]
    assert sorted(p.name for p in (tmp_path / "digits").iterdir()) == ["1", "10", "11", "2"]


def test_an_existing_version_is_never_overwritten(tmp_path: Path) -> None:
    publish_version(tmp_path, "digits", write_files("first"))
    with pytest.raises(VersionExistsError):
        publish_version(tmp_path, "digits", write_files("second"), version=1)
    assert (tmp_path / "digits" / "1" / "saved_model.pb").read_text() == "first"
    assert sorted(p.name for p in (tmp_path / "digits").iterdir()) == ["1"]


def test_a_failed_write_leaves_no_staging_and_no_version(tmp_path: Path) -> None:
    def broken(directory: Path) -> None:
        (directory / "saved_model.pb").write_text("half")
        raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError, match="out of memory"):
        publish_version(tmp_path, "digits", broken)
    with pytest.raises(RuntimeError, match="nothing was written"):
        publish_version(tmp_path, "digits", lambda directory: None)
    assert list((tmp_path / "digits").iterdir()) == []


@pytest.mark.parametrize("name", ["", "../escape", "a/b", ".hidden", "..", "white space"])
def test_model_names_are_validated(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match="model name"):
        publish_version(tmp_path, name, write_files("x"))
    assert list(tmp_path.iterdir()) == []


def test_concurrent_publishers_get_distinct_versions(tmp_path: Path) -> None:
    publishers = 8
    start = threading.Barrier(publishers)
    results: dict[int, int] = {}
    errors: list[BaseException] = []

    def publish(index: int) -> None:
        def write(directory: Path) -> None:
            (directory / "saved_model.pb").write_text(f"publisher {index}")
            start.wait()  # every publisher holds a full staging dir before any renames

        try:
            results[index] = publish_version(tmp_path, "digits", write)[0]
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=publish, args=(i,)) for i in range(publishers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sorted(results.values()) == list(range(1, publishers + 1))
    for index, number in results.items():
        content = (tmp_path / "digits" / str(number) / "saved_model.pb").read_text()
        assert content == f"publisher {index}"
    assert sorted(p.name for p in (tmp_path / "digits").iterdir()) == sorted(
        str(n) for n in range(1, publishers + 1)
    )


def test_file_checksums_cover_nested_files(tmp_path: Path) -> None:
    (tmp_path / "variables").mkdir()
    (tmp_path / "variables" / "variables.index").write_bytes(b"abc")
    (tmp_path / MANIFEST_FILE).write_text("{}")
    assert file_checksums(tmp_path) == {
        "variables/variables.index": {
            "sha256": "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
            "bytes": 3,
        }
    }


def git(repo: Path, *args: str) -> str:
    """``git ARGS`` in ``repo`` as a committer with a name; its output."""
    return subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def test_git_commit_inside_and_outside_a_repository(tmp_path: Path) -> None:
    assert git_commit(tmp_path) is None
    assert git_commit(tmp_path / "missing" / "file.txt") is None
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    assert git_commit(repo) is None  # no commit yet
    (repo / "a.txt").write_text("a")
    git(repo, "add", "a.txt")
    git(repo, "commit", "-q", "-m", "a")
    head = git(repo, "rev-parse", "HEAD")
    assert git_commit(repo / "a.txt") == head


def _traced_layer_calls(directory: Path) -> set[str]:
    """The Keras layers whose call functions the SavedModel holds as traced graphs."""
    saved = saved_model_pb2.SavedModel.FromString((directory / "saved_model.pb").read_bytes())
    suffix = "_layer_call_and_return_conditional_losses"
    names = [f.signature.name for g in saved.meta_graphs for f in g.graph_def.library.function]
    return {name.split("__inference_")[-1].split(suffix)[0] for name in names if suffix in name}


def test_layer_calls_are_traced_only_for_classes_keras_cannot_rebuild(tmp_path: Path) -> None:
    """Built-in and registered layers are rebuilt from their configs, so their traces would
    only slow the export; an unregistered layer keeps them, and compression names it."""

    class Twice(keras.layers.Layer):  # never registered with Keras
        def call(self, x: tf.Tensor) -> tf.Tensor:
            return 2 * x

    inputs = keras.Input((3,), name="x")
    known = keras.Model(inputs, keras.layers.Dense(2, name="y")(inputs))
    save_serving_model(known, tmp_path / "known")
    assert _traced_layer_calls(tmp_path / "known") == set()
    reloaded = keras.models.load_model(tmp_path / "known", compile=False)
    np.testing.assert_allclose(reloaded(np.ones((1, 3))), known(np.ones((1, 3))))

    unknown = keras.Model(inputs, keras.layers.Dense(2, name="y")(Twice(name="twice")(inputs)))
    save_serving_model(unknown, tmp_path / "unknown")
    assert "twice" in _traced_layer_calls(tmp_path / "unknown")
