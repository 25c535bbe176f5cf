"""How loosely typed input values are read: numbers spelled in strings, images in bytes.

Schema inference (``inference``) and conformance (``schema``) both read values through
these functions, so a value inference counts as a number is one conformance accepts.
"""

from __future__ import annotations

import io
import re
from typing import Any

import numpy as np
from PIL import Image, ImageOps

GRAY_MODES = frozenset({"1", "L", "LA", "La", "I", "I;16", "I;16B", "I;16L", "I;16N", "F"})

_INT = re.compile(r"[+-]?\d{1,64}")  # longer digit strings are no int64 anyway
_FLOAT = re.compile(r"[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?|nan|inf|infinity)", re.IGNORECASE)
_LEADING_ZERO = re.compile(r"[+-]?0\d")
_PREVIEW_CHARS = 80


def parse_number(text: str) -> int | float | None:
    """The number a string spells (CSV cells are strings), or None if it spells none."""
    stripped = text.strip()
    if _INT.fullmatch(stripped):
        return int(stripped)
    if _FLOAT.fullmatch(stripped):
        return float(stripped)
    return None


class ImageDecodeError(ValueError):
    """Bytes that Pillow cannot turn into pixels."""


def decode_image(data: bytes) -> Image.Image:
    """Fully decoded pixels, upright as a viewer would show them (EXIF orientation applied)."""
    try:
        with Image.open(io.BytesIO(data)) as opened:
            opened.load()
            return ImageOps.exif_transpose(opened)
    except Exception as exc:
        # Pillow reports corrupt and truncated files through many exception types
        # (OSError, SyntaxError, ValueError, struct.error, DecompressionBombError, ...);
        # any of them means the same thing here: these bytes are not a usable image.
        raise ImageDecodeError(f"cannot decode image: {exc}") from None


def image_channels(image: Image.Image) -> int:
    """1 for grayscale images (including palettes of grays), else 3."""
    if image.mode in GRAY_MODES:
        return 1
    if image.mode in ("P", "PA"):
        palette = image.getpalette() or []
        triples = zip(palette[0::3], palette[1::3], palette[2::3], strict=False)
        if all(red == green == blue for red, green, blue in triples):
            return 1
    return 3


def to_channels(image: Image.Image, channels: int) -> Image.Image:
    """The image as grayscale (``L``) or ``RGB`` pixels."""
    if image.mode.startswith("I;16"):
        # Pillow clips 16-bit values to 8 bits when converting; scale them instead.
        pixels = np.asarray(image, dtype=np.float64)
        image = Image.fromarray(np.round(pixels / 257).clip(0, 255).astype(np.uint8))
    return image.convert("L" if channels == 1 else "RGB")


def preview(value: Any) -> str:
    """A short printable form of a value, for messages and quarantine entries."""
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    text = repr(value)
    return text if len(text) <= _PREVIEW_CHARS else text[:_PREVIEW_CHARS] + "…"


def has_leading_zero(text: str) -> bool:
    """'02139' spells a number but marks an identifier (a zip code, an account)."""
    return bool(_LEADING_ZERO.match(text.strip()))
