"""Images named in a table's cells: a file path relative to the table, or base64 text.

People's tables hold images that way: a CSV with a ``screenshot`` column of file names
beside it, or JSON Lines with each image inlined as base64 (plain, as a ``data:`` URL, or
as ``{"b64": ...}``, the form TensorFlow Serving's REST API uses). A cell becomes the
image's bytes here; from then on it is decoded, converted and checked exactly like an
image read from a folder (``research.data.schema``).
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

from research.data import filesystems

# Text that can only be base64: its alphabet, padded to whole quads, long enough that a
# short file name ("cat") is not mistaken for it.
_BASE64_TEXT = re.compile(r"^[A-Za-z0-9+/\s]{16,}={0,2}$")
_SHOWN_CHARS = 60


class ImageCellError(ValueError):
    """A cell that names no readable image; the message says what was tried."""


def image_cell_bytes(value: Any, table_dir: str | None) -> bytes:
    """The bytes of the image a table cell names (still to be decoded and checked).

    ``table_dir`` is the directory (or URI prefix) of the file the cell was read from;
    relative paths are taken from there, absolute paths and URIs as they are.
    """
    if isinstance(value, dict):
        if set(value) != {"b64"} or not isinstance(value["b64"], str):
            raise ImageCellError('an image object holds one key, "b64", with base64 text')
        return _decoded(value["b64"])
    if not isinstance(value, str):
        raise ImageCellError(f"expected a file path or base64 text, got {type(value).__name__}")
    text = value.strip()
    if text.startswith("data:"):
        header, _, payload = text.partition(",")
        if not header.endswith(";base64"):
            raise ImageCellError("a data: URL of an image must be base64 (data:image/png;base64,…)")
        return _decoded(payload)
    path = _resolved(text, table_dir)
    if path is not None and filesystems.exists(path):
        return filesystems.read_bytes(path)
    if _BASE64_TEXT.match(text):
        return _decoded(text)
    where = f" ({path} does not exist)" if path is not None and path != text else ""
    raise ImageCellError(f"{_shown(text)!r} is neither an image file{where} nor base64 image data")


def _resolved(text: str, table_dir: str | None) -> str | None:
    """Where a path-like cell points; None for text that cannot be a path."""
    if not text or "\n" in text:
        return None
    if table_dir is None or "://" in text or text.startswith("/"):
        return text
    return filesystems.join(table_dir, text)


def _decoded(text: str) -> bytes:
    try:
        return base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise ImageCellError(f"{_shown(text)!r} is not valid base64") from None


def _shown(text: str) -> str:
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "…"
