"""``slipway publish``: put a SavedModel that Slipway's training did not make into a model
repository, with the ``slipway.json`` a gateway verifies it against.

Any Keras or TensorFlow export works if it has a ``serve`` MetaGraph with a
``serving_default`` signature. The SavedModel is read as a protocol buffer only: nothing
in it runs. It is copied into a staging directory beside the model's versions, its
``slipway.json`` written there (SHA-256 and size of every file, the signature), and the
directory renamed into place (``contracts.model_repository.publish_version``), so a
gateway polling the repository sees the whole version or nothing.

This module imports TensorFlow's protos only when a SavedModel is read, so that the
command line stays quick to start.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from contracts.model_manifest import (
    MANIFEST_FILE,
    SAVED_MODEL_FILE,
    SIGNATURE_KEY,
    read_model_manifest,
    unsafe_links,
    validate_model_name,
    verify_files,
    write_model_manifest,
)
from contracts.model_repository import publish_version
from contracts.serving_contract import OVERRIDE_FLAG, check_contract, latest_signature

SERVE_TAG = "serve"


class PublishInputError(ValueError):
    """The directory cannot be published as given (not a SavedModel, no signature, …)."""


def read_serving_signature(saved_model_dir: str | Path) -> dict[str, Any]:
    """The ``serving_default`` signature of a SavedModel, as ``slipway.json`` records it."""
    from serving.signature import Signature

    directory = Path(saved_model_dir)
    if not directory.is_dir():
        raise PublishInputError(f"{directory}: not a directory")
    pb = directory / SAVED_MODEL_FILE
    if not pb.is_file():
        raise PublishInputError(f"{directory}: no {SAVED_MODEL_FILE}; not a SavedModel directory")
    from google.protobuf.message import DecodeError
    from tensorflow.core.protobuf import saved_model_pb2

    try:
        saved = saved_model_pb2.SavedModel.FromString(pb.read_bytes())
    except (DecodeError, OSError) as exc:
        raise PublishInputError(f"{pb}: not a readable SavedModel ({exc})") from None
    meta_graphs = [g for g in saved.meta_graphs if SERVE_TAG in g.meta_info_def.tags]
    if not meta_graphs:
        tags = sorted({tag for g in saved.meta_graphs for tag in g.meta_info_def.tags})
        raise PublishInputError(
            f"{pb}: no MetaGraph tagged {SERVE_TAG!r} (tags: {', '.join(tags) or 'none'}); "
            "save the model with tf.saved_model.save or Keras model.save"
        )
    definitions = meta_graphs[0].signature_def
    if SIGNATURE_KEY not in definitions:
        known = ", ".join(sorted(k for k in definitions if not k.startswith("__"))) or "none"
        raise PublishInputError(
            f"{pb}: no {SIGNATURE_KEY!r} signature (signatures: {known}); export one with "
            f"signatures={{{SIGNATURE_KEY!r}: ...}}"
        )
    try:
        signature = Signature.from_proto(SIGNATURE_KEY, definitions[SIGNATURE_KEY])
    except (KeyError, ValueError, TypeError) as exc:
        raise PublishInputError(f"{pb}: signature {SIGNATURE_KEY!r}: {exc}") from None
    return signature.to_json()


def publish_saved_model(
    saved_model_dir: str | Path,
    model_root: str | Path,
    model_name: str,
    *,
    version: int | None = None,
    allow_contract_change: bool = False,
) -> tuple[int, Path]:
    """Publish ``saved_model_dir`` as ``<model_root>/<model_name>/<version>`` (the next
    free number when None) with a ``slipway.json``; return the version and its path.

    A ``slipway.json`` already in the directory is kept (its labels, metrics and
    provenance) if its files match it; the name it gets is ``model_name``. The version
    must keep the serving contract of the model's newest version, if it has one
    (``ContractChangeError`` names each difference), unless ``allow_contract_change``.
    """
    source = Path(saved_model_dir)
    try:
        validate_model_name(model_name)
    except ValueError as exc:
        raise PublishInputError(f"--model: {exc}") from None
    if version is not None and version < 1:
        raise PublishInputError(f"--version must be a positive integer, got {version}")
    signature = read_serving_signature(source)
    published = latest_signature(model_root, model_name)
    if published is not None and not allow_contract_change:
        check_contract(
            published[1],
            signature,
            against=f"{model_name} version {published[0]}",
            override=OVERRIDE_FLAG,
        )
    problems = unsafe_links(source)
    if problems:
        raise PublishInputError(f"{source}: {'; '.join(problems)}")
    existing = _existing_manifest(source)
    manifest = {
        **existing,
        "name": model_name,
        "signature": signature,
        "provenance": existing.get("provenance", {"method": "slipway publish"}),
    }
    manifest.pop("files", None)
    manifest.pop("version", None)
    manifest.pop("created", None)

    def write(staging: Path) -> None:
        shutil.copytree(
            source,
            staging,
            symlinks=True,
            dirs_exist_ok=True,
            ignore=lambda directory, names: [MANIFEST_FILE] if Path(directory) == source else [],
        )
        write_model_manifest(staging, manifest)

    try:
        return publish_version(Path(model_root), model_name, write, version=version)
    except FileExistsError as exc:
        raise PublishInputError(f"{exc}; published versions are never replaced") from None


def _existing_manifest(source: Path) -> dict[str, Any]:
    """The directory's own ``slipway.json``, checked against its files (or empty)."""
    try:
        manifest = read_model_manifest(source)
    except ValueError as exc:
        raise PublishInputError(f"{source}: {exc}") from None
    if manifest is None:
        return {}
    problems = verify_files(source, manifest)
    if problems:
        shown = "; ".join(problems[:5])
        raise PublishInputError(
            f"{source}: files do not match its {MANIFEST_FILE} ({shown}); remove the "
            f"{MANIFEST_FILE} to publish the files as they are"
        )
    return dict(manifest)
