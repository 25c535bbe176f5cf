"""Read the spec's sources into records: CSV, JSON lines, text, image folders, NPZ.

Each source type has one reader: a plain generator over one matched file (or one
image-folder root) that yields records and quarantine entries. The Beam pipeline
(``ReadSources``) and schema inference (``sample_records``) both run these same
generators, so the schema is inferred from exactly what the pipeline will read.

Readers stream: a CSV or text file is never held in memory whole. Bad input (a
malformed row, an undecodable line, an unreadable file) becomes a quarantine entry
with its origin (``path:line``), never an exception that would stop the pipeline.
Only a spec that cannot work at all (no file matches a path, an unknown encoding)
is an error, raised by ``check_sources`` before anything runs.
"""

from __future__ import annotations

import codecs
import csv
import glob
import io
import json
import re
import zipfile
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apache_beam as beam
import numpy as np
from PIL import Image

from contracts.yaml_config import ConfigError
from research.data.records import (
    ORIGIN,
    QUARANTINE_TAG,
    RANK,
    Record,
    count,
    make_rank,
    quarantine_entry,
)
from research.data.spec import (
    CsvSource,
    DatasetSpec,
    ImageFolderSource,
    JsonlSource,
    NpzSource,
    TextSource,
)

SourceSpec = CsvSource | JsonlSource | TextSource | ImageFolderSource | NpzSource
IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg"})
STAGE = "read"

# ``surrogateescape`` turns every undecodable byte into one of these code points, so a
# reader can keep streaming past a bad line and still tell it apart from good text.
_UNDECODABLE = re.compile("[\udc80-\udcff]")


@dataclass(frozen=True)
class SourceFile:
    """One unit of reading: a matched file, or an image-folder root."""

    index: int  # position of the source in ``spec.sources``
    source: SourceSpec
    path: str  # absolute path on disk
    display: str  # the path people see in origins: relative to the spec when possible


def check_sources(spec: DatasetSpec) -> list[SourceFile]:
    """Match every source path; fail before the pipeline runs if a source cannot be read.

    Matching happens here, at pipeline build time, so that a typo in a path is a
    ConfigError naming the spec key rather than an empty dataset.
    """
    units: list[SourceFile] = []
    for index, source in enumerate(spec.sources):
        _check_options(index, source)
        pattern = spec.resolve(source.path)
        matches = _match(pattern)
        if not matches:
            raise ConfigError(f"sources.{index}.path: no such file or folder: {pattern}")
        want_folder = source.type == "image_folder"
        usable = [path for path in matches if path.is_dir() == want_folder]
        if not usable:
            problem = (
                "is not a folder (expected one sub-folder per class)"
                if want_folder
                else "is a folder, expected a file or a glob matching files"
            )
            raise ConfigError(f"sources.{index}.path: {pattern} {problem}")
        units.extend(
            SourceFile(index, source, str(path), _display(path, Path(spec.base_dir)))
            for path in usable
        )
    return units


def _check_options(index: int, source: SourceSpec) -> None:
    if isinstance(source, TextSource):
        try:
            codecs.lookup(source.encoding)
        except LookupError:
            raise ConfigError(
                f"sources.{index}.encoding: unknown encoding {source.encoding!r}"
            ) from None
    if isinstance(source, CsvSource) and len(source.delimiter) != 1:
        raise ConfigError(
            f"sources.{index}.delimiter: must be a single character, got {source.delimiter!r}"
        )


def _match(pattern: Path) -> list[Path]:
    if any(char in str(pattern) for char in "*?["):
        return [Path(path) for path in sorted(glob.glob(str(pattern), recursive=True))]
    return [pattern] if pattern.exists() else []


def _display(path: Path, base_dir: Path) -> str:
    try:
        return path.resolve().relative_to(base_dir.resolve()).as_posix()
    except ValueError:
        return path.resolve().as_posix()


def is_record(item: dict[str, Any]) -> bool:
    """Tell a reader's records from its quarantine entries (only records carry a rank)."""
    return RANK in item


