"""CSV files as people have them: scikit-learn's files (a count line, no header), header
options, comments, missing-value markers, encodings, and files the spec misreads."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from contracts.yaml_config import ConfigError
from research.data.records import ORIGIN
from research.data.schema import resolve_schema
from research.data.sources import check_sources, source_columns, source_notes
from research.data.spec import DatasetSpec
from tests.support.source_records import make_spec, public, read


def sklearn_csv(name: str, directory: Path) -> Path:
    """One of the CSV files scikit-learn ships, copied into ``directory``."""
    import sklearn

    source = Path(sklearn.__file__).parent / "datasets" / "data" / name
    return Path(shutil.copy(source, directory / name))


def breast_cancer_names() -> list[str]:
    from sklearn.datasets import load_breast_cancer

    return [str(name) for name in load_breast_cancer().feature_names] + ["target"]


# --- scikit-learn's files: the first line is a count line, not a header ----------------


def test_a_file_whose_first_line_is_not_the_header_is_named_as_such(tmp_path: Path) -> None:
    sklearn_csv("breast_cancer.csv", tmp_path)
    spec = make_spec(tmp_path, {"type": "csv", "path": "breast_cancer.csv"}, labels=["target"])
    with pytest.raises(ConfigError) as raised:
        resolve_schema(spec)
    message = str(raised.value)
    assert message.startswith(
        "sources.0: breast_cancer.csv: the header (line 1: '569,30,malignant,benign') "
        "has 4 columns and the rows have 31."
    )
    assert "header: none with names (31 of them)" in message
    assert "skip_lines: 1" in message


def test_count_line_skipped_and_names_given_with_inferred_types(tmp_path: Path) -> None:
    sklearn_csv("breast_cancer.csv", tmp_path)
    names = breast_cancer_names()
    source = {
        "type": "csv",
        "path": "breast_cancer.csv",
        "skip_lines": 1,
        "header": "none",
        "names": names,
    }
    spec = make_spec(tmp_path, source, labels=["target"])
    records, quarantined = read(spec)
    assert quarantined == []
    assert len(records) == 569
    assert public(records[0])["mean radius"] == "17.99"
    assert public(records[0])["target"] == "0"
    assert records[0][ORIGIN] == "breast_cancer.csv:2"  # line numbers count the skipped line

    resolved = resolve_schema(spec)
    assert list(resolved.fields)[:3] == ["mean_radius", "mean_texture", "mean_perimeter"]
    assert {field.type for name, field in resolved.fields.items() if name != "target"} == {
        "numeric"
    }
    assert resolved.fields["target"].type == "categorical"
    assert resolved.columns["mean_radius"] == "mean radius"
    assert resolved.spec.labels == ["target"]


def test_count_line_skipped_and_names_given_with_declared_types(tmp_path: Path) -> None:
    sklearn_csv("iris.csv", tmp_path)
    names = ["sepal length (cm)", "sepal width (cm)", "petal length (cm)", "petal width (cm)"]
    source = {
        "type": "csv",
        "path": "iris.csv",
        "skip_lines": 1,
        "header": "none",
        "names": [*names, "species"],
    }
    schema = {name: {"type": "numeric"} for name in names}
    spec = make_spec(
        tmp_path,
        source,
        schema={**schema, "species": {"type": "categorical"}},
        infer_schema=False,
        labels=["species"],
    )
    resolved = resolve_schema(spec)
    assert list(resolved.fields) == [
        "sepal_length_cm",
        "sepal_width_cm",
        "petal_length_cm",
        "petal_width_cm",
        "species",
    ]
    assert resolved.reasons["species"] == "declared in the spec"
    records, quarantined = read(spec)
    assert quarantined == [] and len(records) == 150
    assert public(records[0]) == {
        "sepal length (cm)": "5.1",
        "sepal width (cm)": "3.5",
        "petal length (cm)": "1.4",
        "petal width (cm)": "0.2",
        "species": "0",
    }


def test_names_that_do_not_fit_the_rows_are_named(tmp_path: Path) -> None:
    sklearn_csv("wine_data.csv", tmp_path)
    source = {
        "type": "csv",
        "path": "wine_data.csv",
        "skip_lines": 1,
        "header": "none",
        "names": ["a", "b", "c"],
    }
    with pytest.raises(ConfigError) as raised:
        resolve_schema(make_spec(tmp_path, source))
    assert str(raised.value) == (
        "sources.0: wine_data.csv: names has 3 entries and the rows have 14 columns; "
        "give one name per column"
    )


# --- header options -----------------------------------------------------------------


def test_header_none_without_names_numbers_the_columns(tmp_path: Path) -> None:
    (tmp_path / "n.csv").write_text("1,x\n2,y\n")
    spec = make_spec(tmp_path, {"type": "csv", "path": "n.csv", "header": "none"})
    records, _ = read(spec)
    assert [public(r) for r in records] == [
        {"column_1": "1", "column_2": "x"},
        {"column_1": "2", "column_2": "y"},
    ]
    assert [r[ORIGIN] for r in records] == ["n.csv:1", "n.csv:2"]


def test_names_replace_a_header_and_rename_applies_after(tmp_path: Path) -> None:
    (tmp_path / "h.csv").write_text("A,B\n1,2\n")
    source = {"type": "csv", "path": "h.csv", "names": ["a", "b"], "rename": {"b": "beta"}}
    records, _ = read(make_spec(tmp_path, source))
    assert [public(r) for r in records] == [{"a": "1", "beta": "2"}]


def test_title_lines_skipped_before_the_header_and_comments_ignored(tmp_path: Path) -> None:
    (tmp_path / "c.csv").write_text(
        "Measurements, spring campaign\n\nx,label\n# calibration run below\n1,a\n#2,b\n3,c\n"
    )
    source = {"type": "csv", "path": "c.csv", "skip_lines": 2, "comment": "#"}
    records, quarantined = read(make_spec(tmp_path, source))
    assert quarantined == []
    assert [public(r) for r in records] == [{"x": "1", "label": "a"}, {"x": "3", "label": "c"}]
    assert [r[ORIGIN] for r in records] == ["c.csv:5", "c.csv:7"]


def test_missing_value_markers_are_missing(tmp_path: Path) -> None:
    (tmp_path / "m.csv").write_text("x,y\n1,NA\n n/a ,?\n-,null\n3,N/A\n")
    records, _ = read(make_spec(tmp_path, {"type": "csv", "path": "m.csv"}))
    assert [public(r) for r in records] == [
        {"x": "1", "y": None},
        {"x": None, "y": None},
        {"x": None, "y": None},
        {"x": "3", "y": None},
    ]
    custom = make_spec(tmp_path, {"type": "csv", "path": "m.csv", "na_values": ["-999", "NA"]})
    records, _ = read(custom)
    assert public(records[2]) == {"x": "-", "y": "null"}


def test_a_declared_encoding_and_semicolons(tmp_path: Path) -> None:
    (tmp_path / "l.csv").write_bytes("ville;température\nSète;21,5\n".encode("latin-1"))
    source = {"type": "csv", "path": "l.csv", "delimiter": ";", "encoding": "latin-1"}
    records, quarantined = read(make_spec(tmp_path, source))
    assert quarantined == []
    assert [public(r) for r in records] == [{"ville": "Sète", "température": "21,5"}]
    (tmp_path / "u.csv").write_bytes("a\n\xe9t\xe9\n".encode("latin-1"))
    _, quarantined = read(make_spec(tmp_path, {"type": "csv", "path": "u.csv"}))
    assert [q["reason"] for q in quarantined] == ["row is not valid UTF-8"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"names": ["a", "a"]}, "sources.0.names: duplicate names: a"),
        ({"names": ["a", ""]}, "sources.0.names: name 2 is empty"),
        ({"encoding": "klingon"}, "sources.0.encoding: unknown encoding 'klingon'"),
        ({"delimiter": "::"}, "sources.0.delimiter: must be a single character, got '::'"),
    ],
)
def test_options_no_file_could_be_read_with_are_config_errors(
    tmp_path: Path, options: dict[str, Any], message: str
) -> None:
    (tmp_path / "a.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ConfigError) as raised:
        check_sources(make_spec(tmp_path, {"type": "csv", "path": "a.csv", **options}))
    assert str(raised.value) == message


def test_a_few_bad_rows_do_not_make_the_file_misread(tmp_path: Path) -> None:
    (tmp_path / "r.csv").write_text("a,b\n1,2,3\n4,5\n6\n")
    (found,) = source_columns(make_spec(tmp_path, {"type": "csv", "path": "r.csv"}))
    assert found.columns == ["a", "b"]
    _, quarantined = read(make_spec(tmp_path, {"type": "csv", "path": "r.csv"}))
    assert [q["reason"] for q in quarantined] == [
        "expected 2 columns, got 3",
        "expected 2 columns, got 1",
    ]


# --- files the spec cannot read at all: refused before the build, naming the file ------

WINE_NAMES = [
    "alcohol",
    "malic_acid",
    "magnesium",
    "alcalinity_of_ash",
    "ash",
    "total_phenols",
    "flavanoids",
    "nonflavanoid_phenols",
    "proanthocyanins",
    "color_intensity",
    "hue",
    "od280",
    "proline",
]


def wine_with_header(directory: Path, name: str, header: list[str], rows: int = 178) -> Path:
    """scikit-learn's wine file with ``header`` instead of its count line."""
    lines = sklearn_csv("wine_data.csv", directory).read_text().splitlines()[1 : rows + 1]
    path = directory / name
    path.write_text("\n".join([",".join(header), *lines]) + "\n")
    return path


