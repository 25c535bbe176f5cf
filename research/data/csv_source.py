"""CSV files as people have them: with or without a header, after a title, with comments.

Options of a ``type: csv`` source (defaults in brackets):

- ``header`` [``first_row``]: the first line read names the columns; ``none``: every
  line is data, and the columns are ``names`` or ``column_1``, ``column_2``, ...
- ``skip_lines`` [0]: lines skipped at the top of every file before the header or the
  data, e.g. the ``569,30,malignant,benign`` count line of scikit-learn's CSV files.
- ``names`` [none]: the column names; with a header row they replace its names.
- ``delimiter`` [``,``], ``encoding`` [``utf-8``; a byte-order mark is not data].
- ``comment`` [none]: lines starting with this text are ignored (``#``).
- ``na_values`` [``""``, ``NA``, ``N/A``, ``n/a``, ``null``, ``?``, ``-``]: cells that,
  without their surrounding spaces, mean missing; they are read as missing values.
- ``rename`` [none]: column -> field name, applied after ``names``. ``"": NAME`` names
  a column whose header cell is empty.

pandas' ``DataFrame.to_csv()`` writes the frame's index as a first column with an empty
header cell. Such a column, when its first rows hold increasing integers (0, 1, 2, …),
is read as the row's index and left out of the records; ``rename: {"": NAME}`` keeps it
as a field instead.

A row whose width differs from the columns' is quarantined with its line. A file
that the spec cannot read at all is refused before the build by ``csv_columns``, with
the fix: when no row near the top has the columns' width (usually a file without a
header row), when its columns cannot be known (an empty file, a header that repeats a
name or leaves one empty) or when ``rename`` gives two columns one name.
"""

from __future__ import annotations

import codecs
import contextlib
import csv
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import IO, Any

from contracts.yaml_config import ConfigError
from research.data import filesystems
from research.data.line_ranges import physical_lines
from research.data.reading import (
    UNDECODABLE,
    SourceFile,
    UnreadableFile,
    check_encoding,
    open_text,
    quarantined,
    reading_encoding,
    source_record,
    undecodable,
)
from research.data.spec import CsvSource

DEFAULT_COLUMN = "column_{}"  # names of the columns of a file without header or names
INDEX_COLUMN = ""  # the column of pandas' index: read, and left out of the records
ROWS_CHECKED = 20  # rows compared with the columns' width before the build
_HEADER_PREVIEW_CHARS = 60

Row = list[str] | str  # the cells of a row, or why it could not be parsed


class _Lines:
    """The file's lines without skipped and comment lines, remembering where a row starts.

    ``csv.reader`` pulls lines one by one (a quoted cell may span several), so the
    physical line of a row's first line is known here and not in the reader.
    """

    def __init__(
        self, handle: Iterator[str] | IO[str], skip: int, comment: str | None, first_line: int = 1
    ) -> None:
        self._handle = handle
        self._skip = skip
        self._comment = comment
        self.number = first_line - 1  # physical number of the last line read
        self.row_start = 0  # physical number of the first line of the current row

    def __iter__(self) -> _Lines:
        return self

    def __next__(self) -> str:
        while True:
            line = next(self._handle)
            self.number += 1
            if self.number <= self._skip:
                continue
            if self._comment is not None and line.startswith(self._comment):
                continue
            if not self.row_start:
                self.row_start = self.number
            return line


def _rows(lines: _Lines, source: CsvSource) -> Iterator[tuple[int, Row]]:
    """(line, cells or parse problem) for every non-blank row, in file order."""
    reader = csv.reader(lines, delimiter=source.delimiter, strict=True)
    while True:
        lines.row_start = 0
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            yield lines.row_start or lines.number, f"malformed CSV row: {exc}"
            continue
        if row:
            yield lines.row_start, row


class _HeaderProblem(UnreadableFile):
    """The columns of a file cannot be known, so none of its rows can be read."""


@dataclass
class _Table:
    columns: list[str]  # INDEX_COLUMN first when the file has pandas' index
    header: tuple[int, list[str]] | None  # the header row's line and cells
    rows: Iterator[tuple[int, Row]]  # the data rows

    @property
    def has_index(self) -> bool:
        return bool(self.columns) and self.columns[0] == INDEX_COLUMN

    @property
    def fields(self) -> list[str]:
        """The columns that become fields of a record."""
        return self.columns[1:] if self.has_index else self.columns