def read_source_file(unit: SourceFile) -> Iterator[dict[str, Any]]:
    """Records and quarantine entries of one matched file, in file order."""
    try:
        yield from _READERS[unit.source.type](unit)
    except OSError as exc:
        # The file vanished or became unreadable after matching; what was already read stays.
        yield _quarantined(unit.display, f"cannot read file: {exc.strerror or exc}", "")


def sample_records(spec: DatasetSpec, limit: int) -> list[Record]:
    """Up to ``limit`` records, taken in turn from each source.

    Taking them in turn (not the first ``limit`` of the first source) lets every
    source's fields be seen when a spec mixes sources with different fields.
    """
    units = check_sources(spec)
    streams = deque(
        _records_of([unit for unit in units if unit.index == index])
        for index in range(len(spec.sources))
    )
    sample: list[Record] = []
    try:
        while streams and len(sample) < limit:
            stream = streams.popleft()
            record = next(stream, None)
            if record is not None:
                sample.append(record)
                streams.append(stream)
    finally:
        for stream in streams:
            stream.close()
    return sample


def _records_of(units: list[SourceFile]) -> Iterator[Record]:
    for unit in units:
        for item in read_source_file(unit):
            if is_record(item):
                yield item


class _ReadFileFn(beam.DoFn):
    """Read one matched file: records to the main output, bad input to quarantine."""

    def process(self, unit: SourceFile) -> Iterator[Any]:
        kind = unit.source.type
        for item in read_source_file(unit):
            if is_record(item):
                count(f"read.records.{kind}")
                yield item
            else:
                count("read.quarantined")
                yield beam.pvalue.TaggedOutput(QUARANTINE_TAG, item)


class ReadSources(beam.PTransform):
    """Pipeline root -> records of every source (main output) and ``quarantine``.

    One element per matched file, reshuffled, so a distributed runner reads the
    files in parallel instead of fusing them all onto the worker that created the list.
    """

    def __init__(self, spec: DatasetSpec) -> None:
        super().__init__()
        self._spec = spec

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.pvalue.DoOutputsTuple:
        units = check_sources(self._spec)
        return (
            pbegin
            | "MatchedFiles" >> beam.Create(units)
            | "Distribute" >> beam.Reshuffle()
            | "Read" >> beam.ParDo(_ReadFileFn()).with_outputs(QUARANTINE_TAG, main="records")
        )


# --- record helpers -----------------------------------------------------------------


def _record(unit: SourceFile, position: int, origin: str, fields: dict[str, Any]) -> Record:
    return {**fields, ORIGIN: origin, RANK: make_rank(unit.index, unit.display, position)}


def _quarantined(origin: str, reason: str, raw: Any) -> dict[str, str]:
    return quarantine_entry(origin, STAGE, reason, raw)


def _reading_encoding(encoding: str) -> str:
    """UTF-8 files are read as ``utf-8-sig`` so a leading byte-order mark is not data."""
    return "utf-8-sig" if codecs.lookup(encoding).name == "utf-8" else encoding


def _undecodable(text: str, encoding: str) -> str | None:
    """A printable form of ``text`` if it held bytes invalid in ``encoding``, else None."""
    if not _UNDECODABLE.search(text):
        return None
    return text.encode(encoding, "surrogateescape").decode(encoding, "backslashreplace")


# --- readers --------------------------------------------------------------------------


