"""Writes that a reader, or a crash, never sees half of.

Each write goes to a temporary file in the destination's directory (same filesystem),
is flushed and fsynced, renamed over the destination, and the directory entry is
fsynced too: after a power cut the file is the old one or the new one, never empty.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def fsync_directory(directory: str | Path) -> None:
    """Make a rename or creation inside ``directory`` durable."""
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def write_bytes_atomically(path: str | Path, data: bytes, *, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` in one rename; the parent directory must exist."""
    path = Path(path)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    fsync_directory(path.parent)


def write_text_atomically(path: str | Path, text: str, *, mode: int = 0o644) -> None:
    """``write_bytes_atomically`` for UTF-8 text."""
    write_bytes_atomically(path, text.encode("utf-8"), mode=mode)


def write_json_atomically(
    path: str | Path, data: Any, *, sort_keys: bool = False, allow_nan: bool = True
) -> None:
    """Indented JSON with a final newline.

    The value is serialised before anything touches the disk, so an unserialisable
    value (or NaN and infinity, with ``allow_nan=False``) leaves no temporary file behind.
    """
    text = json.dumps(data, indent=2, sort_keys=sort_keys, allow_nan=allow_nan)
    write_text_atomically(path, text + "\n")