def _table(unit: SourceFile, lines: _Lines, peek: bool = True) -> _Table:
    """The file's columns (header, ``names`` or numbered, then ``rename``) and its rows,
    from ``lines`` read from the top of the file.

    Whether an unnamed first column is pandas' index is seen in the first rows; without
    ``peek`` (when ``lines`` must stop right after the header) it is taken to be one.
    """
    source: CsvSource = unit.source  # type: ignore[assignment]
    rows = _rows(lines, source)
    header = None
    if source.header == "first_row":
        first = next(rows, None)
        if first is None:
            skipped = f" after the {source.skip_lines} skipped lines" if source.skip_lines else ""
            raise _HeaderProblem(
                unit.display,
                f"empty file: a header row is required{skipped}; remove the file or leave it "
                "out of the path",
            )
        line, cells = first
        if isinstance(cells, str):
            raise _HeaderProblem(f"{unit.display}:{line}", f"unreadable header row: {cells}")
        header = (line, cells)
        names = source.names or [cell.strip() for cell in cells]
    elif source.names is not None:
        names = list(source.names)
    else:
        names, rows = _numbered_columns(rows)
    columns = [source.rename.get(name, name) for name in names]
    index = False
    if header and not source.names and _may_be_an_index(names, source):
        index = True
        if peek:
            index, rows = _pandas_index(rows)
    first = 1 if index else 0
    problem = _columns_problem(names[first:], columns[first:], source)
    if problem:
        origin = f"{unit.display}:{header[0]}" if header else unit.display
        raise _HeaderProblem(origin, problem, source.delimiter.join(header[1] if header else []))
    return _Table(columns, header, rows)


def _may_be_an_index(names: list[str], source: CsvSource) -> bool:
    """Only the first header cell is empty, and ``rename`` does not name it."""
    return bool(names) and names[0] == "" and "" not in names[1:] and "" not in source.rename


def _pandas_index(rows: Iterator[tuple[int, Row]]) -> tuple[bool, Iterator[tuple[int, Row]]]:
    """Whether the first column of the first ``ROWS_CHECKED`` rows holds increasing
    integers, as pandas writes a frame's index (an empty frame's file has no rows to say
    otherwise); the rows, none of them consumed."""
    peeked = list(itertools.islice(rows, ROWS_CHECKED))
    firsts = [row[0].strip() for _, row in peeked if isinstance(row, list) and row]
    if not firsts:
        return True, itertools.chain(peeked, rows)
    try:
        numbers = [int(cell) for cell in firsts]
    except ValueError:
        numbers = []
    increasing = bool(numbers) and all(a < b for a, b in itertools.pairwise(numbers))
    return increasing, itertools.chain(peeked, rows)


def _numbered_columns(
    rows: Iterator[tuple[int, Row]],
) -> tuple[list[str], Iterator[tuple[int, Row]]]:
    """``column_1``, ``column_2``, ... as many as the first parseable row has cells; the
    rows, none of them consumed."""
    peeked = []
    for item in rows:
        peeked.append(item)
        if isinstance(item[1], list):
            break
    width = len(peeked[-1][1]) if peeked and isinstance(peeked[-1][1], list) else 0
    names = [DEFAULT_COLUMN.format(number) for number in range(1, width + 1)]
    return names, itertools.chain(peeked, rows)


def _columns_problem(names: list[str], columns: list[str], source: CsvSource) -> str | None:
    """Why ``names`` (the header's, or ``names``) or ``columns`` (after ``rename``) cannot
    name the file's columns, with the fix; None when they can."""
    if any(UNDECODABLE.search(name) for name in names):
        return (
            f"header row is not valid {_spelled(source.encoding)}; set encoding to the "
            "file's encoding"
        )
    if "" in names and "" not in source.rename:
        return (
            f"header column {names.index('') + 1} has no name; name it with rename: "
            "{'': NAME}, or every column with names: [...]"
        )
    repeated = _repeated(names)
    if repeated:
        return (
            f"the header repeats {repeated}; give the columns unique names with names: [...] "
            "(one per column, in order; they replace the header's)"
        )
    if "" in columns:
        return f"rename gives column {columns.index('') + 1} an empty name"
    repeated = _repeated(columns)
    if repeated:
        return f"rename gives {repeated}; rename them to different names"
    return None


