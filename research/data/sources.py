"""Read the spec's sources into records: CSV, JSON lines, text, image folders, NPZ, HDF5.

Each source type has one reader: a plain generator over one matched file (or one
image-folder root) that yields records and quarantine entries. The Beam pipeline
(``ReadSources``) and schema inference (``sample_records``) both run these same
generators, so the schema is inferred from exactly what the pipeline will read.
Each type also says which columns a file offers (``source_columns``), so that the
names a spec uses are checked against the data before anything runs.

Readers stream: a CSV or text file is never held in memory whole, an HDF5 file is
read in chunks. Bad input (a malformed row, an undecodable line, an image that does
not decode) becomes a quarantine entry with its origin (``path:line``), never an
exception that would stop the pipeline. A spec or a file that cannot work at all (no
file matches a path, an unknown encoding, a CSV file whose header repeats a name or
whose rows never have its header's width, an empty file, arrays of different lengths,
an image folder without images) is a ConfigError naming the file, raised by
``source_columns`` before anything runs. Such a file is never quarantined as one
record: if one turns unreadable after the checks, the build is refused
(``UNREADABLE_FILES``, research.data.quality).
"""

from __future__ import annotations

import glob
import json
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from itertools import islice
from pathlib import Path
from typing import Any

import apache_beam as beam

from contracts.yaml_config import ConfigError
from research.data import filesystems, line_ranges
from research.data.array_sources import (
    hdf5_columns,
    hdf5_row_ranges,
    npz_columns,
    read_hdf5,
    read_npz,
)
from research.data.csv_source import (
    check_csv_options,
    csv_columns,
    csv_notes,
    read_csv,
    row_starts,
)
from research.data.line_ranges import line_starts, plan_ranges, splittable_encoding
from research.data.quality import UNREADABLE_FILES
from research.data.reading import (
    SourceFile,
    SourceSpec,
    UnreadableEntry,
    UnreadableFile,
    check_encoding,
    open_text,
    quarantined,
    source_record,
    undecodable,
    unreadable_entry,
)
from research.data.records import QUARANTINE_TAG, RANK, Record, count, is_bookkeeping
from research.data.spec import (
    CsvSource,
    DatasetSpec,
    Hdf5Source,
    ImageFolderSource,
    JsonlSource,
    TextSource,
)

IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".gif"})
JSONL_COLUMN_SAMPLE = 1000  # records of a JSON lines file whose keys are its columns
SKIPPED_FILES = "read.skipped_files"  # files of an image folder that are not images
SKIPPED_SHOWN = 3  # skipped files named in a message


def check_sources(spec: DatasetSpec) -> list[SourceFile]:
    """Match every source path; fail before the pipeline runs if a source cannot be read.

    Matching happens here, at pipeline build time, so that a typo in a path is a
    ConfigError naming the spec key rather than an empty dataset.
    """
    units: list[SourceFile] = []
    for index, source in enumerate(spec.sources):
        _check_options(index, source)
        pattern = spec.resolve(source.path)
        want_folder = source.type == "image_folder"
        usable = _match_folders(pattern) if want_folder else filesystems.match_files(pattern)
        if not usable:
            if not filesystems.anything_at(pattern):
                raise ConfigError(f"sources.{index}.path: no such file or folder: {pattern}")
            problem = (
                "is not a folder (expected one sub-folder per class)"
                if want_folder
                else "is a folder, expected a file or a glob matching files"
            )
            raise ConfigError(f"sources.{index}.path: {pattern} {problem}")
        units.extend(
            SourceFile(index, source, path, _display(path, spec.base_dir)) for path in usable
        )
    return units


def _check_options(index: int, source: SourceSpec) -> None:
    if isinstance(source, CsvSource):
        check_csv_options(index, source)
    if isinstance(source, TextSource):
        check_encoding(index, source.encoding)


def _match_folders(pattern: str) -> list[str]:
    if filesystems.is_local(pattern) and filesystems.has_wildcards(pattern):
        candidates = sorted(glob.glob(pattern, recursive=True))
    else:
        candidates = [pattern]
    return [path for path in candidates if filesystems.is_folder(path)]


