"""The two logs of records that never reach the shards, so every input can be accounted for.

- ``quarantine.jsonl``: inputs the build could not use — unreadable, malformed, or not
  fitting the schema. Each line is ``{"origin", "stage", "reason", "raw"}``.
- ``dropped.jsonl``: records that were read and typed, then removed on purpose. Each line
  is ``{"origin", "stage", "rule", "reason", "raw"}`` where ``rule`` is the report's
  counter that counted it; a duplicate adds ``kept`` (the origin of the record kept in
  its place, which survived that rule) and ``similarity`` (1.0 for exact duplicates, the
  MinHash estimate of the Jaccard similarity for near ones).

Both logs are written in input order (file, then line: origins compare with their
numbers as numbers), whatever order the runner's bundles ran in, so two builds of the
same inputs write the same bytes, and each holds exactly as many lines as
``report.json`` counts quarantined, or dropped and merged. A log may be as long as the
input, so ``WriteRejects`` sorts it externally (research.data.sorted_runs): no worker
holds more than a run of entries.

Quarantined text is raw input, so it would carry the personal data that cleaning masks
in the dataset; with ``clean.pii`` on, ``pii_mask`` masks it the way cleaning masks a
text field. A record refused by the schema (stage ``conform``) is logged cell by cell, as
read: the cells of the PII fields are masked as cleaning masks them, and the cells of
other fields are kept as they were read when they are values of their field (a number
in a numeric field); a cell that is not (the value that got the record refused, say), or
that no field takes, is masked too, as is every cell when the schema is not known. An
entry whose input cannot be split into fields (an unparsable line, a file) is masked
whole, since it may hold anything; the reason, which quotes the input, is masked whole
as well. (Dropped records were typed, and cleaning masked their PII fields already.)
"""

from __future__ import annotations

import ast
import json
import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apache_beam as beam

from contracts.dataset_manifest import DatasetError
from research.data import filesystems
from research.data.clean import compile_rules, normalize_text
from research.data.pii import mask_pii
from research.data.sorted_runs import Item, WriteSortedRuns, merge_runs
from research.data.spec import CleanSpec, FieldSchema

QUARANTINE_FILE = "quarantine.jsonl"
DROPPED_FILE = "dropped.jsonl"

Entry = dict[str, Any]
Mask = Callable[[str], str]

_DIGITS = re.compile(r"(\d+)")
_MASKED_FIELDS = ("reason", "raw")  # where an entry quotes its input
# research.data.schema.STAGE: the stage that logs a refused record's cells. (The schema
# module reads sources, whose quality checks read these logs: it is imported late.)
CONFORM_STAGE = "conform"


# --------------------------------------------------------------------------- order


def _text_key(text: str) -> bytes:
    """Bytes that compare as ``text`` does, and end unambiguously.

    UTF-8 keeps the order of code points (lone surrogates included); NUL is escaped so
    that the terminator sorts below every character.
    """
    return text.encode("utf-8", "surrogatepass").replace(b"\x00", b"\x00\xff") + b"\x00\x01"


def _number_key(digits: str) -> bytes:
    """Bytes that compare as the number ``digits`` spells (any Unicode decimal digits)."""
    if not digits.isascii():
        digits = "".join(str(unicodedata.decimal(digit)) for digit in digits)
    digits = digits.lstrip("0") or "0"
    return len(digits).to_bytes(4, "big") + digits.encode("ascii")


def order_key(entry: Entry) -> bytes:
    """The sort key of an entry: its origin with numbers compared as numbers
    (``a.csv:9`` before ``a.csv:10``), then its stage, rule and reason."""
    key = bytearray()
    for index, part in enumerate(_DIGITS.split(entry["origin"])):
        # Text and digit runs alternate; a shorter origin (0x00) sorts before a longer one.
        key += b"\x01" + _number_key(part) if index % 2 else _text_key(part)
    key += b"\x00"
    for text in (entry["stage"], entry.get("rule", ""), entry["reason"]):
        key += _text_key(text)
    return bytes(key)


def entry_line(entry: Entry) -> bytes:
    """One JSON line; text JSON allowed in (a lone surrogate) is written as an escape."""
    try:
        return (json.dumps(entry, ensure_ascii=False) + "\n").encode("utf-8")
    except UnicodeEncodeError:
        return (json.dumps(entry) + "\n").encode("ascii")


