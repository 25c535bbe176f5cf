"""What the gateway trusts on disk, in the gateway's own status codes.

A model version is read from a directory that anyone with write access to the
repository could have touched, so nothing here executes or unpickles what it reads: a
version is a SavedModel (``saved_model.pb``) or a TFLite flatbuffer (``model.tflite``),
and paths built from names (request URLs, directory listings) must stay inside their
root even through symlinks. Reading and checking ``slipway.json`` is the manifest
contract's job (``contracts.model_manifest``); this module reports its failures as the
errors a client of the gateway sees: an untrustworthy manifest is ``DATA_LOSS``, a bad
model name ``INVALID_ARGUMENT``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from contracts import model_manifest
from serving.errors import DataLoss, InvalidArgument, PermissionDenied

SAVED_MODEL_FILE = "saved_model.pb"
TFLITE_FILE = "model.tflite"

ModelFormat = Literal["savedmodel", "tflite"]


def validate_model_name(name: str) -> str:
    """A model name is one path component that can appear in a URL (as at export)."""
    try:
        return model_manifest.validate_model_name(name)
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None


def read_model_manifest(version_dir: str | Path) -> dict[str, Any] | None:
    """The version's ``slipway.json``, or None when it has none (a plain SavedModel).

    A manifest that exists but cannot be trusted raises ``DataLoss``: the files it
    vouches for cannot be verified.
    """
    try:
        return model_manifest.read_model_manifest(version_dir)
    except model_manifest.ModelManifestError as exc:
        raise DataLoss(str(exc)) from None


def safe_join(root: str | Path, *parts: str) -> Path:
    """``root/part/...``, refusing anything that could leave ``root``.

    Each part must be one plain name (no separator, ``.``, ``..``, NUL, drive or
    absolute path); the joined path, with symlinks resolved, must still be inside the
    resolved root. Raises ``InvalidArgument`` for a bad name and ``PermissionDenied``
    for a symlink that leads out.
    """
    base = Path(root)
    for part in parts:
        if (
            not isinstance(part, str)
            or part in ("", ".", "..")
            or "/" in part
            or "\\" in part
            or "\x00" in part
            or Path(part).is_absolute()
            or Path(part).drive
        ):
            raise InvalidArgument(f"{part!r} is not a plain file or directory name")
    joined = base.joinpath(*parts)
    real_root = base.resolve()
    if not joined.resolve().is_relative_to(real_root):
        raise PermissionDenied(f"{'/'.join(parts)} leads outside {base}")
    return joined


def model_format(version_dir: str | Path) -> ModelFormat | None:
    """Which supported format a version directory holds, if any."""
    directory = Path(version_dir)
    if (directory / SAVED_MODEL_FILE).is_file():
        return "savedmodel"
    if (directory / TFLITE_FILE).is_file():
        return "tflite"
    return None