def _display(path: str, base_dir: str) -> str:
    if not filesystems.is_local(path):
        return path
    resolved = Path(path).resolve()
    try:
        return resolved.relative_to(Path(base_dir).resolve()).as_posix()
    except ValueError:
        return resolved.as_posix()


@dataclass(frozen=True)
class SourceColumns:
    """The columns one source offers, and what to call the source in a message."""

    index: int
    where: str  # the file, or the pattern and how many files it matched
    columns: list[str]
    exhaustive: bool  # False when the columns are those of a sample (JSON lines keys)


def source_columns(spec: DatasetSpec) -> list[SourceColumns]:
    """The columns (after ``rename``) of every source, each file's in first-seen order.

    ConfigError for a file that the spec misreads as a whole (see ``csv_columns``).
    """
    units = check_sources(spec)
    found = []
    for index, source in enumerate(spec.sources):
        files = [unit for unit in units if unit.index == index]
        columns = [column for unit in files for column in _READERS[source.type].columns(unit)]
        where = files[0].display if len(files) == 1 else f"{source.path} ({len(files)} files)"
        reader = _READERS[source.type]
        found.append(SourceColumns(index, where, list(dict.fromkeys(columns)), reader.exhaustive))
    return found


def is_record(item: dict[str, Any]) -> bool:
    """Tell a reader's records from its quarantine entries (only records carry a rank)."""
    return RANK in item


def read_source_file(unit: SourceFile) -> Iterator[dict[str, Any]]:
    """Records and quarantine entries of one matched file, in file order.

    A file that cannot be read at all ends with an ``UnreadableEntry``: the checks
    before the build refuse such files, so one met here changed or vanished since.
    """
    try:
        yield from _READERS[unit.source.type].read(unit)
    except UnreadableFile as exc:
        yield unreadable_entry(exc.origin, exc.reason, exc.raw)
    except OSError as exc:
        # What was already read stays, but how much was not is unknown.
        yield unreadable_entry(unit.display, f"cannot read file: {exc.strerror or exc}")


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
                if isinstance(item, UnreadableEntry):
                    count(UNREADABLE_FILES)
                    item = dict(item)
                yield beam.pvalue.TaggedOutput(QUARANTINE_TAG, item)


def file_parts(unit: SourceFile, range_bytes: int) -> list[SourceFile]:
    """The unit itself, or for a large file, parts of about ``range_bytes``: byte ranges
    of a line-oriented file that each begin a record (see ``research.data.line_ranges``),
    row ranges of an HDF5 file."""
    source = unit.source
    if isinstance(source, CsvSource):
        starts: Callable[[SourceFile], Iterator[tuple[int, int]]] = row_starts
        encoding = source.encoding
    elif isinstance(source, JsonlSource) or (
        isinstance(source, TextSource) and source.mode == "line"
    ):
        starts, encoding = _line_starts, getattr(source, "encoding", "utf-8")
    elif isinstance(source, Hdf5Source):
        rows = hdf5_row_ranges(unit, range_bytes)
        return [replace(unit, rows=part) for part in rows] if rows else [unit]
    else:
        return [unit]
    try:
        size = filesystems.size(unit.path)
        if size <= range_bytes or not splittable_encoding(encoding):
            return [unit]
        ranges = plan_ranges(starts(unit), size, range_bytes)
    except OSError:
        return [unit]  # reading it whole says what is wrong with it
    return [replace(unit, span=span) for span in ranges]


def _line_starts(unit: SourceFile) -> Iterator[tuple[int, int]]:
    with filesystems.open_for_read(unit.path) as handle:
        yield from line_starts(handle)


