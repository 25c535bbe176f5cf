"""What the gateway trusts on disk: slipway.json, file checksums and path safety."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from contracts.model_manifest import list_files, verify_files
from serving.errors import DataLoss, InvalidArgument, PermissionDenied
from serving.model_files import model_format, read_model_manifest, safe_join, validate_model_name
from tests.support.serving_models import ServingModel


@pytest.fixture
def version_dir(tmp_path: Path, serving_model: ServingModel) -> Path:
    directory = tmp_path / "digits" / "1"
    serving_model.write_version(directory)
    return directory


def test_an_exported_version_verifies(version_dir: Path) -> None:
    manifest = read_model_manifest(version_dir)
    assert manifest is not None and manifest["name"] == "digits"
    assert "saved_model.pb" in manifest["files"]
    assert verify_files(version_dir, manifest) == []
    assert model_format(version_dir) == "savedmodel"


def test_tampered_file_is_detected(version_dir: Path) -> None:
    manifest = read_model_manifest(version_dir)
    data = version_dir / "variables" / "variables.data-00000-of-00001"
    content = bytearray(data.read_bytes())
    content[len(content) // 2] ^= 0xFF  # same size, different bytes
    data.write_bytes(bytes(content))
    assert verify_files(version_dir, manifest) == [
        "variables/variables.data-00000-of-00001: SHA-256 does not match"
    ]


def test_truncated_missing_and_unlisted_files_are_detected(version_dir: Path) -> None:
    manifest = read_model_manifest(version_dir)
    index = version_dir / "variables" / "variables.index"
    size = index.stat().st_size
    index.write_bytes(index.read_bytes()[:-1])
    (version_dir / "fingerprint.pb").unlink()
    (version_dir / "assets" / "extra.bin").parent.mkdir(exist_ok=True)
    (version_dir / "assets" / "extra.bin").write_bytes(b"injected")
    assert verify_files(version_dir, manifest) == [
        "fingerprint.pb: missing",
        f"variables/variables.index: {size - 1} bytes, expected {size}",
        "assets/extra.bin: not listed in slipway.json",
    ]


def test_manifest_entries_cannot_point_outside(version_dir: Path) -> None:
    manifest = read_model_manifest(version_dir)
    (version_dir.parent / "secret").write_text("x")
    manifest["files"]["../secret"] = {"sha256": "0" * 64, "bytes": 1}
    manifest["files"]["odd"] = "not an entry"
    problems = verify_files(version_dir, manifest)
    assert "../secret: path leaves the version directory" in problems
    assert "odd: malformed entry 'not an entry'" in problems


def test_symlinks_leading_out_are_refused(version_dir: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"secret")
    (version_dir / "link.bin").symlink_to(outside)
    manifest = read_model_manifest(version_dir)
    problems = verify_files(version_dir, manifest)
    assert "link.bin: symlink leads outside the version directory" in problems
    with pytest.raises(PermissionDenied, match="leads outside"):
        safe_join(version_dir, "link.bin")


def test_symlinks_inside_the_root_are_followed(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    assert safe_join(tmp_path, "alias") == tmp_path / "alias"


@pytest.mark.parametrize("part", ["..", ".", "", "a/b", "a\\b", "/etc", "x\x00y"])
def test_safe_join_refuses_anything_but_plain_names(tmp_path: Path, part: str) -> None:
    with pytest.raises(InvalidArgument, match="not a plain file or directory name"):
        safe_join(tmp_path, "model", part)


def test_missing_manifest_means_a_plain_savedmodel(
    tmp_path: Path, serving_model: ServingModel
) -> None:
    serving_model.write_version(tmp_path, manifest=False)
    assert read_model_manifest(tmp_path) is None
    assert model_format(tmp_path) == "savedmodel"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "slipway.json: unreadable"),
        (json.dumps({"format": "other/1"}), "slipway.json: not a slipway.model/1 manifest"),
        (json.dumps([1, 2]), "slipway.json: not a slipway.model/1 manifest"),
    ],
)
def test_untrustworthy_manifest_is_data_loss(tmp_path: Path, content: str, message: str) -> None:
    (tmp_path / "slipway.json").write_text(content)
    with pytest.raises(DataLoss, match=message):
        read_model_manifest(tmp_path)


def test_a_manifest_symlinked_from_outside_is_data_loss(tmp_path: Path) -> None:
    version_dir = tmp_path / "1"
    version_dir.mkdir()
    (tmp_path / "elsewhere.json").write_text(json.dumps({"format": "slipway.model/1"}))
    (version_dir / "slipway.json").symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(DataLoss, match="slipway.json: leads outside the version directory"):
        read_model_manifest(version_dir)


def test_files_entry_must_be_an_object(tmp_path: Path) -> None:
    assert verify_files(tmp_path, {"format": "slipway.model/1", "files": []}) == [
        "slipway.json: 'files' must be an object"
    ]


def test_model_format_and_listing(tmp_path: Path) -> None:
    assert model_format(tmp_path) is None
    (tmp_path / "model.tflite").write_bytes(b"TFL3")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a").write_text("a")
    os.symlink(tmp_path / "sub", tmp_path / "linked")
    assert model_format(tmp_path) == "tflite"
    assert list_files(tmp_path) == ["linked", "model.tflite", "sub/a"]


@pytest.mark.parametrize("name", ["digits", "my-model.v2", "A_1"])
def test_valid_model_names(name: str) -> None:
    assert validate_model_name(name) == name


@pytest.mark.parametrize("name", ["", ".hidden", "-x", "a/b", "a b", "..", "é"])
def test_invalid_model_names(name: str) -> None:
    with pytest.raises(InvalidArgument, match="model name"):
        validate_model_name(name)