def _read_csv(unit: SourceFile) -> Iterator[dict[str, Any]]:
    source: CsvSource = unit.source  # type: ignore[assignment]
    with open(unit.path, encoding="utf-8-sig", errors="surrogateescape", newline="") as handle:
        reader = csv.reader(handle, delimiter=source.delimiter, strict=True)
        try:
            header = next(reader)
        except StopIteration:
            yield _quarantined(unit.display, "empty file: a header row is required", "")
            return
        except csv.Error as exc:
            yield _quarantined(f"{unit.display}:1", f"unreadable header row: {exc}", "")
            return
        fields = [source.rename.get(name.strip(), name.strip()) for name in header]
        problem = _header_problem(fields)
        if problem:
            yield _quarantined(f"{unit.display}:1", problem, source.delimiter.join(header))
            return
        while True:
            line = reader.line_num + 1  # where the next row starts; a row may span lines
            origin = f"{unit.display}:{line}"
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                yield _quarantined(origin, f"malformed CSV row: {exc}", "")
                continue
            if not row:
                continue  # a blank line
            raw = source.delimiter.join(row)
            if len(row) != len(fields):
                reason = f"expected {len(fields)} columns, got {len(row)}"
                yield _quarantined(origin, reason, raw)
                continue
            printable = _undecodable(raw, "utf-8")
            if printable is not None:
                yield _quarantined(origin, "row is not valid UTF-8", printable)
                continue
            values = {
                name: (value if value != "" else None)
                for name, value in zip(fields, row, strict=True)
            }
            yield _record(unit, line, origin, values)


def _header_problem(fields: list[str]) -> str | None:
    if any(_UNDECODABLE.search(name) for name in fields):
        return "header row is not valid UTF-8"
    if "" in fields:
        return f"header column {fields.index('') + 1} has no name"
    duplicates = sorted({name for name in fields if fields.count(name) > 1})
    if duplicates:
        return f"duplicate column names after rename: {', '.join(duplicates)}"
    return None


def _read_jsonl(unit: SourceFile) -> Iterator[dict[str, Any]]:
    source: JsonlSource = unit.source  # type: ignore[assignment]
    with open(unit.path, encoding="utf-8-sig", errors="surrogateescape") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            origin = f"{unit.display}:{number}"
            printable = _undecodable(line, "utf-8")
            if printable is not None:
                yield _quarantined(origin, "line is not valid UTF-8", printable)
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as exc:
                yield _quarantined(origin, f"invalid JSON: {exc.msg} at column {exc.colno}", line)
                continue
            except RecursionError:
                yield _quarantined(origin, "invalid JSON: nested too deeply", line)
                continue
            if not isinstance(value, dict):
                reason = f"expected a JSON object, got {type(value).__name__}"
                yield _quarantined(origin, reason, line)
                continue
            if _has_lone_surrogate(value):
                reason = "invalid JSON string: an unpaired \\u surrogate escape is not text"
                yield _quarantined(origin, reason, line)
                continue
            fields = {source.rename.get(key, key): item for key, item in value.items()}
            yield _record(unit, number, origin, fields)


