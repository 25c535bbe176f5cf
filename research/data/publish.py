"""Where a build stages its dataset, and how the finished dataset takes its place.

A build writes into a staging directory beside its destination and publishes only a
dataset that is complete and passed its checks, so a failed, interrupted or refused
build never leaves something that looks like a dataset, and a dataset already there
is replaced only when asked to (``overwrite``), never by something that is not one. A
killed build's staging directory is removed by the next build of the same destination.

- **Local disk**: the staging directory is renamed onto the destination (the old
  dataset, if any, is first renamed aside), so a reader sees the old dataset or the
  new one, never a mixture.
- **Object stores** (``gs://``, ``s3://``, ...): there are no directories to rename,
  so the manifest is the commit point. The old manifest goes first (the prefix stops
  being a dataset), the new files move into place, the new manifest comes last, and
  only then are the old dataset's other files removed. A reader that trusts only a
  prefix with a manifest, as every reader here does, never reads a half-published
  dataset.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from contracts.dataset_manifest import MANIFEST_FILE, DatasetExistsError
from contracts.ownership import owned_directory
from research.data import filesystems


def absolute(destination: str | os.PathLike[str]) -> str:
    """A local path made absolute, or a URI as given (without a trailing ``/``)."""
    text = os.fspath(destination)
    if filesystems.is_local(text):
        return str(Path(text).expanduser().resolve())
    return text.rstrip("/")


def check_destination(destination: str, overwrite: bool) -> None:
    """Replace only what a build made: a dataset, or an empty directory."""
    if filesystems.is_local(destination):
        _check_local(Path(destination), overwrite)
        return
    if not filesystems.files_under(destination):
        return
    if not overwrite:
        raise DatasetExistsError(f"{destination} exists; pass --overwrite to replace it")
    if not filesystems.exists(filesystems.join(destination, MANIFEST_FILE)):
        raise DatasetExistsError(
            f"{destination} is not a dataset (no {MANIFEST_FILE}); refusing to replace it"
        )


def _check_local(destination: Path, overwrite: bool) -> None:
    if not destination.exists():
        return
    if not overwrite:
        raise DatasetExistsError(f"{destination} exists; pass --overwrite to replace it")
    empty = destination.is_dir() and not any(destination.iterdir())
    if not empty and not (destination / MANIFEST_FILE).is_file():
        raise DatasetExistsError(
            f"{destination} is not a dataset (no {MANIFEST_FILE}); refusing to replace it"
        )


@contextmanager
def staging_area(destination: str) -> Iterator[str]:
    """A new directory beside ``destination``, where a build writes its dataset.

    On local disk it is owned by this process while the build runs (see
    ``contracts.ownership``), and what killed builds of the same destination left
    behind is removed first; never the directory of a build still running. An object
    store has no locks, so there the caller's clean-up on failure is all there is.
    """
    parent, name = filesystems.split(destination)
    prefix = f".{name}.building-"
    if filesystems.is_local(destination):
        os.makedirs(parent, exist_ok=True)
        with owned_directory(parent, prefix) as staging:
            yield str(staging)
    else:
        yield filesystems.join(parent, f"{prefix}{uuid.uuid4().hex[:8]}")


def publish(staging: str, destination: str, overwrite: bool) -> None:
    """Put the finished dataset in ``staging`` in place (see module docstring)."""
    check_destination(destination, overwrite)
    if filesystems.is_local(destination):
        _publish_local(Path(staging), Path(destination))
    else:
        _publish_by_files(staging, destination)


def _publish_local(staging: Path, destination: Path) -> None:
    if destination.exists():
        retired = destination.with_name(f".{destination.name}.replaced-{uuid.uuid4().hex[:8]}")
        destination.rename(retired)
        staging.rename(destination)
        shutil.rmtree(retired, ignore_errors=True)
    else:
        staging.rename(destination)


def _publish_by_files(staging: str, destination: str) -> None:
    old = set(filesystems.files_under(destination))
    old_manifest = filesystems.join(destination, MANIFEST_FILE)
    if old_manifest in old:
        filesystems.delete([old_manifest])
    prefix = staging.rstrip("/") + "/"
    new = [path[len(prefix) :] for path in filesystems.files_under(staging)]
    files = sorted(new, key=lambda name: name == MANIFEST_FILE)  # the manifest last
    targets = [filesystems.join(destination, name) for name in files]
    for source, target in zip(files, targets, strict=True):
        filesystems.rename(filesystems.join(staging, source), target)
    stale = sorted(old - set(targets) - {old_manifest})
    if stale:
        filesystems.delete(stale)
    filesystems.delete_tree(staging)