class ReadSources(beam.PTransform):
    """Pipeline root -> records of every source (main output) and ``quarantine``.

    One element per matched file, reshuffled so that a distributed runner plans the
    files in parallel instead of fusing them all onto the worker that created the
    list; then one element per part of a large file (``file_parts``), reshuffled
    again, so that a large file is read by many workers at once.
    ``range_bytes``: about how much of a file one part reads.
    """

    def __init__(self, spec: DatasetSpec, range_bytes: int | None = None) -> None:
        super().__init__()
        self._spec = spec
        self._range_bytes = range_bytes

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.pvalue.DoOutputsTuple:
        units = check_sources(self._spec)
        range_bytes = self._range_bytes or line_ranges.RANGE_BYTES
        return (
            pbegin
            | "MatchedFiles" >> beam.Create(units)
            | "DistributeFiles" >> beam.Reshuffle()
            | "Parts" >> beam.FlatMap(file_parts, range_bytes)
            | "DistributeParts" >> beam.Reshuffle()
            | "Read" >> beam.ParDo(_ReadFileFn()).with_outputs(QUARANTINE_TAG, main="records")
        )


# --- JSON lines, text, image folders --------------------------------------------------


def _read_jsonl(unit: SourceFile) -> Iterator[dict[str, Any]]:
    source: JsonlSource = unit.source  # type: ignore[assignment]
    with open_text(unit, "utf-8") as handle:
        for number, line in enumerate(handle, start=unit.first_line):
            if not line.strip():
                continue
            origin = f"{unit.display}:{number}"
            printable = undecodable(line, "utf-8")
            if printable is not None:
                yield quarantined(origin, "line is not valid UTF-8", printable)
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as exc:
                yield quarantined(origin, f"invalid JSON: {exc.msg} at column {exc.colno}", line)
                continue
            except RecursionError:
                yield quarantined(origin, "invalid JSON: nested too deeply", line)
                continue
            if not isinstance(value, dict):
                reason = f"expected a JSON object, got {type(value).__name__}"
                yield quarantined(origin, reason, line)
                continue
            if _has_lone_surrogate(value):
                reason = "invalid JSON string: an unpaired \\u surrogate escape is not text"
                yield quarantined(origin, reason, line)
                continue
            fields = {source.rename.get(key, key): item for key, item in value.items()}
            yield source_record(unit, number, origin, fields)


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
    with open_text(unit, source.encoding) as handle:
        if source.mode == "file":
            text = handle.read()
            if not text.strip():
                return
            printable = undecodable(text, source.encoding)
            if printable is not None:
                reason = f"file is not valid {source.encoding}"
                yield quarantined(unit.display, reason, printable)
                return
            yield source_record(unit, 0, unit.display, {source.field: text, **label})
            return
        for number, line in enumerate(handle, start=unit.first_line):
            text = line.rstrip("\n")
            if not text.strip():
                continue
            origin = f"{unit.display}:{number}"
            printable = undecodable(text, source.encoding)
            if printable is not None:
                yield quarantined(origin, f"line is not valid {source.encoding}", printable)
                continue
            yield source_record(unit, number, origin, {source.field: text, **label})


def _read_image_folder(unit: SourceFile) -> Iterator[dict[str, Any]]:
    source: ImageFolderSource = unit.source  # type: ignore[assignment]
    folder = _image_folder(unit.path)
    if not folder.images:
        raise UnreadableFile(unit.display, _no_images(folder))
    if folder.skipped:
        count(SKIPPED_FILES, len(folder.skipped))
    for position, (class_name, name, path) in enumerate(folder.images):
        origin = f"{unit.display}/{class_name}/{name}"
        try:
            data = filesystems.read_bytes(path)
        except OSError as exc:
            yield quarantined(origin, f"cannot read file: {exc.strerror or exc}", "")
            continue
        fields = {source.image_field: data, source.label_field: class_name}
        yield source_record(unit, position, origin, fields)


@dataclass(frozen=True)
class ImageFolder:
    """What an image folder holds: ``(class, file name, path)`` of each image, sorted, and
    the paths (relative to the folder) of the other files, which are not read."""

    images: list[tuple[str, str, str]]
    skipped: list[str]


