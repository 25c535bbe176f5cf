"""Feature names for any column name, and the spec's field names checked against the
columns of its sources before anything runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from contracts.features import FeatureSpec
from contracts.yaml_config import ConfigError
from research.data.feature_names import closest_name, feature_name, feature_names
from research.data.schema import SPLIT_KEY, resolve_schema
from research.data.spec import DatasetSpec
from research.models.specs import HeadSpec, InputSpec, check_names


def make_spec(base: Path, *sources: dict[str, Any], **extra: Any) -> DatasetSpec:
    return DatasetSpec.model_validate(
        {"name": "t", "sources": list(sources), "base_dir": str(base), **extra}
    )


# --- the naming rule ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("column", "name"),
    [
        ("mean radius", "mean_radius"),
        ("petal length (cm)", "petal_length_cm"),
        ("1st", "f_1st"),
        ("0", "f_0"),
        ("a/b", "a_b"),
        ("température", "temperature"),
        ("_id", "id"),
        ("  ", "f"),
        ("x.y-z", "x.y-z"),  # already valid: kept as it is
        ("Age", "Age"),
    ],
)
def test_feature_name_rule(column: str, name: str) -> None:
    assert feature_name(column) == name


def test_feature_names_are_unique_valid_and_depend_only_on_the_columns() -> None:
    columns = ["a b", "a_b", "a-b", "a/b", "1", "f_1", "é", "e"]
    names = feature_names(columns)
    assert names == {
        "a b": "a_b_2",  # 'a_b' is a valid column name of its own
        "a_b": "a_b",
        "a-b": "a-b",
        "a/b": "a_b_3",
        "1": "f_1_2",
        "f_1": "f_1",
        "é": "e_2",
        "e": "e",
    }
    assert len(set(names.values())) == len(columns)
    check_names({name: InputSpec() for name in names.values()}, {"y": HeadSpec(kind="regression")})
    assert feature_names(columns) == names


def test_closest_name_prefers_the_column_a_feature_name_came_from() -> None:
    columns = ["mean radius", "mean texture", "target"]
    assert closest_name("mean_radius", columns) == "mean radius"
    assert closest_name("targte", columns) == "target"
    assert closest_name("Target", columns) == "target"
    assert closest_name("zzz", columns) is None


def test_old_manifests_without_source_names_still_load() -> None:
    feature = FeatureSpec.from_json("x", {"type": "numeric"})
    assert feature.source_name is None
    renamed = FeatureSpec(name="mean_radius", type="numeric", source_name="mean radius")
    assert renamed.to_json()["source_name"] == "mean radius"
    assert "source_name" not in feature.to_json()


# --- names in the spec against the columns of the sources ------------------------------


@pytest.fixture
def cancer(tmp_path: Path) -> Path:
    rows = ["id,mean radius,mean texture,target"]
    rows += [f"p{i % 10},{10 + i / 7:.3f},{20 - i / 9:.3f},{i % 2}" for i in range(40)]
    (tmp_path / "cancer.csv").write_text("\n".join(rows) + "\n")
    return tmp_path


def test_a_declared_field_that_is_no_column_suggests_the_closest(cancer: Path) -> None:
    spec = make_spec(
        cancer,
        {"type": "csv", "path": "cancer.csv"},
        schema={"mean_radius": {"type": "numeric"}},
    )
    with pytest.raises(ConfigError) as raised:
        resolve_schema(spec)
    assert str(raised.value) == (
        "schema.mean_radius: no source has a column 'mean_radius'; did you mean "
        "'mean radius'?; columns found: cancer.csv: id, mean radius, mean texture, target"
    )


def test_a_label_typo_suggests_the_field(cancer: Path) -> None:
    spec = make_spec(cancer, {"type": "csv", "path": "cancer.csv"}, labels=["targte"])
    with pytest.raises(ConfigError) as raised:
        resolve_schema(spec)
    assert str(raised.value) == (
        "labels: unknown field 'targte' (fields: id, mean radius, mean texture, target); "
        "did you mean 'target'?"
    )


def test_a_label_typo_in_the_declared_schema_is_caught_before_inference(cancer: Path) -> None:
    spec = make_spec(
        cancer,
        {"type": "csv", "path": "cancer.csv"},
        schema={"targte": {"type": "categorical"}},
        labels=["targte"],
    )
    with pytest.raises(ConfigError, match=r"^schema.targte: .*did you mean 'target'\?"):
        resolve_schema(spec)


def test_an_excluded_column_is_no_field_and_exclude_is_checked(cancer: Path) -> None:
    source = {"type": "csv", "path": "cancer.csv"}
    with pytest.raises(ConfigError, match=r"^exclude: no source has a column 'idd'; did you"):
        resolve_schema(make_spec(cancer, source, exclude=["idd"]))
    declared = {"target": {"type": "categorical"}}
    with pytest.raises(ConfigError, match="^exclude: 'target' is also declared under schema"):
        resolve_schema(make_spec(cancer, source, exclude=["target"], schema=declared))
    with pytest.raises(ConfigError) as raised:
        resolve_schema(make_spec(cancer, source, exclude=["target"], labels=["target"]))
    assert str(raised.value) == (
        "labels: 'target' is a column of cancer.csv but not a field: it is listed under exclude"
    )


def test_a_split_key_may_be_a_column_that_is_not_a_field(cancer: Path) -> None:
    spec = make_spec(
        cancer,
        {"type": "csv", "path": "cancer.csv"},
        exclude=["id"],
        labels=["target"],
        split={"key": "id"},
    )
    resolved = resolve_schema(spec)
    assert list(resolved.fields) == ["mean_radius", "mean_texture", "target"]
    assert resolved.spec.split.key == SPLIT_KEY
    assert resolved.columns == {
        "mean_radius": "mean radius",
        "mean_texture": "mean texture",
        SPLIT_KEY: "id",
    }
    declared = make_spec(
        cancer,
        {"type": "csv", "path": "cancer.csv"},
        schema={"mean radius": {"type": "numeric"}, "target": {"type": "categorical"}},
        infer_schema=False,
        labels=["target"],
        split={"key": "id"},
    )
    assert list(resolve_schema(declared).fields) == ["mean_radius", "target"]


def test_every_reference_is_renamed_with_its_field(cancer: Path) -> None:
    (cancer / "notes.jsonl").write_text(
        "\n".join(json.dumps({"free text": f"note number {i} here"}) for i in range(5))
    )
    spec = make_spec(
        cancer,
        {"type": "csv", "path": "cancer.csv"},
        {"type": "jsonl", "path": "notes.jsonl"},
        labels=["target"],
        clean={"required": ["mean radius"], "length": {"free text": {"min": 1}}},
        dedup={"exact": {"fields": ["mean radius", "id"]}},
        vocab={"fields": ["free text"]},
    )
    renamed = resolve_schema(spec).spec
    assert renamed.clean.required == ["mean_radius"]
    assert list(renamed.clean.length) == ["free_text"]
    assert renamed.dedup.exact.fields == ["mean_radius", "id"]
    assert renamed.vocab.fields == ["free_text"]
    assert renamed.base_dir == spec.base_dir
