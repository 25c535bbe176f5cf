"""quarantine.jsonl and dropped.jsonl: order, external sort, masking, reading back."""

from __future__ import annotations

import ast
import json
import random
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import apache_beam as beam
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from research.data import sorted_runs
from research.data.records import quarantine_entry
from research.data.rejects import (
    CONFORM_STAGE,
    PiiMask,
    WriteRejects,
    entry_line,
    order_key,
    pii_mask,
    read_entries,
    write_entries,
)
from research.data.runners import pipeline_options
from research.data.schema import STAGE as SCHEMA_STAGE
from research.data.sorted_runs import WriteSortedRuns, merge_runs, read_run, write_run
from research.data.spec import CleanSpec, FieldSchema
from tests.support.raw_data import tabular_rows, write_tabular_dataset_inputs

ORIGINS = [
    "a.csv:10", "a.csv:9", "a.csv:009", "a.csv", "a.csv:", "b.csv:1", "a.csv:9:1", "a.csv:9a",
    "a\x00.csv:1", "a.csv:٣", "a.csv:4", "A.csv:1", "", "7", "07", "data/p-2.csv:3",
    "data/p-10.csv:1", "é.csv:2", "a.csv:18446744073709551616",
]  # fmt: skip


def natural_order(entry: dict[str, Any]) -> tuple[Any, ...]:
    """The order the logs promise, as Python compares it: the reference for ``order_key``."""
    parts = re.split(r"(\d+)", entry["origin"])
    natural = [int(part) if index % 2 else part for index, part in enumerate(parts)]
    return natural, entry["stage"], entry.get("rule", ""), entry["reason"]


