"""The build's files, written and read through Beam's ``FileSystems``.

Workers write shards and side files wherever the dataset is staged: a local
directory, or a URI (``gs://…``, ``s3://…``) on a cluster whose workers share no disk.
Paths are therefore plain strings handed to ``FileSystems``, never ``pathlib`` paths
(``Path("gs://b/x")`` collapses the ``//`` and ``resolve()`` prefixes the working
directory).

Every write goes to a temporary name and is renamed onto its destination only once
complete, so a worker that fails or is retried half-way never leaves a half file
under the final name. Temporaries go to ``temp_dir`` when given (the build's own
scratch directory, removed before the dataset is published, so even the leftovers
of a killed worker never reach the dataset), beside the destination otherwise.
Compression is always explicit: ``FileSystems`` would otherwise guess it from the
name and gzip a ``.gz`` shard a second time.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import uuid
from collections.abc import Iterator
from typing import IO, Any

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

_CHUNK = 1 << 20
_RAW = CompressionTypes.UNCOMPRESSED


def join(base: str, *parts: str) -> str:
    return FileSystems.join(base, *parts)


@contextlib.contextmanager
def atomic_output(path: str, temp_dir: str | None = None) -> Iterator[IO[bytes]]:
    """A binary stream that becomes ``path`` when the ``with`` block ends without error."""
    directory, name = FileSystems.split(path)
    temporary = join(temp_dir or directory, f".{name}.{uuid.uuid4().hex}.tmp")
    if temp_dir is not None:
        # Creating the temporary made its directory; the rename needs the destination's.
        # (Another worker may make it first; if it cannot be made, the rename says why.)
        with contextlib.suppress(OSError):
            FileSystems.mkdirs(directory)
    handle = FileSystems.create(temporary, compression_type=_RAW)
    try:
        yield handle
        handle.close()
        FileSystems.rename([temporary], [path])
    except BaseException:
        handle.close()
        with contextlib.suppress(Exception):
            FileSystems.delete([temporary])
        raise


def write_bytes(path: str, data: bytes, temp_dir: str | None = None) -> None:
    with atomic_output(path, temp_dir) as handle:
        handle.write(data)


def write_json(path: str, value: Any, temp_dir: str | None = None) -> None:
    """Indented JSON with a final newline, serialised before anything is written."""
    write_bytes(path, (json.dumps(value, indent=2) + "\n").encode("utf-8"), temp_dir)


def open_for_read(path: str) -> IO[bytes]:
    return FileSystems.open(path, compression_type=_RAW)


def read_bytes(path: str) -> bytes:
    with open_for_read(path) as handle:
        return handle.read()


def copy_local_file(source: str, destination: str, temp_dir: str | None = None) -> tuple[str, int]:
    """Copy a local file to ``destination`` (any filesystem); returns its SHA-256 and size.

    The digest is taken from the bytes as they are written, so the file need not be
    read back from a remote filesystem.
    """
    digest = hashlib.sha256()
    size = 0
    with open(source, "rb") as local, atomic_output(destination, temp_dir) as out:
        while chunk := local.read(_CHUNK):
            digest.update(chunk)
            out.write(chunk)
            size += len(chunk)
    return digest.hexdigest(), size
