"""``slipway.json``: what a model version directory vouches for.

Training and compression write it beside ``saved_model.pb`` (or ``model.tflite``); the
gateway reads it before it loads anything. It records the SHA-256 and size of every other
file in the version, the ``serving_default`` signature, label classes, held-out metrics
and provenance::

    {"format": "slipway.model/1", "name": "digits", "version": 3,
     "created": "2026-11-23T18:00:00Z",
     "files": {"saved_model.pb": {"sha256": "…", "bytes": 123}, …},
     "signature": {"name": "serving_default",
                   "inputs": {"image": {"dtype": "float32", "shape": [-1, 8, 8, 1]}},
                   "outputs": {"label": {"dtype": "float32", "shape": [-1, 10]}}},
     "labels": {"label": ["0", "1", …]}, "preprocessing": {"inputs": ["image"]},
     "metrics": {…}, "provenance": {…}}

``preprocessing.inputs`` names the inputs the served graph takes raw (encoded images,
category and text strings, unscaled numbers) and preprocesses in the graph, as the
dataset's manifest describes them; a version without it takes the model's own inputs.

A version directory may have been touched by anyone with write access to the
repository, so reading it executes nothing, follows no symlink out of the directory,
and compares sizes before hashing so a truncated file is reported without reading it.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from contracts.atomic_files import write_json_atomically
from contracts.digests import file_entry, file_sha256
from contracts.metric_values import json_metrics

MANIFEST_FILE = "slipway.json"
FORMAT = "slipway.model/1"
SIGNATURE_KEY = "serving_default"
SAVED_MODEL_FILE = "saved_model.pb"
TFLITE_FILE = "model.tflite"
# A SavedModel beside a model that cannot run the preprocessing itself (a TFLite core):
# its serving_default turns the raw features clients send into the model's inputs.
PREPROCESSING_DIR = "preprocessing"
# The output beside a classification head's scores that holds its class names:
# ``<head><CLASSES_SUFFIX>``, as TF Serving's classify signatures put ``classes`` beside
# ``scores``.
CLASSES_SUFFIX = "_classes"
_MAX_MANIFEST_BYTES = 16 << 20
_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_ORDER = (
    "format", "name", "version", "created", "files", "signature",
    "labels", "preprocessing", "metrics", "provenance",
)  # fmt: skip


class ModelManifestError(ValueError):
    """A ``slipway.json`` exists but cannot be trusted, or cannot be written as given."""


def validate_model_name(name: str) -> str:
    """A model name is one path component that readers can put in a URL."""
    if not isinstance(name, str) or not _MODEL_NAME.fullmatch(name):
        raise ValueError(
            f"model name {name!r}: use letters, digits, '.', '_' and '-', "
            "starting with a letter or digit"
        )
    return name


# -- the files a manifest lists ---------------------------------------------------------


def list_files(directory: str | Path) -> list[str]:
    """Relative POSIX paths of the files under ``directory`` (symlinked dirs not entered)."""
    root = Path(directory)
    found = []
    for current, dirnames, filenames in os.walk(root):
        here = Path(current)
        names = filenames + [d for d in dirnames if (here / d).is_symlink()]
        found += [(here / name).relative_to(root).as_posix() for name in names]
    return sorted(found)


def file_checksums(directory: str | Path) -> dict[str, dict[str, Any]]:
    """``{relative posix path: {"sha256", "bytes"}}`` for every file but ``slipway.json``."""
    root = Path(directory)
    return {
        relative: file_entry(root / relative)
        for relative in list_files(root)
        if relative != MANIFEST_FILE
    }


def unsafe_links(directory: str | Path) -> list[str]:
    """Problems for symlinks under ``directory`` that lead outside it."""
    root = Path(directory).resolve()
    problems = []
    for relative in list_files(directory):
        path = Path(directory, relative)
        if path.is_symlink() and not path.resolve().is_relative_to(root):
            problems.append(f"{relative}: symlink leads outside the version directory")
    return problems


def _inside(root: Path, relative: str) -> Path | None:
    """``root/relative`` when that names a place inside ``root`` (symlinks resolved)."""
    parts = relative.split("/")
    if any(part in ("", ".", "..") or "\\" in part or "\x00" in part for part in parts):
        return None
    path = root.joinpath(*parts)
    return path if path.resolve().is_relative_to(root.resolve()) else None


def _check_entry(root: Path, relative: str, entry: Any) -> list[str]:
    if not isinstance(entry, Mapping) or not isinstance(entry.get("sha256"), str):
        return [f"{relative}: malformed entry {entry!r}"]
    expected_size = entry.get("bytes")
    if not isinstance(expected_size, int) or isinstance(expected_size, bool):
        return [f"{relative}: malformed entry {entry!r}"]
    path = _inside(root, relative)
    if path is None:
        return [f"{relative}: path leaves the version directory"]
    if not path.is_file():
        return [f"{relative}: missing"]
    try:
        size = path.stat().st_size
        if size != expected_size:
            return [f"{relative}: {size} bytes, expected {expected_size}"]
        if file_sha256(path) != entry["sha256"]:
            return [f"{relative}: SHA-256 does not match"]
    except OSError as exc:
        return [f"{relative}: unreadable: {exc.strerror or exc}"]
    return []


def check_files(directory: str | Path, expected: Mapping[str, Any]) -> list[str]:
    """Problems with the files ``expected`` lists under ``directory`` (empty when all match)."""
    root = Path(directory)
    problems = []
    for relative, entry in sorted(expected.items()):
        problems += _check_entry(root, relative, entry)
    return problems


def verify_files(version_dir: str | Path, manifest: Mapping[str, Any]) -> list[str]:
    """Problems with the version's files against ``manifest`` (empty when all match).

    Every listed file must exist with its recorded size and SHA-256, and every file
    present must be listed, so a tampered, truncated, missing or injected file is caught.
    """
    files = manifest.get("files")
    if not isinstance(files, Mapping):
        return [f"{MANIFEST_FILE}: 'files' must be an object"]
    problems = unsafe_links(version_dir) + check_files(version_dir, files)
    problems += [
        f"{relative}: not listed in {MANIFEST_FILE}"
        for relative in list_files(version_dir)
        if relative not in files and relative != MANIFEST_FILE
    ]
    return problems


# -- reading and writing -------------------------------------------------------------------


def read_model_manifest(version_dir: str | Path) -> dict[str, Any] | None:
    """The version's ``slipway.json``, or None when it has none (a plain SavedModel).

    A manifest that exists but cannot be trusted (unreadable, not JSON, another format,
    a symlink out of the directory) raises ``ModelManifestError``.
    """
    root = Path(version_dir)
    path = root / MANIFEST_FILE
    if not path.exists() and not path.is_symlink():
        return None
    if _inside(root, MANIFEST_FILE) is None:
        raise ModelManifestError(f"{MANIFEST_FILE}: leads outside the version directory")
    try:
        if path.stat().st_size > _MAX_MANIFEST_BYTES:
            raise ModelManifestError(f"{MANIFEST_FILE}: larger than {_MAX_MANIFEST_BYTES} bytes")
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        if isinstance(exc, ModelManifestError):
            raise
        raise ModelManifestError(f"{MANIFEST_FILE}: unreadable: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ModelManifestError(f"{MANIFEST_FILE}: not a {FORMAT} manifest")
    return manifest


def verify_model_dir(version_dir: str | Path) -> list[str]:
    """Problems that would make a gateway refuse this version (empty when it is sound)."""
    try:
        manifest = read_model_manifest(version_dir)
    except ModelManifestError as exc:
        return [str(exc)]
    if manifest is None:
        return [f"{MANIFEST_FILE}: missing"]
    return verify_files(version_dir, manifest)


def write_model_manifest(directory: str | Path, manifest: Mapping[str, Any]) -> dict[str, Any]:
    """Write ``slipway.json`` atomically and return what was written.

    ``format``, ``created`` (UTC) and ``files`` are filled in when absent; ``version`` is
    stamped when the version is published, since the number is only known when the
    version directory is renamed into place. Written last, after every file it vouches for.
    """
    if manifest.get("format", FORMAT) != FORMAT:
        raise ModelManifestError(
            f"{MANIFEST_FILE}: format must be {FORMAT!r}, got {manifest['format']!r}"
        )
    for key in ("name", "signature"):
        if key not in manifest:
            raise ModelManifestError(f"{MANIFEST_FILE}: {key!r} is required")
    validate_model_name(manifest["name"])
    defaults = {
        "format": FORMAT,
        "version": None,
        "created": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    merged = {**defaults, **manifest}
    if isinstance(merged.get("metrics"), Mapping):
        merged["metrics"] = json_metrics(merged["metrics"])  # JSON holds no inf or NaN
    if "files" not in merged:
        merged["files"] = file_checksums(directory)
    ordered = {key: merged[key] for key in _ORDER if key in merged}
    ordered.update((key, value) for key, value in merged.items() if key not in ordered)
    try:
        write_json_atomically(Path(directory) / MANIFEST_FILE, ordered, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ModelManifestError(f"{MANIFEST_FILE}: not serialisable as JSON: {exc}") from None
    return ordered


def stamp_version(version_dir: str | Path, model_name: str, version: int) -> None:
    """Record the version number a staged version is about to be published as."""
    manifest = read_model_manifest(version_dir)
    if manifest is None:
        return
    if manifest.get("name", model_name) != model_name:
        raise ModelManifestError(
            f"{MANIFEST_FILE} names model {manifest['name']!r}, published as {model_name!r}"
        )
    manifest["version"] = version
    write_json_atomically(Path(version_dir) / MANIFEST_FILE, manifest, allow_nan=False)
