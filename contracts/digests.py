"""File digests: how every manifest vouches for the bytes it lists."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any


def file_sha256(path: str | Path) -> str:
    """Hex SHA-256 of a file's contents, read in the C loop of ``hashlib.file_digest``."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def file_entry(path: str | Path) -> dict[str, Any]:
    """What a manifest records about one file: enough to detect truncation and bit rot."""
    return {"sha256": file_sha256(path), "bytes": os.path.getsize(path)}
