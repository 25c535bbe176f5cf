"""What every source reader shares: the unit it reads, and how it reports what it read.

A reader turns one ``SourceFile`` into records (``source_record``) and quarantine
entries (``quarantined``), in file order. A file none of whose records can be read
(its columns or its arrays cannot be known) raises ``UnreadableFile`` instead: the
column checks refuse such a file before the build, and one that turns unreadable
after them makes the build refuse, because the records it held are unknown and
counting it as one lost input would understate the loss. Readers live in their own
modules (``sources``, ``csv_source``, ``array_sources``); this one holds only what they
have in common, so that none of them imports another.
"""

from __future__ import annotations

import codecs
import io
import re
from dataclasses import dataclass
from typing import IO, Any

import numpy as np
from PIL import Image

from contracts.yaml_config import ConfigError
from research.data import filesystems
from research.data.line_ranges import LineRange, open_range
from research.data.records import ORIGIN, RANK, TABLE_DIR, Record, make_rank, quarantine_entry
from research.data.spec import (
    CsvSource,
    Hdf5Source,
    ImageFolderSource,
    JsonlSource,
    NpzSource,
    TextSource,
)

SourceSpec = CsvSource | JsonlSource | TextSource | ImageFolderSource | NpzSource | Hdf5Source
STAGE = "read"

TABLE_SOURCES = frozenset({"csv", "jsonl"})  # sources whose cells may name image files

# ``surrogateescape`` turns every undecodable byte into one of these code points, so a
# reader can keep streaming past a bad line and still tell it apart from good text.
UNDECODABLE = re.compile("[\udc80-\udcff]")


@dataclass(frozen=True)
class SourceFile:
    """One unit of reading: a matched file, part of one, or an image-folder root."""

    index: int  # position of the source in ``spec.sources``
    source: SourceSpec
    path: str  # absolute path or URI, for Beam's FileSystems
    display: str  # the path people see in origins: relative to the spec when possible
    span: LineRange | None = None  # the bytes of a large text file this unit reads
    rows: tuple[int, int] | None = None  # the rows of a large array file this unit reads

    @property
    def first_line(self) -> int:
        return self.span.first_line if self.span else 1


def open_binary(unit: SourceFile) -> IO[bytes]:
    """The unit's bytes (its span's only, for part of a file), from any filesystem."""
    return open_range(filesystems.open_for_read(unit.path), unit.span)


def open_text(unit: SourceFile, encoding: str, newline: str | None = None) -> IO[str]:
    """The unit's text; undecodable bytes become ``UNDECODABLE`` code points."""
    return io.TextIOWrapper(
        open_binary(unit),
        encoding=reading_encoding(encoding),
        errors="surrogateescape",
        newline=newline,
    )


def source_record(unit: SourceFile, position: int, origin: str, fields: dict[str, Any]) -> Record:
    """A record of ``unit`` at ``position`` (line, index, ...), ranked by where it was read.

    A table's records also carry its directory, since their cells may name image files
    beside it."""
    record = {**fields, ORIGIN: origin, RANK: make_rank(unit.index, unit.display, position)}
    if unit.source.type in TABLE_SOURCES:
        record[TABLE_DIR] = filesystems.split(unit.path)[0]
    return record


def quarantined(origin: str, reason: str, raw: Any) -> dict[str, str]:
    """A quarantine entry of the read stage."""
    return quarantine_entry(origin, STAGE, reason, raw)


class UnreadableFile(ValueError):
    """None of a file's records can be read; ``origin`` says where, ``reason`` why."""

    def __init__(self, origin: str, reason: str, raw: str = "") -> None:
        super().__init__(reason)
        self.origin, self.reason, self.raw = origin, reason, raw


class UnreadableEntry(dict):
    """The quarantine entry of a whole file that could not be read (``UnreadableFile``,
    or an ``OSError`` while reading it); a plain dict otherwise."""


def unreadable_entry(origin: str, reason: str, raw: Any = "") -> UnreadableEntry:
    return UnreadableEntry(quarantined(origin, reason, raw))


def check_encoding(index: int, encoding: str) -> None:
    """ConfigError naming ``sources.<index>.encoding`` if Python has no such codec."""
    try:
        codecs.lookup(encoding)
    except LookupError:
        raise ConfigError(f"sources.{index}.encoding: unknown encoding {encoding!r}") from None


def reading_encoding(encoding: str) -> str:
    """UTF-8 files are read as ``utf-8-sig`` so a leading byte-order mark is not data."""
    return "utf-8-sig" if codecs.lookup(encoding).name == "utf-8" else encoding


def undecodable(text: str, encoding: str) -> str | None:
    """A printable form of ``text`` if it held bytes invalid in ``encoding``, else None."""
    if not UNDECODABLE.search(text):
        return None
    return text.encode(encoding, "surrogateescape").decode(encoding, "backslashreplace")


def encode_array_png(pixels: np.ndarray) -> bytes:
    """PNG bytes of one uint8 image array (H x W or H x W x C)."""
    if pixels.ndim == 3 and pixels.shape[-1] == 1:
        pixels = pixels[..., 0]
    return encode_png(Image.fromarray(np.ascontiguousarray(pixels)))


def encode_png(image: Image.Image) -> bytes:
    """PNG bytes of the pixels alone.

    The image is rebuilt from its pixels first so that no metadata (ICC profile,
    text chunks, transparency, EXIF) rides along: equal pixels give equal bytes.
    """
    bare = Image.frombytes(image.mode, image.size, image.tobytes())
    buffer = io.BytesIO()
    bare.save(buffer, format="PNG")
    return buffer.getvalue()
