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

import errno
import json
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import tensorflow as tf
import tf_keras as keras

from research.data.manifest import sha256_file, write_json_atomically

FORMAT = "slipway.model/1"
MANIFEST_FILE = "slipway.json"
SIGNATURE_KEY = "serving_default"
_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_MANIFEST_ORDER = (
    "format", "name", "version", "created", "files", "signature",
    "labels", "metrics", "provenance",
)  # fmt: skip


class ExportError(RuntimeError):
    """The model cannot be exported as the artifact contract requires."""


class VersionExistsError(FileExistsError):
    """The requested version is already in the repository; versions are never replaced."""


# -- file integrity -------------------------------------------------------------------


def file_entry(path: str | Path) -> dict[str, Any]:
    """What a manifest records about one file: enough to detect truncation and bit rot."""
    return {"sha256": sha256_file(path), "bytes": os.path.getsize(path)}


def file_checksums(directory: str | Path) -> dict[str, dict[str, Any]]:
    """``{relative posix path: {"sha256", "bytes"}}`` for every file but ``slipway.json``."""
    root = Path(directory)
    entries = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        relative = path.relative_to(root).as_posix()
        if relative != MANIFEST_FILE:
            entries[relative] = file_entry(path)
    return entries


def check_files(directory: str | Path, expected: Mapping[str, Any]) -> list[str]:
    """Problems with the listed files under ``directory`` (empty when all match).

    Sizes are compared before hashing so a truncated file is reported without reading it.
    """
    root = Path(directory)
    problems = []
    for relative, entry in expected.items():
        if Path(relative).is_absolute() or ".." in Path(relative).parts:
            problems.append(f"{relative}: path leaves the directory")
            continue
        path = root / relative
        try:
            size = os.path.getsize(path)
        except OSError:
            problems.append(f"{relative}: missing")
            continue
        if not isinstance(entry, Mapping) or "sha256" not in entry or "bytes" not in entry:
            problems.append(f"{relative}: malformed entry {entry!r}")
        elif size != entry["bytes"]:
            problems.append(f"{relative}: {size} bytes, expected {entry['bytes']}")
        elif sha256_file(path) != entry["sha256"]:
            problems.append(f"{relative}: SHA-256 does not match")
    return problems


