"""Categories spelled several ways, and classes too small to learn: named after a build,
with their counts, as warnings or (``quality.category_variants: refuse``) a refusal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from research.data.category_checks import category_findings, spelling_key, variant_groups
from tests.support.cli import slipway
from tests.support.raw_data import write_spec


def test_spellings_that_differ_only_in_case_or_spacing_are_grouped_most_records_first() -> None:
    assert spelling_key("  Class  One ") == spelling_key("CLASS one") == "class one"
    counts = {"Red": 40, "red": 2, "RED ": 1, "Blue": 9, "blue": 9, "Green": 5, "green-ish": 1}
    assert variant_groups(counts) == [
        [("Red", 40), ("red", 2), ("RED ", 1)],
        [("Blue", 9), ("blue", 9)],
    ]


def test_findings_cover_every_split_and_only_labels_are_judged_for_size() -> None:
    statistics = {
        "train": {"features": {"label": {"frequencies": {"cat": 30, "Cat": 1, "dog": 3}},
                               "colour": {"frequencies": {"red": 1}}}},
        "test": {"features": {"label": {"frequencies": {"cat": 8, "dog": 1, "CAT": 1}}}},
    }  # fmt: skip
    variants, rare = category_findings(statistics, ["label", "colour"], ["label"], 5)
    assert variants == [
        "label: 'cat' (38), 'CAT' (1), 'Cat' (1) differ only in case or spacing, and each "
        "spelling is a category of its own; write each category one way in the sources, "
        "or set quality.category_variants: merge"
    ]
    assert rare == [
        "label: class(es) 'CAT' (1), 'Cat' (1), 'dog' (4) have fewer than 5 records "
        "(quality.min_class_records): too few to learn or to measure"
    ]
    assert category_findings(statistics, ["colour"], [], 5) == ([], [])


@pytest.mark.parametrize("mode", ["warn", "refuse"])
def test_a_build_warns_by_default_and_refuses_when_asked(
    tmp_path: Path, mode: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [f"{i},{i % 7},{'Class_1' if i % 2 else 'class_2'}" for i in range(60)]
    rows += ["60,1,CLASS_1", "61,2,class_1 ", "62,3,Class_2"]
    (tmp_path / "t.csv").write_text("id,x,label\n" + "\n".join(rows) + "\n")
    spec = write_spec(
        tmp_path / "t.yaml",
        {
            "name": "t",
            "sources": [{"type": "csv", "path": "t.csv"}],
            "labels": ["label"],
            "split": {"ratios": {"train": 0.8, "test": 0.2}, "seed": "s"},
            "quality": {"category_variants": mode, "min_class_records": 2},
        },
    )
    capsys.readouterr()
    code = slipway("data", "build", str(spec), "--output", str(tmp_path / "out"))
    screen = " ".join(capsys.readouterr().err.split())
    variants = (
        "label: 'Class_1' (30), 'CLASS_1' (1), 'class_1' (1); 'class_2' (30), 'Class_2' (1) "
        "differ only in case or spacing"
    )
    assert variants in screen
    if mode == "refuse":
        assert code == 3 and not (tmp_path / "out").exists()
        assert "(quality.category_variants: refuse)" in screen
        return
    assert code == 0
    assert "class(es) 'CLASS_1' (1), 'Class_2' (1), 'class_1' (1) have fewer than 2" in screen
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert len(report["warnings"]) == 2 and report["warnings"][0].startswith(variants)
    assert report["quality"]["passed"] is True


def test_merge_makes_every_spelling_the_most_common_one_before_dedup(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [f"{i},{i % 7},{'Class_1' if i % 2 else 'class_2'},{'red' if i % 3 else 'Blue'}"
            for i in range(60)]  # fmt: skip
    rows += ["60,1,CLASS_1,red", "61,2,class_1 ,RED", "62,3,Class_2,blue"]
    rows += ["1,1,class_1,Red"]  # row 1 again, spelled otherwise: a duplicate once merged
    (tmp_path / "t.csv").write_text("id,x,label,colour\n" + "\n".join(rows) + "\n")
    spec = write_spec(
        tmp_path / "t.yaml",
        {
            "name": "t",
            "sources": [{"type": "csv", "path": "t.csv"}],
            "schema": {"colour": {"type": "categorical"}},
            "labels": ["label"],
            "split": {"ratios": {"train": 0.8, "test": 0.2}, "seed": "s"},
            "quality": {"category_variants": "merge"},
        },
    )
    capsys.readouterr()

    code = slipway("data", "build", str(spec), "--output", str(tmp_path / "out"))

    screen = " ".join(capsys.readouterr().err.split())
    assert code == 0
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["features"]["label"]["vocabulary"] == ["Class_1", "class_2"]
    assert manifest["features"]["colour"]["vocabulary"] == ["Blue", "red"]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["merged_categories"] == [
        "colour: 'blue' (1) merged into 'Blue' (quality.category_variants: merge)",
        "colour: 'RED' (1), 'Red' (1) merged into 'red' (quality.category_variants: merge)",
        "label: 'CLASS_1' (1), 'class_1' (1), 'class_1 ' (1) merged into 'Class_1' "
        "(quality.category_variants: merge)",
        "label: 'Class_2' (1) merged into 'class_2' (quality.category_variants: merge)",
    ]
    assert "note: colour: 'RED' (1), 'Red' (1) merged into 'red'" in screen
    assert report["warnings"] == []  # nothing left spelled two ways
    splits = manifest["splits"]
    assert sum(split["num_records"] for split in splits.values()) == 63  # the duplicate merged