def _log_item(entry: Entry, mask: Mask | None) -> Item:
    if isinstance(mask, PiiMask):
        entry = mask.entry(entry)
    elif mask is not None:
        entry = {
            name: mask(value) if name in _MASKED_FIELDS and isinstance(value, str) else value
            for name, value in entry.items()
        }
    return order_key(entry), entry_line(entry)


# --------------------------------------------------------------------------- masking


@dataclass(frozen=True)
class PiiMask:
    """Personal data masked in free text as cleaning masks a text field
    (research.data.clean): the same normalisation, then the same kinds and regions.

    Text with nothing to mask is kept exactly as read, so a quarantined row shows its
    input unchanged wherever that is safe. ``pii_columns`` are the source columns of the
    PII fields and ``typed_columns`` the source column and schema of every other field;
    ``pii_columns`` None means the schema is not known, and every cell is masked.
    """

    normalization: str | None
    collapse_whitespace: bool
    kinds: tuple[str, ...]
    phone_regions: tuple[str, ...]
    pii_columns: frozenset[str] | None = None
    typed_columns: tuple[tuple[str, FieldSchema], ...] = ()

    def __call__(self, text: str) -> str:
        normalized = normalize_text(text, self.normalization, self.collapse_whitespace)
        masked, counts = mask_pii(normalized, self.kinds, self.phone_regions)
        return masked if any(counts.values()) else text

    def entry(self, entry: Entry) -> Entry:
        """The entry with its reason and raw input masked (see the module docstring)."""
        masked = dict(entry)
        if isinstance(entry.get("reason"), str):
            masked["reason"] = self(entry["reason"])
        raw = entry.get("raw")
        if isinstance(raw, str):
            cells = _record_cells(raw) if entry.get("stage") == CONFORM_STAGE else None
            masked["raw"] = self(raw) if cells is None else self._record(*cells)
        return masked

    def _record(self, cells: dict[str, Any], rest: str) -> str:
        """A record's cells, masked where they must be, in the form they were logged in."""
        shown = str({name: self._cell(name, value) for name, value in cells.items()})
        if not rest:
            return shown
        return shown[:-1] + self(rest.removesuffix("…")) + "…"  # NFKC would spell it "..."

    def _cell(self, column: str, value: Any) -> Any:
        if not self._masks(column, value):
            return value
        if isinstance(value, str):
            return self(value)
        if isinstance(value, list):
            return [self._cell(column, item) for item in value]
        if isinstance(value, dict):
            return {key: self._cell(column, item) for key, item in value.items()}
        return value

    def _masks(self, column: str, value: Any) -> bool:
        if self.pii_columns is None or column in self.pii_columns:
            return True
        from research.data.schema import ConformError, conform_value

        for name, field in self.typed_columns:
            if name == column:
                try:
                    conform_value(column, value, field)
                except ConformError:
                    return True  # not a value of its field: text of any kind
                return False
        return True  # a column no field takes


def _record_cells(raw: str) -> tuple[dict[str, Any], str] | None:
    """The cells of a record logged as ``str(dict)``, and the text of a cut-off last cell.

    A record longer than the preview is cut (records.RAW_PREVIEW_CHARS, then "…"): its
    whole cells are read, and what follows the last of them is returned as text. None
    when ``raw`` is not a logged record.
    """
    cells = _as_record(raw)
    if cells is not None:
        return cells, ""
    if not raw.endswith("…"):
        return None
    cut = len(raw)
    for _ in range(_MAX_CUTS):
        cut = max(raw.rfind(", '", 0, cut), raw.rfind(', "', 0, cut))
        if cut <= 0:
            return None
        cells = _as_record(raw[:cut] + "}")
        if cells is not None:
            return cells, raw[cut:]
    return None


_MAX_CUTS = 64  # places tried for the end of the last whole cell of a cut-off record


def _as_record(text: str) -> dict[str, Any] | None:
    if not text.startswith("{"):
        return None
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    # Only a text that prints back exactly is known to be a record's cells.
    if not isinstance(value, dict) or str(value) != text:
        return None
    if not all(isinstance(key, str) for key in value):
        return None
    return value