def _repeated(names: list[str]) -> str:
    """Each name given to several columns, with their numbers: "'ash' (columns 5 and 14)"."""
    positions: dict[str, list[int]] = {}
    for number, name in enumerate(names, start=1):
        positions.setdefault(name, []).append(number)
    described = []
    for name, numbers in positions.items():
        if len(numbers) > 1:
            listed = ", ".join(map(str, numbers[:-1])) + f" and {numbers[-1]}"
            described.append(f"{name!r} (columns {listed})")
    return ", ".join(described)


def _spelled(encoding: str) -> str:
    """The encoding as people write it in messages: UTF-8, else as the spec gives it."""
    return "UTF-8" if codecs.lookup(encoding).name == "utf-8" else encoding


def _lines(unit: SourceFile, stack: contextlib.ExitStack) -> _Lines:
    """The unit's lines without comment lines, and without the skipped lines at the
    top of the file when the unit begins it."""
    source: CsvSource = unit.source  # type: ignore[assignment]
    handle = stack.enter_context(open_text(unit, source.encoding, newline=""))
    at_top = unit.span is None or unit.span.start == 0
    skip = source.skip_lines if at_top else 0
    return _Lines(handle, skip, source.comment, unit.first_line)


def _data_rows(
    unit: SourceFile, stack: contextlib.ExitStack
) -> tuple[list[str], Iterator[tuple[int, Row]]]:
    """The file's columns, and the data rows of the unit's part of the file.

    A part that does not begin the file starts at a row boundary after the header
    (see ``row_starts``), so its rows are parsed on their own; the columns still come
    from the top of the file. Raises ``_HeaderProblem``.
    """
    source: CsvSource = unit.source  # type: ignore[assignment]
    if unit.span is None:
        table = _table(unit, _lines(unit, stack))
        return table.columns, table.rows
    with contextlib.ExitStack() as top:
        columns = _table(unit, _lines(replace(unit, span=None), top)).columns
    if unit.span.start == 0:  # the header, then rows; pandas' index was seen in the file
        return columns, _table(unit, _lines(unit, stack), peek=False).rows
    return columns, _rows(_lines(unit, stack), source)


def read_csv(unit: SourceFile) -> Iterator[dict[str, Any]]:
    """Records of one CSV file: column -> cell text, or None for a missing value.

    ``UnreadableFile`` when the file's columns cannot be known.
    """
    source: CsvSource = unit.source  # type: ignore[assignment]
    missing = frozenset(source.na_values)
    with contextlib.ExitStack() as stack:
        columns, rows = _data_rows(unit, stack)
        yield from _records(unit, columns, rows, missing)


def _records(
    unit: SourceFile,
    columns: list[str],
    rows: Iterator[tuple[int, Row]],
    missing: frozenset[str],
) -> Iterator[dict[str, Any]]:
    source: CsvSource = unit.source  # type: ignore[assignment]
    for line, row in rows:
        origin = f"{unit.display}:{line}"
        if isinstance(row, str):
            yield quarantined(origin, row, "")
            continue
        raw = source.delimiter.join(row)
        if len(row) != len(columns):
            reason = f"expected {len(columns)} columns, got {len(row)}"
            yield quarantined(origin, reason, raw)
            continue
        printable = undecodable(raw, source.encoding)
        if printable is not None:
            yield quarantined(origin, f"row is not valid {_spelled(source.encoding)}", printable)
            continue
        values = {
            name: None if cell.strip() in missing else cell
            for name, cell in zip(columns, row, strict=True)
            if name != INDEX_COLUMN
        }
        yield source_record(unit, line, origin, values)


def row_starts(unit: SourceFile) -> Iterator[tuple[int, int]]:
    """``(byte offset, line number)`` of every row start after the header: where a part
    of the file may begin (``line_ranges.plan_ranges``).

    The CSV reader itself walks the file, so a quoted cell that spans lines is never
    cut; a file whose columns cannot be known has none (it is read whole).
    """
    source: CsvSource = unit.source  # type: ignore[assignment]
    with filesystems.open_for_read(unit.path) as handle:
        decoded = _DecodedLines(handle, source.encoding)
        lines = _Lines(decoded, source.skip_lines, source.comment)
        try:
            table = _table(unit, lines, peek=False)
        except _HeaderProblem:
            return
        yield decoded.offset, lines.number + 1  # the first row after the header
        for _ in table.rows:
            yield decoded.offset, lines.number + 1