def test_a_header_that_repeats_a_name_is_refused_naming_file_columns_and_fix(
    tmp_path: Path,
) -> None:
    wine_with_header(tmp_path, "wine.csv", [*WINE_NAMES, "target"])
    wine_with_header(tmp_path, "wine_dupcols.csv", [*WINE_NAMES, "ash"])
    message = (
        "sources.1: wine_dupcols.csv:1: the header repeats 'ash' (columns 5 and 14); give "
        "the columns unique names with names: [...] (one per column, in order; they replace "
        "the header's)"
    )
    both = [{"type": "csv", "path": "wine.csv"}, {"type": "csv", "path": "wine_dupcols.csv"}]
    alone = {"type": "csv", "path": "wine_dupcols.csv"}
    for spec in (
        DatasetSpec.model_validate(  # beside a good file
            {"name": "t", "sources": both, "labels": ["target"], "base_dir": str(tmp_path)}
        ),
        make_spec(tmp_path, alone, labels=["target"]),  # alone, inferred
        make_spec(tmp_path, alone, schema={"target": {"type": "categorical"}}),  # declared
    ):
        with pytest.raises(ConfigError) as raised:
            resolve_schema(spec)
        assert str(raised.value) == message.replace("sources.1", f"sources.{len(spec.sources) - 1}")
        assert "rename" not in str(raised.value)
    names = {"type": "csv", "path": "wine_dupcols.csv", "names": [*WINE_NAMES, "target"]}
    assert "target" in resolve_schema(make_spec(tmp_path, names, labels=["target"])).fields


