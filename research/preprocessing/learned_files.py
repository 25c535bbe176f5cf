"""The files a dataset build learns for a text feature (a sentencepiece model, word
terms), read back only when they are the files the manifest recorded."""

from __future__ import annotations

from pathlib import Path

from contracts.dataset_manifest import DatasetError
from contracts.digests import file_sha256
from contracts.features import FeatureSpec


def read_learned_file(
    dataset_dir: str | Path, feature: FeatureSpec, key: str, what: str
) -> tuple[Path, bytes]:
    """The path and bytes of the file that ``feature``'s field ``key`` names (its SHA-256
    in ``<stem>_sha256``, e.g. ``tokenizer_file`` and ``tokenizer_sha256``).

    A feature without one, a missing file, or one whose SHA-256 differs from the
    manifest's is a ``DatasetError`` naming the file and calling it ``what``.
    """
    relative = getattr(feature, key)
    if not relative:
        raise DatasetError(f"{dataset_dir}: text feature {feature.name!r} has no {key}")
    path = Path(dataset_dir) / relative
    if not path.is_file():
        raise DatasetError(f"{path}: the {what} of text feature {feature.name!r} is missing")
    expected = getattr(feature, key.removesuffix("_file") + "_sha256")
    if expected and file_sha256(path) != expected:
        raise DatasetError(
            f"{path}: the {what} of text feature {feature.name!r} does not match the SHA-256 "
            "in the manifest (corrupt or replaced); rebuild the dataset"
        )
    return path, path.read_bytes()