def _image_folder(root: str) -> ImageFolder:
    """The images directly inside a class folder of ``root``, with an accepted suffix.

    Every other file is skipped: one with another suffix, one outside a class folder or
    deeper down. Hidden class folders are not classes, and hidden files that are not
    images (``.DS_Store``) or inside hidden folders (``.git/``) are not counted.
    """
    prefix = root.rstrip("/") + "/"
    images, skipped = [], []
    for path in filesystems.files_under(root):
        relative = path[len(prefix) :]
        parts = relative.split("/")
        if parts[0].startswith("."):
            continue
        if len(parts) == 2 and Path(parts[1]).suffix.lower() in IMAGE_SUFFIXES:
            images.append((parts[0], parts[1], path))
        elif not any(part.startswith(".") for part in parts):
            skipped.append(relative)
    return ImageFolder(sorted(images), sorted(skipped))


def _suffixes() -> str:
    return "|".join(sorted(suffix.lstrip(".") for suffix in IMAGE_SUFFIXES))


def _no_images(folder: ImageFolder) -> str:
    found = ""
    if folder.skipped:
        found = f"; it holds only {len(folder.skipped)} other file(s): {_listed(folder.skipped)}"
    return f"no images: expected <class>/*.{{{_suffixes()}}} under the folder{found}"


def _listed(paths: list[str]) -> str:
    return ", ".join(paths[:SKIPPED_SHOWN]) + (", …" if len(paths) > SKIPPED_SHOWN else "")


def source_notes(spec: DatasetSpec) -> list[str]:
    """One line per file or folder the build reads otherwise than its user may expect,
    naming it and the fix: image-folder sources that skip files (a few of them named), CSV
    files with a header row and no data rows, or with pandas' index column."""
    notes = []
    for unit in check_sources(spec):
        if isinstance(unit.source, CsvSource):
            notes.extend(f"sources.{unit.index}: {unit.display}: {n}" for n in csv_notes(unit))
        if isinstance(unit.source, ImageFolderSource):
            skipped = _image_folder(unit.path).skipped
            if skipped:
                notes.append(
                    f"sources.{unit.index}: {unit.display}: {len(skipped)} file(s) skipped, "
                    f"not <class>/*.{{{_suffixes()}}} images: {_listed(skipped)}"
                )
    return notes


def _jsonl_columns(unit: SourceFile) -> list[str]:
    """The keys of the file's first ``JSONL_COLUMN_SAMPLE`` objects, first seen first."""
    records = islice(filter(is_record, _read_jsonl(unit)), JSONL_COLUMN_SAMPLE)
    keys = (key for record in records for key in record if not is_bookkeeping(key))
    return list(dict.fromkeys(keys))


def _text_columns(unit: SourceFile) -> list[str]:
    source: TextSource = unit.source  # type: ignore[assignment]
    return [source.field] + ([] if source.label is None else [source.label_field])


def _image_folder_columns(unit: SourceFile) -> list[str]:
    """The image and label fields; ConfigError for a folder without images."""
    source: ImageFolderSource = unit.source  # type: ignore[assignment]
    folder = _image_folder(unit.path)
    if not folder.images:
        raise ConfigError(f"sources.{unit.index}: {unit.display}: {_no_images(folder)}")
    return [source.image_field, source.label_field]


@dataclass(frozen=True)
class _Reader:
    read: Callable[[SourceFile], Iterator[dict[str, Any]]]
    columns: Callable[[SourceFile], list[str]]
    exhaustive: bool = True  # whether ``columns`` are all the columns a file can have


_READERS: dict[str, _Reader] = {
    "csv": _Reader(read_csv, csv_columns),
    "jsonl": _Reader(_read_jsonl, _jsonl_columns, exhaustive=False),
    "text": _Reader(_read_text, _text_columns),
    "image_folder": _Reader(_read_image_folder, _image_folder_columns),
    "npz": _Reader(read_npz, npz_columns),
    "hdf5": _Reader(read_hdf5, hdf5_columns),
}