class _DecodedLines:
    """A binary file's lines as text, counting the bytes read so far."""

    def __init__(self, handle: IO[bytes], encoding: str) -> None:
        self._lines = physical_lines(handle)
        self._decoder = codecs.getincrementaldecoder(reading_encoding(encoding))(
            errors="surrogateescape"
        )
        self.offset = 0

    def __iter__(self) -> _DecodedLines:
        return self

    def __next__(self) -> str:
        line, self.offset = next(self._lines)
        return self._decoder.decode(line)


def csv_columns(unit: SourceFile) -> list[str]:
    """The file's columns, checked against the width of its first rows.

    ConfigError, naming the file, when its columns cannot be known (an empty file, a
    header that repeats a name, see ``_columns_problem``), and when none of the first
    ``ROWS_CHECKED`` rows has as many cells as there are columns: every row would be
    quarantined, so the spec misreads the file. A header without rows is no error: the
    file holds no records.
    """
    source: CsvSource = unit.source  # type: ignore[assignment]
    where = f"sources.{unit.index}: "
    with contextlib.ExitStack() as stack:
        try:
            table = _table(unit, _lines(replace(unit, span=None), stack))
        except _HeaderProblem as problem:
            raise ConfigError(f"{where}{problem.origin}: {problem.reason}") from None
        checked = list(itertools.islice(table.rows, ROWS_CHECKED))
    if table.header is None and not checked:
        skipped = f" after the {source.skip_lines} skipped lines" if source.skip_lines else ""
        raise ConfigError(
            f"{where}{unit.display}: empty file: no rows{skipped}; remove the file or leave "
            "it out of the path"
        )
    widths = sorted({len(row) for _, row in checked if isinstance(row, list)})
    if widths and len(table.columns) not in widths:
        raise ConfigError(_width_mismatch(unit, table, widths))
    return table.fields


def csv_notes(unit: SourceFile) -> list[str]:
    """What the build does with the file that its user may not expect, and the fix.

    A file with a header row and nothing under it adds no records: not an error (a daily
    export with no rows that day is normal), but a user who meant it to hold data sees
    it named, and a build of only such files is refused for having no records. pandas'
    index column is read and left out.
    """
    with contextlib.ExitStack() as stack:
        try:
            table = _table(unit, _lines(replace(unit, span=None), stack))
        except _HeaderProblem:
            return []
        empty = table.header is not None and next(table.rows, None) is None
    notes = []
    if table.has_index:
        notes.append(
            "its first column has no name and holds 0, 1, 2, … (the index pandas writes): "
            "read as the row's index and left out of the fields; rename: {'': NAME} keeps "
            "it as a field"
        )
    if empty:
        notes.append(
            "a header row and no data rows, so it adds no records; add its rows, or remove "
            "it or leave it out of the path"
        )
    return notes


def _width_mismatch(unit: SourceFile, table: _Table, widths: list[int]) -> str:
    source: CsvSource = unit.source  # type: ignore[assignment]
    where = f"sources.{unit.index}: {unit.display}"
    found = " or ".join(str(width) for width in widths)
    count = len(table.columns)
    if table.header is None or source.names:
        return (
            f"{where}: names has {count} entries and the rows have {found} columns; "
            f"give one name per column"
        )
    line, cells = table.header
    text = source.delimiter.join(cells)
    if len(text) > _HEADER_PREVIEW_CHARS:
        text = text[:_HEADER_PREVIEW_CHARS] + "…"
    return (
        f"{where}: the header (line {line}: {text!r}) has {count} columns and the rows "
        f"have {found}. If the file has no header row, use header: none with names "
        f"({widths[-1]} of them), and skip_lines: {line} if line {line} is not data either; "
        "if the header row comes later, set skip_lines to the number of lines above it"
    )


def check_csv_options(index: int, source: CsvSource) -> None:
    """ConfigError for options no file could be read with."""
    check_encoding(index, source.encoding)
    if len(source.delimiter) != 1:
        raise ConfigError(
            f"sources.{index}.delimiter: must be a single character, got {source.delimiter!r}"
        )
    names = source.names or []
    if "" in names:
        raise ConfigError(f"sources.{index}.names: name {names.index('') + 1} is empty")
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ConfigError(f"sources.{index}.names: duplicate names: {', '.join(duplicates)}")