def write_model_manifest(directory: str | Path, manifest: Mapping[str, Any]) -> dict[str, Any]:
    """Write ``slipway.json`` atomically and return what was written.

    ``format``, ``created`` (UTC) and ``files`` are filled in when absent; ``version`` is
    stamped by ``publish_version``, since the number is only known when the version
    directory is renamed into place. Written last, after every file it vouches for.
    """
    if manifest.get("format", FORMAT) != FORMAT:
        raise ValueError(f"slipway.json: format must be {FORMAT!r}, got {manifest['format']!r}")
    for key in ("name", "signature"):
        if key not in manifest:
            raise ValueError(f"slipway.json: {key!r} is required")
    validate_model_name(manifest["name"])
    defaults = {
        "format": FORMAT,
        "version": None,
        "created": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    merged = {**defaults, **manifest}
    if "files" not in merged:
        merged["files"] = file_checksums(directory)
    ordered = {key: merged[key] for key in _MANIFEST_ORDER if key in merged}
    ordered.update((key, value) for key, value in merged.items() if key not in ordered)
    try:
        json.dumps(ordered, allow_nan=False)
    except (TypeError, ValueError) as exc:
        # Checked before writing so a bad value never leaves a temporary file behind.
        raise ValueError(f"slipway.json: not serialisable as JSON: {exc}") from None
    write_json_atomically(Path(directory) / MANIFEST_FILE, ordered)
    return ordered


def verify_model_dir(directory: str | Path) -> list[str]:
    """Problems that would make a gateway refuse this version (empty when it is sound)."""
    root = Path(directory)
    try:
        manifest = json.loads((root / MANIFEST_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return [f"{MANIFEST_FILE}: missing"]
    except (OSError, ValueError) as exc:
        return [f"{MANIFEST_FILE}: unreadable: {exc}"]
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        return [f"{MANIFEST_FILE}: not a {FORMAT} manifest"]
    files = manifest.get("files")
    if not isinstance(files, dict):
        return [f"{MANIFEST_FILE}: 'files' must be an object"]
    problems = check_files(root, files)
    problems += [
        f"{relative}: not listed in {MANIFEST_FILE}"
        for relative in file_checksums(root)
        if relative not in files
    ]
    return problems


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


def save_serving_model(model: keras.Model, directory: str | Path) -> dict[str, Any]:
    """Save ``model`` as a SavedModel whose ``serving_default`` uses the model's names.

    Inputs are keyed by the model's input names with a free batch dimension, outputs by
    its output names (a Keras default signature would call them ``output_0``…). Saved via
    ``Model.save`` (which calls ``tf.saved_model.save``) without the optimizer: serving
    needs no slot variables, and the Keras metadata lets compression reload the model.
    The signature is read back from disk and returned as ``slipway.json`` describes it.
    """
    if model.inputs is None:
        raise ExportError("the model has no defined inputs; build it from keras.Input")
    inputs = _named_inputs(model)
    names = list(inputs)
    specs = [
        tf.TensorSpec([None, *tensor.shape[1:]], tensor.dtype, name=name)
        for name, tensor in inputs.items()
    ]
    structure = model.input

    @tf.autograph.experimental.do_not_convert
    def serve(*tensors: tf.Tensor) -> dict[str, tf.Tensor]:
        by_name = dict(zip(names, tensors, strict=True))
        if isinstance(structure, Mapping):
            feed: Any = by_name
        else:
            feed = tf.nest.pack_sequence_as(structure, [by_name[name] for name in names])
        return _named_outputs(model, model(feed, training=False))

    # The tf.function itself (not a concrete function) is what SavedModel can re-trace when
    # the model's variables are distributed (a multi-worker run).
    function = tf.function(serve, input_signature=specs)
    output_names = list(function.get_concrete_function().structured_outputs)
    model.save(
        str(directory),
        save_format="tf",
        include_optimizer=False,
        signatures={SIGNATURE_KEY: function},
    )
    signature = tf.saved_model.load(str(directory)).signatures[SIGNATURE_KEY]
    loaded_inputs = signature.structured_input_signature[1]
    loaded_outputs = signature.structured_outputs
    if set(loaded_inputs) != set(names) or set(loaded_outputs) != set(output_names):
        raise ExportError(
            f"{directory}: signature names {sorted(loaded_inputs)} -> {sorted(loaded_outputs)} "
            f"differ from the model's {names} -> {output_names}"
        )
    return {
        "name": SIGNATURE_KEY,
        "inputs": {name: _describe(loaded_inputs[name]) for name in names},
        "outputs": {name: _describe(loaded_outputs[name]) for name in output_names},
    }


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


# -- the model repository -------------------------------------------------------------


def validate_model_name(name: str) -> str:
    """A model name is one path component that readers can put in a URL."""
    if not isinstance(name, str) or not _MODEL_NAME.fullmatch(name):
        raise ValueError(
            f"model name {name!r}: use letters, digits, '.', '_' and '-', "
            "starting with a letter or digit"
        )
    return name


def existing_versions(model_dir: str | Path) -> list[int]:
    """Versions in ``model_dir``, as TensorFlow Serving sees them: all-digit names."""
    try:
        names = os.listdir(model_dir)
    except FileNotFoundError:
        return []
    return sorted(int(name) for name in names if name.isascii() and name.isdigit())


def _stamp_version(staging: Path, model_name: str, version: int) -> None:
    manifest_path = staging / MANIFEST_FILE
    if not manifest_path.exists():
        return
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    if manifest.get("name", model_name) != model_name:
        raise ExportError(
            f"{MANIFEST_FILE} names model {manifest['name']!r}, published as {model_name!r}"
        )
    manifest["version"] = version
    write_json_atomically(manifest_path, manifest)


def publish_version(
    model_root: str | Path,
    model_name: str,
    write: Callable[[Path], None],
    *,
    version: int | None = None,
) -> tuple[int, Path]:
    """Publish what ``write`` puts in a staging directory as ``<root>/<model>/<version>``.

    The staging directory sits beside the versions (same filesystem, a name TensorFlow
    Serving ignores) and is renamed into place. Without ``version`` the next free number
    is taken; a rename that loses a race to another publisher fails because the target is
    no longer empty, and the next number is tried. A given ``version`` that exists is an
    error: published versions are immutable. On any failure the staging directory goes.
    """
    validate_model_name(model_name)
    if version is not None and (
        isinstance(version, bool) or not isinstance(version, int) or version < 1
    ):
        raise ValueError(f"version must be a positive integer, got {version!r}")
    model_dir = Path(model_root) / model_name
    model_dir.mkdir(parents=True, exist_ok=True)
    staging = model_dir / f".staging-{uuid.uuid4().hex}"
    staging.mkdir()
    try:
        write(staging)
        if not any(staging.iterdir()):
            raise ExportError(f"{model_name}: nothing was written to publish")
        while True:
            number = (
                version if version is not None else max(existing_versions(model_dir), default=0) + 1
            )
            target = model_dir / str(number)
            if target.exists():
                if version is not None:
                    raise VersionExistsError(f"{target}: version {number} already exists")
                continue
            _stamp_version(staging, model_name, number)
            try:
                os.rename(staging, target)
            except OSError as exc:
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
                if version is not None:
                    raise VersionExistsError(f"{target}: version {number} already exists") from None
                continue
            return number, target
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
