"""Dataset verification against the manifest, and drift between two datasets' statistics."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image
from rich.console import Console
from tensorflow.core.example import example_pb2

from contracts.dataset_manifest import Manifest, ShardInfo, SplitInfo, load_manifest, write_manifest
from contracts.digests import file_sha256
from contracts.features import FeatureSpec, encode_example
from research.data.rejects import DROPPED_FILE, QUARANTINE_FILE, write_entries
from research.data.report import REPORT_FILE, build_report
from research.data.spec import QualitySpec
from research.data.stats import StatisticsCombineFn
from research.data.validate import (
    Drift,
    DriftThresholds,
    compare_statistics,
    jensen_shannon,
    render_report,
    validate_dataset,
    verify_dataset,
)

FEATURES = {
    "x": FeatureSpec(name="x", type="numeric"),
    "vec": FeatureSpec(name="vec", type="numeric", shape=(2,)),
    "colour": FeatureSpec(name="colour", type="categorical", vocabulary=("red", "green", "blue")),
    "text": FeatureSpec(name="text", type="text", vocab_size=50),
    "image": FeatureSpec(name="image", type="image", height=4, width=3, channels=1),
    "label": FeatureSpec(name="label", type="numeric", dtype="int64", is_label=True),
}
COLOURS = {"red": 1.0, "green": 1.0, "blue": 1.0}


def png(height: int = 4, width: int = 3, channels: int = 1) -> bytes:
    shape = (height, width) if channels == 1 else (height, width, channels)
    buffer = io.BytesIO()
    Image.fromarray(np.full(shape, 128, dtype=np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def make_records(
    count: int, seed: int, *, x_shift: float = 0.0, colours: dict[str, float] = COLOURS
) -> list[dict]:
    rng = random.Random(seed)
    image = png()
    records = []
    for _ in range(count):
        words = rng.randint(1, 9)
        records.append(
            {
                "x": rng.gauss(10.0 + x_shift, 1.0),
                "vec": [rng.random(), rng.random()],
                "colour": rng.choices(list(colours), weights=list(colours.values()))[0],
                "text": " ".join(["word"] * words),
                "image": image,
                "label": rng.randint(0, 1),
            }
        )
    return records


def serialize(record: dict | bytes, features: dict[str, FeatureSpec]) -> bytes:
    """A record dict as the writer encodes it; bytes are written as they are."""
    if isinstance(record, bytes):
        return record
    return encode_example(record, features)


def write_dataset(
    root: Path,
    splits: dict[str, list[list[dict | bytes]]],
    *,
    features: dict[str, FeatureSpec] = FEATURES,
    compression: str = "none",
) -> Manifest:
    """Write shards (split -> shards -> records), statistics, a manifest, a report and empty
    quarantine and dropped logs, like a build that kept every record does."""
    root.mkdir(parents=True, exist_ok=True)
    options = tf.io.TFRecordOptions(compression_type="GZIP" if compression == "gzip" else "")
    split_infos, statistics = {}, {}
    for split, shards in splits.items():
        fn = StatisticsCombineFn(features)
        accumulator = fn.create_accumulator()
        infos = []
        for index, records in enumerate(shards):
            relative = f"{split}-{index:05d}-of-{len(shards):05d}.tfrecord"
            with tf.io.TFRecordWriter(str(root / relative), options) as writer:
                for record in records:
                    writer.write(serialize(record, features))
                    # Raw Examples count as records whose every feature is missing.
                    accumulator = fn.add_input(
                        accumulator, {} if isinstance(record, bytes) else record
                    )
            infos.append(
                ShardInfo(
                    path=relative,
                    num_records=len(records),
                    sha256=file_sha256(root / relative),
                    num_bytes=(root / relative).stat().st_size,
                )
            )
        split_infos[split] = SplitInfo(name=split, shards=tuple(infos))
        statistics[split] = fn.extract_output(accumulator)
    manifest = Manifest(
        name=root.name,
        spec_hash="0" * 64,
        compression=compression,
        features=dict(features),
        labels=[name for name, spec in features.items() if spec.is_label],
        splits=split_infos,
        statistics=statistics,
    )
    write_manifest(root, manifest)
    written = {name: split.num_records for name, split in split_infos.items()}
    (root / REPORT_FILE).write_text(json.dumps(build_report({}, written, QualitySpec())))
    for log in (QUARANTINE_FILE, DROPPED_FILE):
        write_entries([], str(root / log))
    return manifest


def clean_dataset(root: Path, **kwargs) -> Manifest:
    records = make_records(90, seed=1)
    return write_dataset(
        root, {"train": [records[:40], records[40:80]], "test": [records[80:]]}, **kwargs
    )


def checks(problems) -> set[str]:
    return {problem.check for problem in problems}


def only(problems, check: str):
    found = [problem for problem in problems if problem.check == check]
    assert len(found) == 1, problems
    return found[0]


def rendered(report) -> str:
    console = Console(record=True, width=240, color_system=None)
    console.print(render_report(report))
    return console.export_text()


# ------------------------------------------------------------------------ verification


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_clean_dataset_passes(tmp_path, compression):
    clean_dataset(tmp_path / "ds", compression=compression)
    assert verify_dataset(tmp_path / "ds") == []
    report = validate_dataset(tmp_path / "ds")
    assert report.ok
    assert "PASSED" in rendered(report)


def test_flipped_byte_is_a_checksum_error_naming_the_shard(tmp_path):
    clean_dataset(tmp_path / "ds")
    shard = tmp_path / "ds" / "train-00001-of-00002.tfrecord"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))

    problems = verify_dataset(tmp_path / "ds")
    checksum = only(problems, "shard.checksum")
    assert checksum.severity == "error"
    assert "train-00001-of-00002.tfrecord" in checksum.message
    assert "shard.size" not in checks(problems)
    # The reader's CRC catches the same damage, so the record is reported unreadable too.
    assert "train-00001-of-00002.tfrecord" in only(problems, "shard.unreadable").message
    assert not any("train-00000" in problem.message for problem in problems)


def test_truncated_shard_is_reported_not_raised(tmp_path):
    clean_dataset(tmp_path / "ds")
    shard = tmp_path / "ds" / "test-00000-of-00001.tfrecord"
    shard.write_bytes(shard.read_bytes()[:-7])

    problems = verify_dataset(tmp_path / "ds")
    assert {"shard.size", "shard.checksum", "shard.unreadable"} <= checks(problems)
    assert all("test-00000-of-00001.tfrecord" in problem.message for problem in problems)
    unreadable = only(problems, "shard.unreadable").message
    # Only the last of the 10 records is cut; the reader's own words say how.
    assert "only the first 9 records are readable: truncated record" in unreadable
    assert "function_node" not in unreadable and "[Op:" not in unreadable
    assert not validate_dataset(tmp_path / "ds").ok


def test_missing_shard(tmp_path):
    clean_dataset(tmp_path / "ds")
    (tmp_path / "ds" / "train-00000-of-00002.tfrecord").unlink()

    problems = verify_dataset(tmp_path / "ds")
    assert checks(problems) == {"shard.missing"}
    assert "train-00000-of-00002.tfrecord" in problems[0].message


def test_record_count_mismatch(tmp_path):
    manifest = clean_dataset(tmp_path / "ds")
    shard = manifest.splits["test"].shards[0]
    manifest.splits["test"] = SplitInfo(
        name="test",
        shards=(ShardInfo(shard.path, shard.num_records + 1, shard.sha256, shard.num_bytes),),
    )
    write_manifest(tmp_path / "ds", manifest)

    problems = verify_dataset(tmp_path / "ds")
    count = only(problems, "shard.records")
    assert "test-00000-of-00001.tfrecord" in count.message
    assert "holds 10 records, manifest says 11" in count.message


def test_shard_path_outside_the_dataset_is_refused(tmp_path):
    manifest = clean_dataset(tmp_path / "ds")
    (tmp_path / "outside.tfrecord").write_bytes(b"")
    manifest.splits["test"] = SplitInfo(
        name="test", shards=(ShardInfo("../outside.tfrecord", 10, "0" * 64, 0),)
    )
    write_manifest(tmp_path / "ds", manifest)
    assert "../outside.tfrecord" in only(verify_dataset(tmp_path / "ds"), "shard.path").message


def test_example_with_wrong_shape_names_feature_shard_and_record(tmp_path):
    records = make_records(12, seed=2)
    records[3]["vec"] = [1.0, 2.0, 3.0]
    records[7]["vec"] = [1.0, 2.0, 3.0]
    write_dataset(tmp_path / "ds", {"train": [records]})

    problem = only(verify_dataset(tmp_path / "ds"), "example.feature")
    assert problem.severity == "error"
    assert "train-00000-of-00001.tfrecord" in problem.message
    assert "'vec'" in problem.message
    assert "expected shape [2] (2 values), found 3" in problem.message
    assert "records 3, 7" in problem.message


def test_wrong_kind_and_wrong_image_are_errors(tmp_path):
    records = make_records(6, seed=3)
    records[1]["image"] = png(height=5)
    records[2]["image"] = b"not a png"
    int_features = {**FEATURES, "x": FeatureSpec(name="x", type="numeric", dtype="int64")}
    records[4] = serialize(records[4], int_features)  # x as int64_list: wrong kind
    write_dataset(tmp_path / "ds", {"train": [records]})

    messages = [p.message for p in verify_dataset(tmp_path / "ds") if p.check == "example.feature"]
    assert len(messages) == 3
    joined = "\n".join(messages)
    assert "'image': expected a 4x3x1 image, found 5x3x1 (record 1)" in joined
    assert "'image': image does not decode" in joined
    assert "'x': expected float_list, found int64_list (record 4)" in joined


def test_categorical_with_two_values_and_garbage_records(tmp_path):
    records = make_records(4, seed=4)
    example = example_pb2.Example()
    example.features.feature["colour"].bytes_list.value.extend([b"red", b"blue"])
    records.append(example.SerializeToString())
    records.append(b"\xff\xff\xff not an example")
    write_dataset(tmp_path / "ds", {"train": [records]})

    problems = verify_dataset(tmp_path / "ds")
    feature = only(problems, "example.feature")
    assert "'colour': expected exactly one value in bytes_list, found 2" in feature.message
    assert "(record 4)" in feature.message
    assert "(record 5)" in only(problems, "example.decode").message


def test_unexpected_keys_are_warnings(tmp_path):
    records = make_records(5, seed=5)
    extra = {**FEATURES, "debug": FeatureSpec(name="debug", type="categorical")}
    records = [serialize({**record, "debug": "x"}, extra) for record in records[:3]] + records[3:]
    write_dataset(tmp_path / "ds", {"train": [records]})

    report = validate_dataset(tmp_path / "ds")
    warning = only(report.problems, "example.unexpected_key")
    assert warning.severity == "warning"
    assert "'debug'" in warning.message and "records 0, 1, 2" in warning.message
    assert report.ok  # readers ignore the key; the data is still usable


def test_many_bad_records_make_one_problem(tmp_path):
    records = make_records(40, seed=6)
    for record in records:
        record["vec"] = [0.0]
    write_dataset(tmp_path / "ds", {"train": [records]})
    problem = only(verify_dataset(tmp_path / "ds"), "example.feature")
    assert "records 0, 1, 2, 3, 4 and 35 more" in problem.message


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "no manifest.json"),
        ("{not json", "unreadable manifest"),
        ('{"format": "x"}', "not a"),
    ],
)
def test_missing_or_invalid_manifest_is_a_problem(tmp_path, content, expected):
    root = tmp_path / "ds"
    root.mkdir()
    if content is not None:
        (root / "manifest.json").write_text(content)
    report = validate_dataset(root, reference_dir=root)
    assert [problem.check for problem in report.problems] == ["manifest"]
    assert expected in report.problems[0].message
    assert not report.ok
    json.dumps(report.to_json(), allow_nan=False)
    assert "FAILED" in rendered(report)


def test_manifest_level_inconsistencies(tmp_path):
    manifest = clean_dataset(tmp_path / "ds")
    manifest.labels.append("nope")
    manifest.features["text"] = FeatureSpec(
        name="text", type="text", vocab_size=50, tokenizer_file="tokenizers/text.model"
    )
    manifest.statistics["train"]["num_records"] = 1
    write_manifest(tmp_path / "ds", manifest)

    problems = verify_dataset(tmp_path / "ds")
    assert "'nope'" in only(problems, "manifest.labels").message
    assert "tokenizers/text.model is missing" in only(problems, "tokenizer").message
    assert (
        "statistics count 1 records but the shards hold 80" in only(problems, "statistics").message
    )


def test_an_empty_split_fails_validation(tmp_path):
    records = make_records(30, seed=7)
    write_dataset(tmp_path / "ds", {"train": [records[:20], records[20:]], "test": [[]]})
    report = validate_dataset(tmp_path / "ds")
    assert not report.ok
    assert "split 'test' holds no records" in only(report.problems, "split.empty").message
    assert "FAILED" in rendered(report)


def test_a_dataset_with_no_records_at_all_fails_validation(tmp_path):
    write_dataset(tmp_path / "ds", {"train": [[], []], "validation": [[]], "test": [[]]})
    problems = verify_dataset(tmp_path / "ds")
    empty = [problem.message for problem in problems if problem.check == "split.empty"]
    assert len(empty) == 3
    assert not validate_dataset(tmp_path / "ds").ok


@pytest.mark.parametrize("name", [REPORT_FILE, QUARANTINE_FILE, DROPPED_FILE])
def test_a_missing_build_file_fails_validation_naming_it(tmp_path, name):
    clean_dataset(tmp_path / "ds")
    (tmp_path / "ds" / name).unlink()
    report = validate_dataset(tmp_path / "ds")
    assert not report.ok
    (problem,) = report.problems
    assert problem.severity == "error"
    assert problem.message == f"{tmp_path / 'ds' / name}: missing"


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        (REPORT_FILE, "{not json", "report.json: unreadable"),
        (REPORT_FILE, "[]", "report.json: not a data report"),
        (QUARANTINE_FILE, '{"origin": "a.csv:2"}\n{oops\n', "quarantine.jsonl:2: not a JSON line"),
        (DROPPED_FILE, "[1, 2]\n", "dropped.jsonl:1: expected an object with an 'origin'"),
    ],
)
def test_an_unreadable_build_file_fails_validation(tmp_path, name, content, expected):
    clean_dataset(tmp_path / "ds")
    (tmp_path / "ds" / name).write_text(content, encoding="utf-8")
    report = validate_dataset(tmp_path / "ds")
    assert not report.ok
    assert [expected in problem.message for problem in report.problems] == [True]


def test_logs_must_hold_a_line_for_each_record_the_report_counts(tmp_path):
    clean_dataset(tmp_path / "ds")
    path = tmp_path / "ds" / REPORT_FILE
    report = json.loads(path.read_text())
    report["records_quarantined"] = 2
    report["records_merged"] = 1
    path.write_text(json.dumps(report))
    messages = sorted(problem.message for problem in verify_dataset(tmp_path / "ds"))
    assert messages == [
        f"{tmp_path / 'ds' / DROPPED_FILE}: 0 lines, report.json counts 1",
        f"{tmp_path / 'ds' / QUARANTINE_FILE}: 0 lines, report.json counts 2",
    ]


def test_a_report_disagreeing_with_the_manifest_fails_validation(tmp_path):
    clean_dataset(tmp_path / "ds")
    path = tmp_path / "ds" / REPORT_FILE
    report = json.loads(path.read_text())
    report["records_written"]["train"] = 81
    path.write_text(json.dumps(report))
    problem = only(verify_dataset(tmp_path / "ds"), "report")
    assert "records_written {'train': 81, 'test': 10} disagrees" in problem.message


def test_unknown_feature_type_stops_before_reading_shards(tmp_path):
    manifest = clean_dataset(tmp_path / "ds")
    manifest.features["x"] = FeatureSpec(name="x", type="audio")
    write_manifest(tmp_path / "ds", manifest)
    problems = verify_dataset(tmp_path / "ds")
    assert checks(problems) == {"manifest.features"}
    assert "'x': unknown type 'audio'" in problems[0].message


# --------------------------------------------------------------------------------- drift


def drift_pair(tmp_path, current_records, reference_records):
    write_dataset(tmp_path / "ref", {"train": [reference_records]})
    write_dataset(tmp_path / "cur", {"train": [current_records]})
    return validate_dataset(tmp_path / "cur", reference_dir=tmp_path / "ref")


def test_identically_distributed_dataset_shows_no_drift(tmp_path):
    report = drift_pair(tmp_path, make_records(400, seed=10), make_records(400, seed=11))
    assert report.drifts == []
    assert report.ok
    assert "0 drifts in split 'train'" in rendered(report)


def test_shifted_numeric_feature_is_flagged(tmp_path):
    report = drift_pair(
        tmp_path, make_records(400, seed=10, x_shift=2.0), make_records(400, seed=11)
    )
    assert [(drift.feature, drift.check) for drift in report.drifts] == [
        ("x", "numeric.mean_shift")
    ]
    drift = report.drifts[0]
    assert 1.7 < drift.value < 2.3
    assert drift.threshold == 0.5
    assert not report.ok
    assert "numeric.mean_shift" in rendered(report)


def test_changed_category_distribution_and_new_category_are_flagged(tmp_path):
    shifted = {"red": 8.0, "green": 1.0, "blue": 1.0, "purple": 2.0}
    report = drift_pair(
        tmp_path, make_records(400, seed=10, colours=shifted), make_records(400, seed=11)
    )
    found = {drift.check: drift for drift in report.drifts}
    assert set(found) == {"categorical.linf", "categorical.new_values"}
    assert all(drift.feature == "colour" for drift in report.drifts)
    assert found["categorical.linf"].value > 0.2
    assert "'red'" in found["categorical.linf"].message
    assert "Jensen-Shannon" in found["categorical.linf"].message
    assert "'purple'" in found["categorical.new_values"].message
    assert 0.1 < found["categorical.new_values"].value < 0.3


def test_vanished_category_is_flagged(tmp_path):
    report = drift_pair(
        tmp_path,
        make_records(400, seed=10, colours={"red": 1.0, "green": 1.0, "blue": 0.05}),
        make_records(400, seed=11),
    )
    assert {drift.check for drift in report.drifts} == {"categorical.linf"}

    two_colours = make_records(400, seed=10, colours={"red": 1.0, "green": 1.0})
    report = drift_pair(tmp_path / "again", two_colours, make_records(400, seed=11))
    gone = [drift for drift in report.drifts if drift.check == "categorical.missing_values"]
    assert len(gone) == 1 and "'blue'" in gone[0].message


def test_text_length_median_shift(tmp_path):
    current = make_records(200, seed=10)
    for record in current:
        record["text"] = record["text"] * 2
    report = drift_pair(tmp_path, current, make_records(200, seed=11))
    assert [(drift.feature, drift.check) for drift in report.drifts] == [
        ("text", "text.median_characters")
    ]
    assert report.drifts[0].value > 0.9


def test_schema_differences_are_errors(tmp_path):
    reference = write_dataset(tmp_path / "ref", {"train": [make_records(50, seed=1)]})
    features = dict(FEATURES)
    del features["vec"]
    features["x"] = FeatureSpec(name="x", type="numeric", dtype="int64")
    features["extra"] = FeatureSpec(name="extra", type="categorical")
    records = [{**record, "x": 10, "extra": "e"} for record in make_records(50, seed=2)]
    current = write_dataset(tmp_path / "cur", {"train": [records]}, features=features)

    drifts = compare_statistics(current, reference)
    schema = {(drift.feature, drift.check) for drift in drifts if drift.severity == "error"}
    assert schema == {("extra", "schema.added"), ("vec", "schema.removed"), ("x", "schema.changed")}
    changed = next(drift for drift in drifts if drift.check == "schema.changed")
    assert changed.message == "numeric float32 [] -> numeric int64 []"
    assert not any(drift.feature == "x" and drift.severity != "error" for drift in drifts)


def test_constant_reference_feature(tmp_path):
    features = {"c": FeatureSpec(name="c", type="numeric")}
    reference = write_dataset(tmp_path / "ref", {"train": [[{"c": 1.0}] * 5]}, features=features)
    same = write_dataset(tmp_path / "same", {"train": [[{"c": 1.0}] * 5]}, features=features)
    moved = write_dataset(tmp_path / "moved", {"train": [[{"c": 2.0}] * 5]}, features=features)

    assert compare_statistics(same, reference) == []
    drifts = compare_statistics(moved, reference)
    assert [drift.check for drift in drifts] == ["numeric.mean_shift"]
    assert drifts[0].value == float("inf")
    assert drifts[0].to_json()["value"] is None


def test_std_ratio(tmp_path):
    features = {"v": FeatureSpec(name="v", type="numeric")}
    reference = write_dataset(
        tmp_path / "ref", {"train": [[{"v": v} for v in (-1.0, 1.0)]]}, features=features
    )
    wide = write_dataset(
        tmp_path / "wide", {"train": [[{"v": v} for v in (-3.0, 3.0)]]}, features=features
    )
    drifts = compare_statistics(wide, reference)
    assert [(drift.check, drift.value) for drift in drifts] == [("numeric.std_ratio", 3.0)]
    assert compare_statistics(wide, reference, thresholds=DriftThresholds(std_ratio=3.5)) == []


def test_feature_with_values_only_in_the_reference(tmp_path):
    reference = write_dataset(tmp_path / "ref", {"train": [make_records(20, seed=1)]})
    records = [{**record, "colour": None} for record in make_records(20, seed=1)]
    current = write_dataset(tmp_path / "cur", {"train": [records]})
    drifts = compare_statistics(current, reference)
    assert [(drift.feature, drift.check) for drift in drifts] == [("colour", "presence")]


def test_missing_reference_statistics_is_a_problem_not_a_traceback(tmp_path):
    write_dataset(tmp_path / "ref", {"test": [make_records(20, seed=1)]})
    write_dataset(tmp_path / "cur", {"train": [make_records(20, seed=2)]})
    report = validate_dataset(tmp_path / "cur", reference_dir=tmp_path / "ref")
    problem = only(report.problems, "drift")
    assert "reference" in problem.message and "'train'" in problem.message
    assert not report.ok

    report = validate_dataset(tmp_path / "cur", reference_dir=tmp_path / "nowhere")
    assert "no manifest.json" in only(report.problems, "drift").message


def test_malformed_statistics_are_a_problem(tmp_path):
    write_dataset(tmp_path / "ref", {"train": [make_records(20, seed=1)]})
    write_dataset(tmp_path / "cur", {"train": [make_records(20, seed=2)]})
    manifest = load_manifest(tmp_path / "ref")
    del manifest.statistics["train"]["features"]["x"]["mean"]
    write_manifest(tmp_path / "ref", manifest)
    report = validate_dataset(tmp_path / "cur", reference_dir=tmp_path / "ref")
    assert "'x'" in only(report.problems, "drift").message


def test_report_json_is_strict_and_complete(tmp_path):
    report = drift_pair(
        tmp_path, make_records(100, seed=10, x_shift=3.0), make_records(100, seed=11)
    )
    data = json.loads(json.dumps(report.to_json(), allow_nan=False))
    assert data["ok"] is False
    assert data["split"] == "train"
    assert data["drifts"][0]["feature"] == "x"
    assert set(data["drifts"][0]) == {
        "feature",
        "check",
        "value",
        "threshold",
        "message",
        "severity",
    }


def test_jensen_shannon_bounds():
    assert jensen_shannon({"a": 0.5, "b": 0.5}, {"a": 0.5, "b": 0.5}) == 0.0
    assert jensen_shannon({"a": 1.0}, {"b": 1.0}) == pytest.approx(1.0)
    assert 0.0 < jensen_shannon({"a": 0.9, "b": 0.1}, {"a": 0.5, "b": 0.5}) < 0.2


def test_drift_json_drops_infinities():
    drift = Drift("f", "numeric.mean_shift", float("inf"), 0.5, "m")
    assert drift.to_json()["value"] is None
    assert drift.to_json()["threshold"] == 0.5


def test_paths_without_a_readable_manifest_are_listed_as_not_datasets(tmp_path):
    (tmp_path / "corrupt").mkdir()
    (tmp_path / "corrupt" / "manifest.json").write_text("{")
    for path in (tmp_path / "missing", tmp_path, tmp_path / "corrupt"):
        report = validate_dataset(path)
        assert report.not_datasets == [str(path)] and not report.ok
        assert report.to_json()["not_datasets"] == [str(path)]
        assert [problem.check for problem in report.problems] == ["manifest"]