def test_a_header_with_an_unnamed_column_or_a_rename_onto_another_is_refused(
    tmp_path: Path,
) -> None:
    (tmp_path / "u.csv").write_text("a,,c\n1,2,3\n")
    (tmp_path / "r.csv").write_text("a,b,c\n1,2,3\n")
    cases = [
        (
            {"type": "csv", "path": "u.csv"},
            "sources.0: u.csv:1: header column 2 has no name; name it with rename: {'': NAME}, "
            "or every column with names: [...]",
        ),
        (
            {"type": "csv", "path": "r.csv", "rename": {"a": "c"}},
            "sources.0: r.csv:1: rename gives 'c' (columns 1 and 3); rename them to "
            "different names",
        ),
    ]
    for source, message in cases:
        with pytest.raises(ConfigError) as raised:
            source_columns(make_spec(tmp_path, source))
        assert str(raised.value) == message


@pytest.mark.parametrize("declared", [False, True])
def test_an_empty_csv_alone_is_refused_with_its_reason_not_a_column_list(
    tmp_path: Path, declared: bool
) -> None:
    (tmp_path / "empty.csv").write_text("")
    extra: dict[str, Any] = {"labels": ["target"]}
    if declared:
        extra["schema"] = {"target": {"type": "categorical"}}
    with pytest.raises(ConfigError) as raised:
        resolve_schema(make_spec(tmp_path, {"type": "csv", "path": "empty.csv"}, **extra))
    assert str(raised.value) == (
        "sources.0: empty.csv: empty file: a header row is required; remove the file or "
        "leave it out of the path"
    )