def pii_mask(
    clean: CleanSpec,
    schema: Mapping[str, FieldSchema] | None = None,
    columns: Mapping[str, str] | None = None,
) -> PiiMask | None:
    """The masking that ``clean`` applies to text fields, or None when it masks nothing.

    With the ``schema`` (and ``columns``, ``ResolvedSchema.columns``: the source column
    of each renamed field) the cells of a record refused by the schema are masked by
    field; without it every cell is masked.
    """
    if not clean.pii.enabled or not clean.pii.kinds:
        return None
    form = clean.unicode_normalization
    pii_columns: frozenset[str] | None = None
    typed_columns: tuple[tuple[str, FieldSchema], ...] = ()
    if schema is not None:
        source = dict(columns or {})
        pii_fields = compile_rules(clean, schema, []).pii_fields
        pii_columns = frozenset(source.get(name, name) for name in pii_fields)
        typed_columns = tuple(
            (source.get(name, name), field)
            for name, field in schema.items()
            if name not in pii_fields
        )
    return PiiMask(
        normalization=None if form == "none" else form,
        collapse_whitespace=clean.collapse_whitespace,
        kinds=tuple(clean.pii.kinds),
        phone_regions=tuple(clean.pii.phone_regions),
        pii_columns=pii_columns,
        typed_columns=typed_columns,
    )


# --------------------------------------------------------------------------- writing


class _EncodeEntry:
    """An entry -> the one group of its log and its sorted-run item (masked first)."""

    def __init__(self, mask: Mask | None) -> None:
        self._mask = mask

    def __call__(self, entry: Entry) -> tuple[None, Item]:
        return None, _log_item(entry, self._mask)


class WriteRejects(beam.PTransform):
    """Log entries -> the log file at ``path``; emits ``path`` once it is written.

    Each bundle writes its entries in sorted runs to ``temp_dir`` (which every worker
    can read and the caller removes afterwards); one task merges the runs into ``path``,
    streaming, through ``filesystems.atomic_output``. Only run paths are gathered in
    that task, a handful per bundle. No entries at all still write an empty log.
    ``mask``, e.g. ``pii_mask(spec.clean)``, is applied to each entry's reason and raw
    text before anything is written.
    """

    def __init__(self, path: str, temp_dir: str, mask: Mask | None = None) -> None:
        super().__init__()
        self._path = path
        self._temp_dir = temp_dir
        self._mask = mask

    def expand(self, entries: beam.PCollection) -> beam.PCollection:
        runs = WriteSortedRuns(_EncodeEntry(self._mask), self._temp_dir, "rejects")
        return (
            entries
            | "SortedRuns" >> beam.ParDo(runs)
            | "RunPaths" >> beam.Values()
            | "AllRuns" >> beam.combiners.ToList()
            | "Merge" >> beam.Map(_merge_log, self._path, self._temp_dir)
        )


def _merge_log(runs: list[str], path: str, temp_dir: str) -> str:
    with filesystems.atomic_output(path, temp_dir) as out:
        for _, line in merge_runs(sorted(runs), temp_dir):
            out.write(line)
    return path


def write_entries(entries: Iterable[Entry], path: str) -> str:
    """Write a few entries (held in memory) as a log, in the order ``WriteRejects``
    writes; returns ``path``. For tests and tools: a build uses ``WriteRejects``."""
    items = sorted(_log_item(entry, None) for entry in entries)
    filesystems.write_bytes(path, b"".join(line for _, line in items))
    return path


# --------------------------------------------------------------------------- reading


def read_entries(path: str | Path) -> list[Entry]:
    """The entries of a log; DatasetError naming the file and line when it cannot be read."""
    try:
        text = filesystems.read_bytes(str(path)).decode("utf-8")
    except FileNotFoundError:
        raise DatasetError(f"{path}: missing") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{path}: unreadable: {exc}") from None
    # Lines end with "\n" only: JSON keeps U+2028 and the like, which splitlines would cut.
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    entries = []
    for number, line in enumerate(lines, start=1):
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{path}:{number}: not a JSON line: {exc.msg}") from None
        if not isinstance(entry, dict) or not isinstance(entry.get("origin"), str):
            raise DatasetError(f"{path}:{number}: expected an object with an 'origin'")
        entries.append(entry)
    return entries
