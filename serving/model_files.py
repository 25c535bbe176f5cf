"""What the gateway trusts on disk: ``slipway.json`` and the files it vouches for.

A model version is read from a directory that anyone with write access to the
repository could have touched, so nothing here executes or unpickles what it reads:
a version is a SavedModel (``saved_model.pb``) or a TFLite flatbuffer (``model.tflite``),
every file is checked against the SHA-256 and size recorded at export, and paths built
from names (request URLs, manifest entries, directory listings) must stay inside their
root even through symlinks.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Literal

from serving.errors import DataLoss, InvalidArgument, PermissionDenied

MANIFEST_FILE = "slipway.json"
FORMAT = "slipway.model/1"
SAVED_MODEL_FILE = "saved_model.pb"
TFLITE_FILE = "model.tflite"
_MAX_MANIFEST_BYTES = 16 << 20
_CHUNK = 1 << 20
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")

ModelFormat = Literal["savedmodel", "tflite"]


def validate_model_name(name: str) -> str:
    """A model name is one path component that can appear in a URL (as at export)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidArgument(
            f"model name {name!r}: use letters, digits, '.', '_' and '-', "
            "starting with a letter or digit"
        )
    return name


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


def read_model_manifest(version_dir: str | Path) -> dict[str, Any] | None:
    """The version's ``slipway.json``, or None when it has none (a plain SavedModel).

    A manifest that exists but cannot be trusted (unreadable, not JSON, another
    format, outside the directory) raises ``DataLoss``: its files cannot be verified.
    """
    try:
        path = safe_join(version_dir, MANIFEST_FILE)
    except PermissionDenied as exc:
        raise DataLoss(f"{MANIFEST_FILE}: {exc.message}") from None
    if not path.exists() and not path.is_symlink():
        return None
    try:
        if path.stat().st_size > _MAX_MANIFEST_BYTES:
            raise DataLoss(f"{MANIFEST_FILE}: larger than {_MAX_MANIFEST_BYTES} bytes")
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DataLoss(f"{MANIFEST_FILE}: unreadable: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise DataLoss(f"{MANIFEST_FILE}: not a {FORMAT} manifest")
    return manifest


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def list_files(directory: str | Path) -> list[str]:
    """Relative POSIX paths of the files under ``directory`` (symlinked dirs not entered)."""
    root = Path(directory)
    found = []
    for current, dirnames, filenames in os.walk(root):
        here = Path(current)
        names = filenames + [d for d in dirnames if (here / d).is_symlink()]
        found += [(here / name).relative_to(root).as_posix() for name in names]
    return sorted(found)


def unsafe_links(directory: str | Path) -> list[str]:
    """Problems for symlinks under ``directory`` that lead outside it."""
    root = Path(directory).resolve()
    problems = []
    for relative in list_files(directory):
        path = Path(directory, relative)
        if path.is_symlink() and not path.resolve().is_relative_to(root):
            problems.append(f"{relative}: symlink leads outside the version directory")
    return problems


def verify_files(version_dir: str | Path, manifest: dict[str, Any]) -> list[str]:
    """Problems with the version's files against ``manifest`` (empty when all match).

    Every listed file must exist with its recorded size and SHA-256, and every file
    present must be listed, so a tampered, truncated, missing or injected file is
    caught. Sizes are compared first so a truncated file is reported without hashing.
    """
    files = manifest.get("files")
    if not isinstance(files, dict):
        return [f"{MANIFEST_FILE}: 'files' must be an object"]
    problems = unsafe_links(version_dir)
    for relative, entry in sorted(files.items()):
        problems += _check_entry(Path(version_dir), relative, entry)
    problems += [
        f"{relative}: not listed in {MANIFEST_FILE}"
        for relative in list_files(version_dir)
        if relative not in files and relative != MANIFEST_FILE
    ]
    return problems


def _check_entry(root: Path, relative: str, entry: Any) -> list[str]:
    if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str):
        return [f"{relative}: malformed entry {entry!r}"]
    expected_size = entry.get("bytes")
    if not isinstance(expected_size, int) or isinstance(expected_size, bool):
        return [f"{relative}: malformed entry {entry!r}"]
    try:
        path = safe_join(root, *relative.split("/"))
    except (InvalidArgument, PermissionDenied):
        return [f"{relative}: path leaves the version directory"]
    if not path.is_file():
        return [f"{relative}: missing"]
    try:
        size = path.stat().st_size
        if size != expected_size:
            return [f"{relative}: {size} bytes, expected {expected_size}"]
        if sha256_file(path) != entry["sha256"]:
            return [f"{relative}: SHA-256 does not match"]
    except OSError as exc:
        return [f"{relative}: unreadable: {exc.strerror or exc}"]
    return []