def _has_lone_surrogate(value: Any) -> bool:
    """JSON may escape half a surrogate pair (``"\\udc80"``); such a string cannot be
    encoded as UTF-8 anywhere downstream, so the line is refused here."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, dict):
        return any(_has_lone_surrogate(k) or _has_lone_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_lone_surrogate(item) for item in value)
    return False


def _read_text(unit: SourceFile) -> Iterator[dict[str, Any]]:
    source: TextSource = unit.source  # type: ignore[assignment]
    label = {} if source.label is None else {source.label_field: source.label}
    encoding = _reading_encoding(source.encoding)
    with open(unit.path, encoding=encoding, errors="surrogateescape") as handle:
        if source.mode == "file":
            text = handle.read()
            if not text.strip():
                return
            printable = _undecodable(text, source.encoding)
            if printable is not None:
                reason = f"file is not valid {source.encoding}"
                yield _quarantined(unit.display, reason, printable)
                return
            yield _record(unit, 0, unit.display, {source.field: text, **label})
            return
        for number, line in enumerate(handle, start=1):
            text = line.rstrip("\n")
            if not text.strip():
                continue
            origin = f"{unit.display}:{number}"
            printable = _undecodable(text, source.encoding)
            if printable is not None:
                yield _quarantined(origin, f"line is not valid {source.encoding}", printable)
                continue
            yield _record(unit, number, origin, {source.field: text, **label})


def _read_image_folder(unit: SourceFile) -> Iterator[dict[str, Any]]:
    source: ImageFolderSource = unit.source  # type: ignore[assignment]
    root = Path(unit.path)
    position = 0
    classes = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    for class_dir in classes:
        files = sorted(
            p for p in class_dir.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES
        )
        for path in files:
            origin = f"{unit.display}/{class_dir.name}/{path.name}"
            try:
                data = path.read_bytes()
            except OSError as exc:
                yield _quarantined(origin, f"cannot read file: {exc.strerror or exc}", "")
                continue
            fields = {source.image_field: data, source.label_field: class_dir.name}
            yield _record(unit, position, origin, fields)
            position += 1
    if position == 0:
        reason = "no images: expected <class>/*.png|jpg|jpeg under the folder"
        yield _quarantined(unit.display, reason, "")


def _read_npz(unit: SourceFile) -> Iterator[dict[str, Any]]:
    source: NpzSource = unit.source  # type: ignore[assignment]
    try:
        columns = _load_npz_columns(unit.path, source)
    except (ValueError, zipfile.BadZipFile, EOFError, zlib.error) as exc:
        yield _quarantined(unit.display, f"cannot use npz file: {exc}", "")
        return
    if not columns:
        return
    length = len(next(iter(columns.values())))
    for position in range(length):
        fields = {
            name: _npz_value(array[position], image=name in source.images)
            for name, array in columns.items()
        }
        yield _record(unit, position, f"{unit.display}[{position}]", fields)


def _load_npz_columns(path: str, source: NpzSource) -> dict[str, np.ndarray]:
    """Field name -> array, checked so that every index is one record.

    ``allow_pickle=False``: an npz may come from anywhere and unpickling runs code.
    """
    loaded = np.load(path, allow_pickle=False)
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        raise ValueError("not an .npz archive (a single .npy array?)")
    with loaded as archive:
        names = list(archive.files)
        mapping = source.arrays or {name: name for name in names}
        missing = [name for name in mapping if name not in names]
        if missing:
            raise ValueError(
                f"no array named {', '.join(missing)} (arrays: {', '.join(names) or 'none'})"
            )
        columns = {field: archive[name] for name, field in mapping.items()}
    unknown = [field for field in source.images if field not in columns]
    if unknown:
        raise ValueError(f"images: {', '.join(unknown)} not among fields {', '.join(columns)}")
    scalars = [field for field, array in columns.items() if array.ndim == 0]
    if scalars:
        raise ValueError(f"arrays without a first dimension: {', '.join(scalars)}")
    lengths = {field: len(array) for field, array in columns.items()}
    if len(set(lengths.values())) > 1:
        described = ", ".join(f"{field} ({length})" for field, length in lengths.items())
        raise ValueError(f"arrays must share their first dimension, got {described}")
    for field in source.images:
        columns[field] = _image_stack(field, columns[field])
    return columns


def _image_stack(field: str, array: np.ndarray) -> np.ndarray:
    """Validate a stack of images (N x H x W or N x H x W x C) and make it uint8."""
    if not (array.ndim == 3 or (array.ndim == 4 and array.shape[-1] in (1, 2, 3, 4))):
        raise ValueError(
            f"images: field {field!r} has shape {list(array.shape)}, "
            "expected N x H x W or N x H x W x C with C in 1..4"
        )
    if array.dtype == np.uint8:
        return array
    if array.dtype.kind in "biuf":
        values = array.astype(np.float64)
        if np.all(
            np.isfinite(values) & (values == np.round(values)) & (values >= 0) & (values <= 255)
        ):
            return array.astype(np.uint8)
    raise ValueError(
        f"images: field {field!r} has dtype {array.dtype} with values that are not "
        "whole numbers in 0..255; scale it to uint8"
    )


def _npz_value(value: Any, *, image: bool) -> Any:
    """Plain Python for Beam's coders: images -> PNG, scalars -> int/float/str, rows -> lists."""
    if image:
        return encode_array_png(value)
    return value.tolist() if isinstance(value, np.ndarray) else value.item()


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


_READERS: dict[str, Callable[[SourceFile], Iterator[dict[str, Any]]]] = {
    "csv": _read_csv,
    "jsonl": _read_jsonl,
    "text": _read_text,
    "image_folder": _read_image_folder,
    "npz": _read_npz,
}
