"""The model repository, laid out as TensorFlow Serving's: ``<root>/<model>/<version>/``.

Writers (training, compression, ``slipway publish``) stage a version beside the
others, under a name TensorFlow Serving ignores, and rename it into place, so a reader
polling the repository sees either nothing or a complete, checksummed version.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from contracts.atomic_files import fsync_directory
from contracts.model_manifest import stamp_version, validate_model_name
from contracts.ownership import owned_directory

STAGING_PREFIX = ".staging-"


class PublishError(RuntimeError):
    """Nothing could be published (the writer wrote nothing)."""


class VersionExistsError(FileExistsError):
    """The requested version is already in the repository; versions are never replaced."""


def existing_versions(model_dir: str | Path) -> list[int]:
    """Versions in ``model_dir``, as TensorFlow Serving sees them: all-ASCII-digit names."""
    try:
        names = os.listdir(model_dir)
    except FileNotFoundError:
        return []
    return sorted(int(name) for name in names if name.isascii() and name.isdigit())


def publish_version(
    model_root: str | Path,
    model_name: str,
    write: Callable[[Path], None],
    *,
    version: int | None = None,
) -> tuple[int, Path]:
    """Publish what ``write`` puts in a staging directory as ``<root>/<model>/<version>``.

    Without ``version`` the next free number is taken; a rename that loses a race to
    another publisher fails because the target is no longer empty, and the next number
    is tried. A given ``version`` that exists is an error: published versions are
    immutable. On any failure the staging directory goes, and staging directories that
    killed publishers left behind are removed (see ``contracts.ownership``).
    """
    validate_model_name(model_name)
    if version is not None and (
        isinstance(version, bool) or not isinstance(version, int) or version < 1
    ):
        raise ValueError(f"version must be a positive integer, got {version!r}")
    model_dir = Path(model_root) / model_name
    model_dir.mkdir(parents=True, exist_ok=True)
    with owned_directory(model_dir, STAGING_PREFIX) as staging:
        return _publish_staged(model_dir, model_name, staging, write, version)


def _publish_staged(
    model_dir: Path,
    model_name: str,
    staging: Path,
    write: Callable[[Path], None],
    version: int | None,
) -> tuple[int, Path]:
    """``publish_version`` once its staging directory exists; removes it on failure."""
    try:
        write(staging)
        if not any(staging.iterdir()):
            raise PublishError(f"{model_name}: nothing was written to publish")
        while True:
            number = (
                version if version is not None else max(existing_versions(model_dir), default=0) + 1
            )
            target = model_dir / str(number)
            if target.exists():
                if version is not None:
                    raise VersionExistsError(f"{target}: version {number} already exists")
                continue
            stamp_version(staging, model_name, number)
            try:
                os.rename(staging, target)
            except OSError as exc:
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
                if version is not None:
                    raise VersionExistsError(f"{target}: version {number} already exists") from None
                continue
            fsync_directory(model_dir)
            return number, target
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
