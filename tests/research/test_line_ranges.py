"""Large files read in parts: the same records, ranks and quarantine as a whole read.

Every file here is read whole and then in parts as small as one byte, so that a cut
lands next to every awkward thing a file can hold: quoted cells spanning lines,
comment and skipped lines, a header, Windows and old-Mac line ends, a byte-order
mark, bytes that are not valid in the encoding, blank lines and a last line without
its line end.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from research.data import line_ranges
from research.data.line_ranges import LineRange, open_range, plan_ranges, splittable_encoding
from research.data.pipeline import build_dataset
from research.data.sources import check_sources, file_parts, read_source_file
from research.data.spec import DatasetSpec
from tests.support.shards import shard_hashes
from tests.support.source_records import make_spec

CSV_WITH_EVERYTHING = (
    b"\xef\xbb\xbfexported 2024-01-01\r\n"
    b"id,note,score\r\n"
    b'1,"a note\r\nspanning ""two"" lines",0.5\r\n'
    b'# a comment line, 3 cells, "unbalanced\r\n'
    b"2,plain,1.5\r\n"
    b"\r\n"
    b'3,"x,y",n/a\r\n'
    b"4,bad \xff byte,2\r\n"
    b"5,too,many,cells\r\n"
    b'6,"an unterminated quote,3\r\n'
    b"7,after,4\r\n"
    b"8,last line without its end,5"
)

FILES: dict[str, tuple[dict[str, Any], bytes]] = {
    "csv_with_everything": (
        {"type": "csv", "skip_lines": 1, "comment": "#"},
        CSV_WITH_EVERYTHING,
    ),
    "csv_without_header": (
        {"type": "csv", "header": "none"},
        b'1,"two\nlines"\n2,b\n\n3,"c"\r4,d\n',
    ),
    "csv_with_pandas_index": (
        {"type": "csv"},
        b',id,note\n0,7,a\n1,8,"b\nc"\n2,9,d\n5,10,"e,f"\n',
    ),
    "jsonl": (
        {"type": "jsonl"},
        b'{"a": 1}\n\n{"a": 2}\r\n{"a": \n[1]\n{"a": "\xff"}\n{"a": 3}\r{"a": 4}',
    ),
    "text_lines": (
        {"type": "text", "mode": "line", "field": "text"},
        b"first\nsecond\r\nthird\rfourth\n\n\xe9t\xe9 in latin-1 is not utf-8\nlast",
    ),
    "text_latin1": (
        {"type": "text", "mode": "line", "field": "text", "encoding": "latin-1"},
        b"caf\xe9\nna\xefve\r\nr\xe9sum\xe9",
    ),
}


def _read_units(units: list[Any]) -> list[dict[str, Any]]:
    return [item for unit in units for item in read_source_file(unit)]


@pytest.mark.parametrize("name", sorted(FILES))
@pytest.mark.parametrize("range_bytes", [1, 7, 12])
def test_parts_read_exactly_what_the_whole_file_holds(
    tmp_path: Path, name: str, range_bytes: int
) -> None:
    options, content = FILES[name]
    path = tmp_path / "data.txt"
    path.write_bytes(content)
    (unit,) = check_sources(make_spec(tmp_path, {**options, "path": path.name}))

    parts = file_parts(unit, range_bytes)

    assert len(parts) > 1
    assert parts[0].span.start == 0 and parts[-1].span.stop == len(content)
    assert all(a.span.stop == b.span.start for a, b in zip(parts, parts[1:], strict=False))
    assert _read_units(parts) == _read_units([unit])


def test_a_csv_part_never_starts_inside_a_quoted_cell_or_the_header(tmp_path: Path) -> None:
    path = tmp_path / "data.csv"
    path.write_bytes(CSV_WITH_EVERYTHING)
    (unit,) = check_sources(
        make_spec(tmp_path, {"type": "csv", "path": path.name, "skip_lines": 1, "comment": "#"})
    )

    starts = [part.span.start for part in file_parts(unit, 1)]

    header_end = CSV_WITH_EVERYTHING.index(b"id,note,score\r\n") + len(b"id,note,score\r\n")
    assert starts[1] == header_end
    quoted = CSV_WITH_EVERYTHING.index(b'spanning ""two""')
    assert quoted not in starts
    assert all(CSV_WITH_EVERYTHING[start - 1 : start] in (b"\n", b"\r") for start in starts[1:])


def test_small_files_and_whole_file_sources_are_read_whole(tmp_path: Path) -> None:
    (tmp_path / "small.csv").write_text("a\n1\n2\n", encoding="utf-8")
    (tmp_path / "doc.txt").write_text("one\ntwo\nthree\n", encoding="utf-8")
    small = check_sources(make_spec(tmp_path, {"type": "csv", "path": "small.csv"}))[0]
    whole = check_sources(
        make_spec(tmp_path, {"type": "text", "mode": "file", "field": "text", "path": "doc.txt"})
    )[0]

    assert file_parts(small, 1 << 20) == [small]
    assert file_parts(whole, 1) == [whole]


def test_files_in_encodings_where_a_newline_byte_is_not_a_newline_are_read_whole(
    tmp_path: Path,
) -> None:
    (tmp_path / "wide.txt").write_bytes("one\ntwo\nthree\n".encode("utf-16"))
    spec = make_spec(
        tmp_path,
        {"type": "text", "mode": "line", "field": "t", "path": "wide.txt", "encoding": "utf-16"},
    )
    (unit,) = check_sources(spec)

    assert file_parts(unit, 1) == [unit]
    assert [
        splittable_encoding(e) for e in ("utf-8", "latin-1", "cp1252", "utf-16", "utf-32-le")
    ] == [
        True,
        True,
        True,
        False,
        False,
    ]


def test_plan_cuts_only_at_record_starts_and_covers_the_file() -> None:
    starts = [(10, 2), (25, 3), (26, 4), (90, 5)]

    assert plan_ranges(starts, 100, 20) == [
        LineRange(0, 25, 1),
        LineRange(25, 90, 3),
        LineRange(90, 100, 5),
    ]
    assert plan_ranges([], 100, 20) == [LineRange(0, 100, 1)]


def test_a_range_is_a_stream_of_its_bytes_only() -> None:
    handle = io.BytesIO(b"0123456789")

    assert open_range(handle, LineRange(3, 7, 1)).read() == b"3456"


def test_a_build_reading_in_parts_writes_the_same_shards(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = "".join(f"{i},{'note ' * (i % 5)}{i},{i % 3}\n" for i in range(400))
    (tmp_path / "table.csv").write_text("id,note,label\n" + rows, encoding="utf-8")
    (tmp_path / "lines.jsonl").write_text(
        "".join(
            f'{{"id": {1000 + i}, "note": "json {i}", "label": {i % 3}}}\n' for i in range(300)
        ),
        encoding="utf-8",
    )
    spec = DatasetSpec.model_validate(
        {
            "name": "parts",
            "base_dir": str(tmp_path),
            "sources": [
                {"type": "csv", "path": "table.csv"},
                {"type": "jsonl", "path": "lines.jsonl"},
            ],
            "labels": ["label"],
            "split": {"key": "id"},
            "output": {"num_shards": 2},
        }
    )
    whole = build_dataset(spec, tmp_path / "whole")
    monkeypatch.setattr(line_ranges, "RANGE_BYTES", 512)
    parts = build_dataset(spec, tmp_path / "parts")

    assert parts.report["records_written"] == whole.report["records_written"]
    assert sum(whole.report["records_written"].values()) == 700
    assert shard_hashes(tmp_path / "parts") == shard_hashes(tmp_path / "whole")