def test_a_header_without_rows_names_the_sources_that_gave_no_records(tmp_path: Path) -> None:
    wine_with_header(tmp_path, "header_only.csv", [*WINE_NAMES, "target"], rows=0)
    with pytest.raises(ConfigError) as raised:
        resolve_schema(make_spec(tmp_path, {"type": "csv", "path": "header_only.csv"}))
    assert str(raised.value) == (
        "schema: no fields: none are declared, and the sources (header_only.csv) gave no "
        "readable record to infer them from: they hold no data rows, or none can be read"
    )


# --- pandas' default export: an unnamed index column ------------------------------------


def pandas_wine(directory: Path, keep: slice = slice(None)) -> tuple[list[str], list[list]]:
    """scikit-learn's wine table written as ``DataFrame.to_csv()`` writes a frame: its
    index first, under an empty header cell. The columns, and the rows kept."""
    from sklearn.datasets import load_wine

    wine = load_wine()
    columns = [*map(str, wine.feature_names), "target"]
    rows = [[*map(float, x), int(y)] for x, y in zip(wine.data, wine.target, strict=True)]
    index = list(range(len(rows)))[keep]
    lines = [",".join(["", *columns])]
    lines += [",".join(map(str, [i, *rows[i]])) for i in index]
    (directory / "wine.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return columns, [rows[i] for i in index]


@pytest.mark.parametrize("keep", [slice(None), slice(3, None, 7)], ids=["whole", "filtered"])
def test_pandas_index_column_is_read_as_the_row_index_and_left_out(
    tmp_path: Path, keep: slice
) -> None:
    """The default export, and a filtered frame's (its index is no longer 0..n-1)."""
    columns, rows = pandas_wine(tmp_path, keep)
    spec = make_spec(tmp_path, {"type": "csv", "path": "wine.csv"}, labels=["target"])
    (found,) = source_columns(spec)
    assert found.columns == columns
    fields = list(resolve_schema(spec).fields)  # names made identifiers: od280_od315_…
    assert len(fields) == len(columns) and fields[0] == "alcohol" and fields[-1] == "target"
    records, quarantined = read(spec)
    assert quarantined == []
    assert len(records) == len(rows)
    first = public(records[0])
    assert list(first) == columns
    assert float(first["alcohol"]) == rows[0][0]
    (note,) = source_notes(spec)
    assert note.startswith(
        "sources.0: wine.csv: its first column has no name and holds 0, 1, 2, … (the index "
        "pandas writes): read as the row's index and left out of the fields"
    )
    assert "rename: {'': NAME} keeps it as a field" in note


def test_an_empty_frames_file_is_its_columns_and_a_note(tmp_path: Path) -> None:
    (tmp_path / "empty.csv").write_text(",a,label\n")
    spec = make_spec(tmp_path, {"type": "csv", "path": "empty.csv"})
    assert source_columns(spec)[0].columns == ["a", "label"]
    assert [note.split(": ", 2)[2][:30] for note in source_notes(spec)] == [
        "its first column has no name a",
        "a header row and no data rows,",
    ]


def test_pandas_index_column_kept_as_a_field_when_renamed(tmp_path: Path) -> None:
    columns, _ = pandas_wine(tmp_path)
    source = {"type": "csv", "path": "wine.csv", "rename": {"": "row"}}
    spec = make_spec(tmp_path, source, labels=["target"])
    assert source_columns(spec)[0].columns == ["row", *columns]
    records, _ = read(spec)
    assert [public(record)["row"] for record in records[:3]] == ["0", "1", "2"]
    assert source_notes(spec) == []


@pytest.mark.parametrize(
    "first_cells",
    [["b", "a", "c"], ["3", "2", "1"], ["1.5", "2.5", "3.5"]],
    ids=["text", "decreasing", "fractions"],
)
def test_an_unnamed_first_column_that_is_not_an_index_is_refused_with_the_fix(
    tmp_path: Path, first_cells: list[str]
) -> None:
    rows = "".join(f"{cell},{n},{n * 2}\n" for n, cell in enumerate(first_cells))
    (tmp_path / "t.csv").write_text(",a,b\n" + rows)
    with pytest.raises(ConfigError) as raised:
        source_columns(make_spec(tmp_path, {"type": "csv", "path": "t.csv"}))
    assert str(raised.value) == (
        "sources.0: t.csv:1: header column 1 has no name; name it with rename: {'': NAME}, "
        "or every column with names: [...]"
    )
