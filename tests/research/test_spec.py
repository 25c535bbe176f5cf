"""Dataset specs: validation errors point at the key; paths resolve next to the spec."""

from __future__ import annotations

import pytest

from contracts.yaml_config import ConfigError
from research.data.spec import DatasetSpec, load_spec


def write_spec(tmp_path, body: str):
    (tmp_path / "data.csv").write_text("a,b\n1,2\n")
    path = tmp_path / "spec.yaml"
    path.write_text(body)
    return path


def test_minimal_spec_gets_defaults(tmp_path):
    spec = load_spec(write_spec(tmp_path, "name: t\nsources:\n  - {type: csv, path: data.csv}\n"))
    assert spec.split.ratios == {"train": 0.8, "validation": 0.1, "test": 0.1}
    assert spec.resolve("data.csv") == str(tmp_path / "data.csv")
    assert spec.resolve("gs://bucket/raw/*.csv") == "gs://bucket/raw/*.csv"
    assert spec.clean.pii.kinds == ["email", "phone", "ipv4", "card"]


def test_source_type_errors_name_the_source_key(tmp_path):
    path = write_spec(
        tmp_path, "name: t\nsources:\n  - type: csv\n    path: data.csv\n    delimeter: ';'\n"
    )
    with pytest.raises(
        ConfigError,
        match=r"spec.yaml:5: sources.0.delimeter: unknown key; did you mean 'delimiter'\?",
    ):
        load_spec(path)


def test_an_old_vocabulary_key_says_what_replaced_it(tmp_path):
    path = write_spec(
        tmp_path, "name: t\nsources:\n  - {type: csv, path: data.csv}\nvocab: {min_frequency: 2}\n"
    )
    with pytest.raises(
        ConfigError, match=r"vocab.min_frequency: unknown key: removed; .*vocab.size"
    ):
        load_spec(path)


def test_unknown_source_type(tmp_path):
    path = write_spec(tmp_path, "name: t\nsources:\n  - {type: parquet, path: data.csv}\n")
    with pytest.raises(ConfigError, match=r"sources.0"):
        load_spec(path)


def test_missing_source_file_is_named(tmp_path):
    path = write_spec(tmp_path, "name: t\nsources:\n  - {type: csv, path: missing.csv}\n")
    with pytest.raises(ConfigError, match=r"sources.0.path: no such file or folder"):
        load_spec(path)


def test_split_ratios_must_sum_to_one(tmp_path):
    path = write_spec(
        tmp_path,
        "name: t\nsources:\n  - {type: csv, path: data.csv}\nsplit:\n  ratios: {train: 0.5, test: 0.2}\n",
    )
    with pytest.raises(ConfigError, match=r"spec.yaml:5: split.ratios: split ratios must sum to 1"):
        load_spec(path)


def test_image_field_needs_dimensions(tmp_path):
    path = write_spec(
        tmp_path,
        "name: t\nsources:\n  - {type: csv, path: data.csv}\nschema:\n  img: {type: image}\n",
    )
    with pytest.raises(ConfigError, match=r"schema.img: an image field needs"):
        load_spec(path)


@pytest.mark.parametrize(
    ("field", "message"),
    [
        ("{type: categorical, transform: log}", "clip and transform apply to numeric fields only"),
        ("{type: numeric, clip: [5, 1]}", r"clip must be two finite numbers, low < high"),
        ("{type: numeric, clip: [0, .inf]}", r"clip must be two finite numbers"),
        ("{type: numeric, transform: sqrt}", r"schema.b.transform"),
    ],
)
def test_clip_and_transform_are_checked_where_they_are_written(tmp_path, field, message):
    body = f"name: t\nsources:\n  - {{type: csv, path: data.csv}}\nschema:\n  b: {field}\n"
    with pytest.raises(ConfigError, match=message):
        load_spec(write_spec(tmp_path, body))


def test_spec_hash_is_stable_and_sensitive(tmp_path):
    first = load_spec(write_spec(tmp_path, "name: t\nsources:\n  - {type: csv, path: data.csv}\n"))
    again = DatasetSpec.model_validate(first.model_dump(by_alias=True))
    changed = first.model_copy(update={"name": "u"})
    assert first.spec_hash() == again.spec_hash()
    assert first.spec_hash() != changed.spec_hash()


def test_shards_for_a_split_that_does_not_exist_is_refused_with_the_closest(tmp_path):
    body = "name: t\nsources:\n  - {type: csv, path: data.csv}\noutput:\n  num_shards: {}\n"
    path = write_spec(tmp_path, body.replace("{}", "{train: 2, valdation: 1}"))
    with pytest.raises(ConfigError) as raised:
        load_spec(path)
    assert str(raised.value) == (
        f"{path}:5: output.num_shards.valdation: no split 'valdation' in split.ratios "
        "(train, validation, test); did you mean 'validation'?"
    )
    renamed = (
        body.replace("{}", "{fit: 2, holdout: 1}") + "split:\n  ratios: {fit: 0.9, holdout: 0.1}\n"
    )
    spec = load_spec(write_spec(tmp_path, renamed))
    assert (spec.output.shards_for("fit"), spec.output.shards_for("holdout")) == (2, 1)
    with pytest.raises(ConfigError, match=r"output.num_shards.test: no split 'test' in split"):
        load_spec(
            write_spec(
                tmp_path,
                body.replace("{}", "{train: 2, test: 1}")
                + "split:\n  ratios: {train: 0.9, holdout: 0.1}\n",
            )
        )