def entries(count: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [
        {
            "origin": rng.choice(ORIGINS) + rng.choice(["", str(rng.randrange(200))]),
            "stage": rng.choice(["read", "conform", "clean", "dedup"]),
            **({"rule": rng.choice(["clean.dropped.required.x", "dedup.exact.merged"])}
               if rng.random() < 0.5 else {}),
            "reason": rng.choice(["bad", "worse", "bad\x00", "ba"]),
            "raw": str(index),
        }
        for index in range(count)
    ]  # fmt: skip


# --------------------------------------------------------------------------- order


def test_order_key_sorts_as_python_compares_natural_origins() -> None:
    sample = entries(3000, seed=1)
    sample += [{**entry, "origin": f"a\udc80{entry['origin']}"} for entry in sample[:50]]
    by_key = sorted(sample, key=order_key)
    assert [natural_order(e) for e in by_key] == sorted(natural_order(e) for e in sample)


def test_entries_come_in_input_order_with_ties_broken_by_their_lines(tmp_path: Path) -> None:
    sample = [
        {"origin": "t.csv:10", "stage": "read", "reason": "r", "raw": "b"},
        {"origin": "t.csv:9", "stage": "read", "reason": "r", "raw": "z"},
        {"origin": "t.csv:10", "stage": "read", "reason": "r", "raw": "a"},
    ]
    path = write_entries(sample, str(tmp_path / "log.jsonl"))
    assert [(e["origin"], e["raw"]) for e in read_entries(Path(path))] == [
        ("t.csv:9", "z"), ("t.csv:10", "a"), ("t.csv:10", "b"),
    ]  # fmt: skip


def test_any_text_is_written_as_a_readable_line(tmp_path: Path) -> None:
    sample = [
        {"origin": "j.jsonl:1", "stage": "conform", "reason": "x", "raw": "lone \udc80 half"},
        {"origin": "j.jsonl:2", "stage": "conform", "reason": "x", "raw": "line\u2028sep\x85"},
    ]
    path = write_entries(sample, str(tmp_path / "log.jsonl"))
    assert read_entries(Path(path)) == sample
    assert entry_line(sample[1]).decode("utf-8").count("\n") == 1


# --------------------------------------------------------------------------- sorted runs


def test_merging_runs_gives_one_order_whatever_the_fan_in(tmp_path: Path) -> None:
    rng = random.Random(3)
    items = [(rng.randbytes(rng.randrange(3)), rng.randbytes(2)) for _ in range(500)]
    paths = []
    for index in range(0, len(items), 37):
        paths.append(str(tmp_path / f"{index}.run"))
        write_run(paths[-1], sorted(items[index : index + 37]))
    assert list(read_run(paths[0])) == sorted(items[:37])
    for fan_in in (2, 3, 100):
        assert list(merge_runs(paths, str(tmp_path / "merges"), fan_in)) == sorted(items)


def _by_parity(value: int) -> tuple[int, sorted_runs.Item]:
    return value % 2, (value.to_bytes(4, "big"), b"")


def test_each_bundle_writes_sorted_runs_per_group(tmp_path: Path) -> None:
    values = random.Random(4).sample(range(10_000), 1000)
    pipeline = beam.Pipeline(options=pipeline_options([]))
    runs = (
        pipeline
        | beam.Create(values)
        | beam.ParDo(WriteSortedRuns(_by_parity, str(tmp_path), "test", max_items=64))
    )
    _ = runs | beam.combiners.ToList() | beam.Map(_save_runs, str(tmp_path / "runs.json"))
    pipeline.run().wait_until_finish()
    by_group: dict[int, list[str]] = {}
    for group, path in json.loads((tmp_path / "runs.json").read_text()):
        by_group.setdefault(group, []).append(path)
        keys = [key for key, _ in read_run(path)]
        assert keys == sorted(keys) and len(keys) <= 64
    assert len(by_group[0]) > 1
    for group, paths in by_group.items():
        merged = [int.from_bytes(key, "big") for key, _ in merge_runs(paths, str(tmp_path))]
        assert merged == sorted(v for v in values if v % 2 == group)


def _save_runs(runs: list[tuple[int, str]], path: str) -> None:
    Path(path).write_text(json.dumps(runs))


# --------------------------------------------------------------------------- WriteRejects


def write_with_beam(
    sample: Iterable[dict[str, Any]], path: Path, argv: list[str], mask: PiiMask | None = None
) -> bytes:
    pipeline = beam.Pipeline(options=pipeline_options(argv))
    _ = (
        pipeline
        | beam.Create(list(sample))
        | WriteRejects(str(path), str(path.parent / "tmp"), mask)
    )
    pipeline.run().wait_until_finish()
    return path.read_bytes()


def test_a_log_written_by_beam_is_the_log_of_its_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sample = entries(2000, seed=2)
    monkeypatch.setattr(sorted_runs, "RUN_ITEMS", 100)  # many runs, merged in stages
    monkeypatch.setattr(sorted_runs, "MAX_FAN_IN", 4)
    written = write_with_beam(random.Random(5).sample(sample, len(sample)), tmp_path / "q", [])
    assert written == Path(write_entries(sample, str(tmp_path / "reference"))).read_bytes()
    assert written.count(b"\n") == len(sample)


def test_no_entries_still_write_an_empty_log(tmp_path: Path) -> None:
    assert write_with_beam([], tmp_path / "quarantine.jsonl", []) == b""


@pytest.mark.process
def test_the_dask_runner_writes_the_same_logs(tmp_path: Path) -> None:
    sample = entries(1500, seed=6)
    pipeline = beam.Pipeline(options=pipeline_options(["--runner", "dask", "--workers", "2"]))
    for name, logged in (("full", sample), ("empty", [])):
        _ = (
            pipeline
            | f"Create{name}" >> beam.Create(logged)
            | f"Write{name}" >> WriteRejects(str(tmp_path / f"{name}.jsonl"), str(tmp_path / "tmp"))
        )
    pipeline.run().wait_until_finish()
    expected = Path(write_entries(sample, str(tmp_path / "reference"))).read_bytes()
    assert (tmp_path / "full.jsonl").read_bytes() == expected
    assert (tmp_path / "empty.jsonl").read_bytes() == b""


# --------------------------------------------------------------------------- masking

ROW = "7,call +44 20 7946 0958 or ann.lee@example.com,ﬁle 555-0134"


def test_the_mask_is_the_one_cleaning_applies_to_text_fields() -> None:
    mask = pii_mask(CleanSpec())
    assert mask is not None
    assert mask(ROW) == "7,call [PHONE] or [EMAIL],file 555-0134"  # NFKC folds "ﬁ"
    assert mask("7,nothing personal ﬁ") == "7,nothing personal ﬁ"  # left as read
    only_emails = pii_mask(CleanSpec(collapse_whitespace=False, pii={"kinds": ["email"]}))
    assert only_emails is not None and only_emails(ROW).count("[") == 1
    assert pii_mask(CleanSpec(pii={"enabled": False})) is None
    assert pii_mask(CleanSpec(pii={"kinds": []})) is None


def test_beam_masks_the_reason_and_raw_text_of_each_entry(tmp_path: Path) -> None:
    entry = {"origin": "t.csv:3", "stage": "read", "reason": f"got '{ROW}'", "raw": ROW}
    written = write_with_beam([entry], tmp_path / "q.jsonl", [], pii_mask(CleanSpec()))
    (line,) = read_entries(tmp_path / "q.jsonl")
    assert line == {
        "origin": "t.csv:3",
        "stage": "read",
        "reason": "got '7,call [PHONE] or [EMAIL],file 555-0134'",
        "raw": "7,call [PHONE] or [EMAIL],file 555-0134",
    }
    assert b"example.com" not in written


def test_a_quarantined_csv_row_is_masked_like_the_dataset(tmp_path: Path) -> None:
    from research.data.pipeline import build_dataset
    from research.data.spec import load_spec

    spec = write_tabular_dataset_inputs(tmp_path / "raw", "table", tabular_rows(150, seed=9))
    table = tmp_path / "raw" / "table.csv"
    lines = table.read_text(encoding="utf-8").splitlines()
    lines.insert(5, "900,1.5,red,call +44 20 7946 0958,or mail ann.lee@example.com")  # 5 cells
    lines.insert(9, "901,bob@example.org,blue,my phone is (415) 555-0134")  # x not a number
    table.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = build_dataset(load_spec(spec), tmp_path / "dataset")
    log = tmp_path / "dataset" / "quarantine.jsonl"
    quarantined = read_entries(log)
    assert [(e["origin"], e["stage"]) for e in quarantined] == [
        ("table.csv:6", "read"),
        ("table.csv:10", "conform"),
    ]
    assert quarantined[0]["raw"] == "900,1.5,red,call [PHONE],or mail [EMAIL]"
    assert "[EMAIL]" in quarantined[1]["reason"] and "[PHONE]" in quarantined[1]["raw"]
    text = log.read_text(encoding="utf-8")
    assert not any(secret in text for secret in ("7946", "ann.lee", "bob@", "555-0134"))
    assert result.report["records_quarantined"] == 2


# --------------------------------------------------------------------------- masking by field

SCHEMA = {
    "id": FieldSchema(type="numeric", dtype="int64"),
    "f6": FieldSchema(type="numeric"),
    "colour": FieldSchema(type="categorical"),
    "note": FieldSchema(type="text"),
    "code": FieldSchema(type="text"),
}
TEXT = "Accuracy moved from 0.2146 to 0.1684, call 020 7946 0958 or ann.lee@example.com"
MASKED_TEXT = "Accuracy moved from 0.2146 to 0.1684, call [PHONE] or [EMAIL]"


def refused(record: dict[str, Any], reason: str = "field 'id': expected ...") -> dict[str, Any]:
    """A quarantine entry as the schema stage writes it (records.quarantine_entry)."""
    return quarantine_entry("t.csv:4", SCHEMA_STAGE, reason, record)


def test_the_conform_stage_is_the_one_that_logs_cells() -> None:
    assert CONFORM_STAGE == SCHEMA_STAGE


def test_a_refused_record_is_masked_in_its_pii_fields_only() -> None:
    mask = pii_mask(CleanSpec(pii={"fields": ["note"]}), SCHEMA, {"note": "Note"})
    assert mask is not None
    record = {
        "id": "12",
        "f6": "0.1684",
        "colour": "020 7946 0958",  # a category, kept as read
        "Note": TEXT,  # the source column of field "note"
        "code": "ann.lee@example.com",  # a text field the spec does not mask
    }
    entry = mask.entry(refused(record))
    assert entry["raw"] == str(record | {"Note": MASKED_TEXT})


def test_a_cell_that_does_not_fit_its_field_or_no_field_is_masked() -> None:
    mask = pii_mask(CleanSpec(), SCHEMA)
    assert mask is not None
    record = {"id": "bob@example.org", "f6": "0.1684", "note": TEXT, "extra": "+44 20 7946 0958"}
    reason = "field 'id': expected numeric int64, got 'bob@example.org'"
    entry = mask.entry(refused(record, reason))
    assert entry["reason"] == "field 'id': expected numeric int64, got [EMAIL]'"  # ' is atext
    assert entry["raw"] == str(
        {"id": "[EMAIL]", "f6": "0.1684", "note": MASKED_TEXT, "extra": "[PHONE]"}
    )


def test_without_the_schema_every_cell_is_masked_on_its_own() -> None:
    mask = pii_mask(CleanSpec())
    assert mask is not None
    record = {"f1": "0.2146", "f6": "0.1684", "f7": "20 000", "text": TEXT, "n": None}
    entry = mask.entry(refused(record))
    assert entry["raw"] == str(record | {"text": MASKED_TEXT})


def test_a_cut_off_record_is_masked_cell_by_cell_up_to_the_cut() -> None:
    mask = pii_mask(CleanSpec(), SCHEMA)
    assert mask is not None
    record = {"f6": "0.1684", "id": "7", "note": TEXT + " " + "word " * 300}
    raw = refused(record)["raw"]
    assert raw.endswith("…")
    masked = mask.entry(refused(record))["raw"]
    assert masked.startswith("{'f6': '0.1684', 'id': '7', 'note': '" + MASKED_TEXT)
    assert masked.endswith("…") and "example.com" not in masked


def test_an_unparsable_line_is_masked_whole_without_touching_decimals() -> None:
    mask = pii_mask(CleanSpec(), SCHEMA)
    assert mask is not None
    line = "900,0.2146,0.1684,call 020 7946 0958,1.5"
    entry = mask.entry(quarantine_entry("t.csv:6", "read", "expected 4 columns, got 5", line))
    assert entry["raw"] == "900,0.2146,0.1684,call [PHONE],1.5"
    # A conform entry whose raw text is not a record is masked whole too.
    assert mask.entry(refused({}) | {"raw": "{not a record 0.1684"})["raw"] == (
        "{not a record 0.1684"
    )


SECRETS = (TEXT, "020 7946 0958", "bob@example.org")


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["id", "f6", "colour", "note", "other"]),
        st.one_of(
            st.none(),
            st.floats(allow_nan=False, allow_infinity=False).map(repr),
            st.floats(allow_nan=False, allow_infinity=False),
            st.integers(),
            st.sampled_from([*SECRETS, "0.123456789", "1,234.56"]),
        ),
    )
)
def test_masked_records_read_back_as_records_with_numeric_cells_as_read(
    record: dict[str, Any],
) -> None:
    mask = pii_mask(CleanSpec(), SCHEMA)
    assert mask is not None
    masked = ast.literal_eval(mask.entry(refused(record))["raw"])
    assert list(masked) == list(record)
    for name, value in record.items():
        if name == "colour" or value not in SECRETS:
            assert masked[name] == value  # a category, or a number however it is checked
        else:
            assert "example" not in masked[name] and "7946" not in masked[name]


def test_beam_masks_a_refused_record_by_field(tmp_path: Path) -> None:
    record = {"id": "3", "f6": "0.1684", "note": TEXT}
    mask = pii_mask(CleanSpec(), SCHEMA)
    write_with_beam([refused(record)], tmp_path / "q.jsonl", [], mask)
    (line,) = read_entries(tmp_path / "q.jsonl")
    assert line["raw"] == str(record | {"note": MASKED_TEXT})
