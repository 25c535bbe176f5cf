"""Check a dataset directory against its manifest, and its statistics against a reference.

Two questions, answered separately because they fail differently:

- **Is the dataset what its manifest says?** (``verify_dataset``) Every split holds
  records, every shard exists with the recorded size, SHA-256 and record count, and
  every record is an Example a reader can parse into exactly the declared features.
  The build's own files are there and agree with it: ``report.json`` counts the records
  the shards hold, and one line of ``quarantine.jsonl`` or ``dropped.jsonl`` for each
  record it says was quarantined, dropped or merged. Failures here are *problems*.
- **Does it look like the data the model was built on?** (``compare_statistics``) The
  manifest statistics of one split are compared with a reference dataset's, the way
  TensorFlow Data Validation compares spans: numeric means in reference standard
  deviations, categorical distributions by L-infinity distance, text length medians.
  Differences past a threshold are *drifts*; a changed schema is always an error.

Nothing here raises on bad data: a missing manifest, an unreadable shard or a malformed
statistics block is a finding in the report, so the CLI can always print a table.

Datasets are read through Beam's ``FileSystems``, as the build writes them, so a dataset
on an object store (``gs://…``) is checked where it is; each shard is read once, its
SHA-256 taken on the way.
"""

from __future__ import annotations

import hashlib
import io
import math
import os
import posixpath
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from PIL import Image
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from contracts.dataset_manifest import (
    MANIFEST_FILE,
    DatasetError,
    Manifest,
    ShardInfo,
    parse_manifest,
)
from contracts.features import FeatureSpec, parsing_spec
from research.data import filesystems
from research.data.rejects import DROPPED_FILE, QUARANTINE_FILE, read_entries
from research.data.report import REPORT_FILE
from research.data.tfrecord_files import CorruptRecordError, DigestingReader, read_records

READ_BATCH = 512
LISTED_RECORDS = 5  # record indices named per finding before "and N more"
LISTED_VALUES = 5  # category values named per drift before "…"
COMPRESSIONS = ("none", "gzip")
_BLOCKING_CHECKS = ("manifest", "manifest.features")


@dataclass(frozen=True)
class Problem:
    """Something about the dataset that does not match its manifest or the file format."""

    severity: str  # "error" | "warning"
    check: str
    message: str  # names the file, shard and feature concerned

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Drift:
    """A statistic that moved past its threshold, or a schema difference (severity "error")."""

    feature: str
    check: str
    value: float | None
    threshold: float | None
    message: str
    severity: str = "drift"  # "drift" | "error"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("value", "threshold"):  # strict JSON has no Infinity
            if data[key] is not None and not math.isfinite(data[key]):
                data[key] = None
        return data


@dataclass(frozen=True)
class DriftThresholds:
    """How far a statistic may move before it counts as drift."""

    numeric_std: float = 0.5  # |mean shift| in reference standard deviations
    std_ratio: float = 2.0  # current/reference std (or its inverse)
    categorical_linf: float = 0.1  # max |difference| of normalised frequencies
    categorical_js: float | None = None  # Jensen-Shannon divergence (base 2); None: report only
    new_category_mass: float = 0.0  # share of current records whose value the reference lacks
    missing_category_mass: float = 0.0  # share of reference records whose value is now absent
    text_median: float = 0.25  # relative shift of the median length (characters, tokens)


@dataclass
class ValidationReport:
    dataset_dir: str
    reference_dir: str | None
    split: str
    problems: list[Problem] = field(default_factory=list)
    drifts: list[Drift] = field(default_factory=list)
    # The paths given (the dataset, the reference) that hold no readable manifest: not
    # datasets at all, which the CLI tells apart from datasets that fail their checks.
    not_datasets: list[str] = field(default_factory=list)

    @property
    def errors(self) -> list[Problem]:
        return [problem for problem in self.problems if problem.severity == "error"]

    @property
    def warnings(self) -> list[Problem]:
        return [problem for problem in self.problems if problem.severity == "warning"]

    @property
    def ok(self) -> bool:
        return not self.errors and not self.drifts

    def to_json(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset_dir,
            "reference": self.reference_dir,
            "split": self.split,
            "ok": self.ok,
            "not_datasets": list(self.not_datasets),
            "problems": [problem.to_json() for problem in self.problems],
            "drifts": [drift.to_json() for drift in self.drifts],
        }


# --------------------------------------------------------------------------- verification


def verify_dataset(dataset_dir: str | Path) -> list[Problem]:
    """Every way the directory disagrees with its manifest, in manifest order."""
    return _verify(os.fspath(dataset_dir))[1]


def read_manifest(root: str | Path) -> Manifest:
    """The manifest of the dataset at ``root`` (a path or a URI); DatasetError when there
    is none or it is unreadable."""
    path = filesystems.join(os.fspath(root), MANIFEST_FILE)
    try:
        text = filesystems.read_bytes(path)
    except FileNotFoundError:
        raise DatasetError(f"{root}: not a dataset (no {MANIFEST_FILE})") from None
    except OSError as exc:
        if not filesystems.exists(path):
            raise DatasetError(f"{root}: not a dataset (no {MANIFEST_FILE})") from None
        raise DatasetError(f"{path}: unreadable manifest: {exc}") from None
    return parse_manifest(text, path)


def _inside(relative: str) -> bool:
    """Whether a manifest's relative path stays within the dataset directory."""
    parts = posixpath.normpath(relative.replace("\\", "/")).split("/")
    return not relative.startswith("/") and ":" not in parts[0] and ".." not in parts


def _verify(root: str) -> tuple[Manifest | None, list[Problem]]:
    try:
        manifest = read_manifest(root)
    except DatasetError as exc:
        return None, [Problem("error", "manifest", str(exc))]
    problems = [*_check_manifest(root, manifest), *_check_build_logs(root, manifest)]
    if any(problem.check in _BLOCKING_CHECKS for problem in problems):
        return manifest, problems  # records cannot be judged against a broken feature spec
    checker = _ExampleChecker(manifest.features)
    for split in manifest.splits.values():
        for shard in split.shards:
            problems.extend(_verify_shard(root, manifest, split.name, shard, checker))
    return manifest, problems


def _check_manifest(root: str, manifest: Manifest) -> Iterator[Problem]:
    where = filesystems.join(root, MANIFEST_FILE)
    if manifest.compression not in COMPRESSIONS:
        yield Problem(
            "error",
            "manifest",
            f"{where}: compression {manifest.compression!r} is not one of {COMPRESSIONS}",
        )
    for name, spec in manifest.features.items():
        issue = _feature_spec_issue(spec)
        if issue:
            yield Problem("error", "manifest.features", f"{where}: feature {name!r}: {issue}")
        side_files = (
            ("tokenizer", spec.tokenizer_file, spec.tokenizer_sha256),
            ("word terms", spec.words_file, spec.words_sha256),
        )
        for what, relative, sha256 in side_files:
            issue = _side_file_issue(root, what, relative, sha256)
            if issue:
                yield Problem("error", "tokenizer", f"{where}: feature {name!r}: {issue}")
    for label in manifest.labels:
        if label not in manifest.features:
            yield Problem("error", "manifest.labels", f"{where}: label {label!r} is not a feature")
    paths = Counter(shard.path for split in manifest.splits.values() for shard in split.shards)
    for path, times in sorted(paths.items()):
        if times > 1:
            yield Problem("error", "shard.path", f"{where}: shard {path} is listed {times} times")
    if not manifest.splits:
        yield Problem("error", "split.empty", f"{where}: no splits are listed")
    for split in manifest.splits.values():
        if split.num_records == 0:
            yield Problem("error", "split.empty", f"{where}: split {split.name!r} holds no records")
        stats = manifest.statistics.get(split.name)
        if not isinstance(stats, dict):
            yield Problem(
                "warning",
                "statistics",
                f"{where}: split {split.name!r} has no statistics; drift cannot be checked",
            )
        elif stats.get("num_records") != split.num_records:
            yield Problem(
                "error",
                "statistics",
                f"{where}: split {split.name!r}: statistics count {stats.get('num_records')} "
                f"records but the shards hold {split.num_records}",
            )


def _side_file_issue(root: str, what: str, relative: str | None, sha256: str | None) -> str | None:
    """What keeps a text feature's learned file (sentencepiece model, word terms) from
    being used, if anything."""
    if not relative:
        return None
    if not _inside(relative):
        return f"{what} file {relative} leaves the dataset directory"
    try:
        content = filesystems.read_bytes(filesystems.join(root, relative))
    except OSError:
        return f"{what} file {relative} is missing"
    if sha256 and hashlib.sha256(content).hexdigest() != sha256:
        return f"{what} file {relative} does not match its SHA-256"
    return None


def _check_build_logs(root: str, manifest: Manifest) -> Iterator[Problem]:
    """The build's report and logs: present, readable, and counting what the shards hold."""
    report_path = filesystems.join(root, REPORT_FILE)
    report = None
    if not filesystems.exists(report_path):
        yield Problem("error", "report", f"{report_path}: missing")
    else:
        try:
            report = filesystems.read_json(report_path)
        except (OSError, ValueError) as exc:
            yield Problem("error", "report", f"{report_path}: unreadable: {exc}")
    logs = {}
    for name in (QUARANTINE_FILE, DROPPED_FILE):
        try:
            logs[name] = read_entries(filesystems.join(root, name))
        except DatasetError as exc:
            yield Problem("error", "rejects", str(exc))
    if report is None:
        return
    try:
        expected = {
            QUARANTINE_FILE: int(report["records_quarantined"]),
            DROPPED_FILE: int(report["records_dropped"]) + int(report["records_merged"]),
        }
        written = {split: int(count) for split, count in report["records_written"].items()}
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        yield Problem("error", "report", f"{report_path}: not a data report ({exc!r})")
        return
    for name, entries in logs.items():
        if len(entries) != expected[name]:
            yield Problem(
                "error",
                "rejects",
                f"{filesystems.join(root, name)}: {len(entries)} lines, "
                f"{REPORT_FILE} counts {expected[name]}",
            )
    held = {name: split.num_records for name, split in manifest.splits.items()}
    if written != held:
        yield Problem(
            "error",
            "report",
            f"{report_path}: records_written {written} disagrees with the manifest's {held}",
        )


def _feature_spec_issue(spec: FeatureSpec) -> str | None:
    if spec.type not in ("numeric", "categorical", "text", "image"):
        return f"unknown type {spec.type!r}"
    if spec.type == "numeric" and spec.dtype not in ("float32", "int64"):
        return f"unknown dtype {spec.dtype!r}"
    if spec.type == "numeric" and any(dim < 1 for dim in spec.shape):
        return f"invalid shape {list(spec.shape)}"
    if spec.type == "image" and not all(
        isinstance(dim, int) and dim > 0 for dim in (spec.height, spec.width, spec.channels)
    ):
        return "an image needs positive height, width and channels"
    return None


def _verify_shard(
    root: str, manifest: Manifest, split: str, shard: ShardInfo, checker: _ExampleChecker
) -> list[Problem]:
    label = f"{split} shard {shard.path}"
    if not _inside(shard.path):
        return [Problem("error", "shard.path", f"{label}: path leaves the dataset directory")]
    path = filesystems.join(root, shard.path)
    if not filesystems.exists(path) or filesystems.is_folder(path):
        return [Problem("error", "shard.missing", f"{label}: listed in the manifest, not on disk")]
    findings = _Findings(label)
    with filesystems.open_for_read(path) as handle:
        stream = DigestingReader(handle)
        read_error = _read_shard(stream, manifest.compression, checker, findings)
        stream.drain()
    problems = []
    if stream.num_bytes != shard.num_bytes:
        problems.append(
            Problem(
                "error",
                "shard.size",
                f"{label}: {stream.num_bytes} bytes, manifest says {shard.num_bytes}",
            )
        )
    if stream.sha256 != shard.sha256:
        problems.append(
            Problem(
                "error",
                "shard.checksum",
                f"{label}: SHA-256 {stream.sha256} does not match the manifest's {shard.sha256}",
            )
        )
    problems.extend(findings.problems())
    if read_error is not None:
        problems.append(
            Problem(
                "error",
                "shard.unreadable",
                f"{label}: only the first {findings.num_records} records are readable: {read_error}",
            )
        )
    elif findings.num_records != shard.num_records:
        problems.append(
            Problem(
                "error",
                "shard.records",
                f"{label}: holds {findings.num_records} records, manifest says {shard.num_records}",
            )
        )
    return problems


def _read_shard(
    stream: IO[bytes] | DigestingReader,
    compression: str,
    checker: _ExampleChecker,
    findings: _Findings,
) -> str | None:
    """Check every record in batches; why the file breaks off, if it does."""
    batch: list[bytes] = []
    try:
        for record in read_records(stream, compression):
            batch.append(record)
            if len(batch) == READ_BATCH:
                checker.check_batch(batch, findings)
                batch = []
    except CorruptRecordError as exc:
        checker.check_batch(batch, findings)
        return str(exc)
    checker.check_batch(batch, findings)
    return None


class _Findings:
    """A shard's per-record findings, grouped by what is wrong.

    A shard with a million bad records must give a readable report, so each distinct
    finding becomes one problem that names its first few records and counts the rest.
    """

    def __init__(self, label: str) -> None:
        self.label = label
        self.num_records = 0
        self._records: dict[tuple[str, str, str], list[int]] = {}
        self._counts: Counter[tuple[str, str, str]] = Counter()

    def add(self, severity: str, check: str, detail: str, record: int) -> None:
        key = (severity, check, detail)
        self._counts[key] += 1
        listed = self._records.setdefault(key, [])
        if len(listed) < LISTED_RECORDS:
            listed.append(record)

    def problems(self) -> list[Problem]:
        problems = []
        for (severity, check, detail), listed in self._records.items():
            more = self._counts[(severity, check, detail)] - len(listed)
            where = ", ".join(str(index) for index in listed)
            where = f"record {where}" if len(listed) == 1 and not more else f"records {where}"
            if more:
                where += f" and {more} more"
            problems.append(Problem(severity, check, f"{self.label}: {detail} ({where})"))
        return problems


class _ExampleChecker:
    """Holds each record to the encoding contract of ``contracts.features``."""

    def __init__(self, features: Mapping[str, FeatureSpec]) -> None:
        from google.protobuf.message import DecodeError
        from tensorflow.core.example import example_pb2

        self.features = dict(features)
        self.parsing_spec = parsing_spec(self.features)
        self.expected_keys = set(self.parsing_spec)
        self._parse_proto = example_pb2.Example.FromString
        self._decode_error = DecodeError

    def check_batch(self, batch: list[bytes], findings: _Findings) -> None:
        """Check records one by one, then make sure the reader's own parser agrees."""
        import tensorflow as tf

        if not batch:
            return
        first = findings.num_records
        serialized = batch
        found_error = False
        for offset, record in enumerate(serialized):
            for severity, check, detail in self.check(record):
                findings.add(severity, check, detail, first + offset)
                found_error = found_error or severity == "error"
        findings.num_records += len(serialized)
        if found_error:
            return  # the reader would fail for reasons already named
        try:
            tf.io.parse_example(tf.constant(batch, tf.string), self.parsing_spec)
        except tf.errors.OpError as exc:
            findings.add(
                "error", "example.parse", f"tf.io.parse_example fails: {exc.message}", first
            )

    def check(self, serialized: bytes) -> Iterator[tuple[str, str, str]]:
        """(severity, check, detail) for everything wrong with one serialized record."""
        try:
            feature_map = self._parse_proto(serialized).features.feature
        except self._decode_error:
            yield "error", "example.decode", "not a tf.train.Example"
            return
        for key in sorted(set(feature_map) - self.expected_keys):
            yield "warning", "example.unexpected_key", f"key {key!r} is not in the manifest"
        for name, spec in self.features.items():
            if name in feature_map:  # an absent feature is a missing value, read as the default
                for detail in self._check_feature(spec, feature_map[name]):
                    yield "error", "example.feature", f"feature {name!r}: {detail}"

    def _check_feature(self, spec: FeatureSpec, feature: Any) -> Iterator[str]:
        kind = feature.WhichOneof("kind")
        if spec.type == "numeric":
            expected_kind = "int64_list" if spec.dtype == "int64" else "float_list"
            if kind != expected_kind:
                yield f"expected {expected_kind}, found {kind or 'no values'}"
            elif (found := len(getattr(feature, kind).value)) != spec.num_values:
                yield f"expected shape {list(spec.shape)} ({spec.num_values} values), found {found}"
            return
        if kind != "bytes_list" or len(feature.bytes_list.value) != 1:
            found = f"{len(getattr(feature, kind).value)} in {kind}" if kind else "no values"
            yield f"expected exactly one value in bytes_list, found {found}"
            return
        value = feature.bytes_list.value[0]
        if spec.type in ("categorical", "text"):
            try:
                value.decode("utf-8")
            except UnicodeDecodeError:
                yield "value is not valid UTF-8"
        elif spec.type == "image":
            yield from _check_image(spec, value)


def _check_image(spec: FeatureSpec, data: bytes) -> Iterator[str]:
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            width, height = image.size
            channels = _decoded_channels(image)
    except Exception as exc:  # whatever the decoder trips on, a reader would trip on too
        yield f"image does not decode ({type(exc).__name__})"
        return
    if (height, width, channels) != (spec.height, spec.width, spec.channels):
        yield (
            f"expected a {spec.height}x{spec.width}x{spec.channels} image, "
            f"found {height}x{width}x{channels}"
        )


def _decoded_channels(image: Image.Image) -> int:
    """Channels as ``tf.io.decode_image`` returns them: palettes expand to RGB or RGBA."""
    if image.mode == "P":
        return 4 if "transparency" in image.info else 3
    return len(image.getbands())


# --------------------------------------------------------------------------------- drift


def compare_statistics(
    current: Manifest,
    reference: Manifest,
    *,
    split: str = "train",
    thresholds: DriftThresholds = DriftThresholds(),
) -> list[Drift]:
    """Schema differences, then per-feature drift of ``split``, in feature order.

    Raises DatasetError when either manifest lacks usable statistics for ``split``:
    without them there is nothing to compare, which is not the same as "no drift".
    """
    drifts = list(_schema_differences(current.features, reference.features))
    changed = {drift.feature for drift in drifts}
    current_stats = _split_features(current, split, "current")
    reference_stats = _split_features(reference, split, "reference")
    for name, spec in current.features.items():
        if name in changed:
            continue
        for which, stats in (("current", current_stats), ("reference", reference_stats)):
            if not isinstance(stats.get(name), dict):
                raise DatasetError(f"{which} statistics of split {split!r} lack feature {name!r}")
        try:
            drifts.extend(
                _feature_drift(spec, current_stats[name], reference_stats[name], thresholds)
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise DatasetError(
                f"statistics of feature {name!r} in split {split!r} are malformed: {exc!r}"
            ) from None
    return drifts


def _split_features(manifest: Manifest, split: str, which: str) -> dict[str, Any]:
    stats = manifest.statistics.get(split)
    features = stats.get("features") if isinstance(stats, dict) else None
    if not isinstance(features, dict):
        raise DatasetError(
            f"the {which} dataset {manifest.name!r} has no statistics for split {split!r}"
        )
    return features


def _describe(spec: FeatureSpec) -> str:
    if spec.type == "numeric":
        return f"numeric {spec.dtype} {list(spec.shape)}"
    if spec.type == "image":
        return f"image {spec.height}x{spec.width}x{spec.channels}"
    return spec.type


def _schema_differences(
    current: Mapping[str, FeatureSpec], reference: Mapping[str, FeatureSpec]
) -> Iterator[Drift]:
    for name, spec in current.items():
        if name not in reference:
            yield Drift(name, "schema.added", None, None, "not in the reference schema", "error")
        elif (now := _describe(spec)) != (before := _describe(reference[name])):
            yield Drift(name, "schema.changed", None, None, f"{before} -> {now}", "error")
    for name in reference:
        if name not in current:
            yield Drift(name, "schema.removed", None, None, "in the reference schema only", "error")


def _feature_drift(
    spec: FeatureSpec, current: Mapping[str, Any], reference: Mapping[str, Any], t: DriftThresholds
) -> Iterator[Drift]:
    name = spec.name
    if (current["count"] == 0) != (reference["count"] == 0):
        now, before = ("no", "some") if current["count"] == 0 else ("some", "no")
        yield Drift(name, "presence", None, None, f"{now} values now, {before} in the reference")
        return
    if current["count"] == 0:
        return
    if spec.type == "numeric":
        yield from _numeric_drift(name, current, reference, t)
    elif spec.type == "categorical":
        yield from _categorical_drift(name, current, reference, t)
    elif spec.type == "text":
        for key, unit in (("length_quantiles", "characters"), ("token_quantiles", "tokens")):
            yield from _median_drift(name, unit, current[key]["p50"], reference[key]["p50"], t)


def _numeric_drift(
    name: str, current: Mapping[str, Any], reference: Mapping[str, Any], t: DriftThresholds
) -> Iterator[Drift]:
    mean, ref_mean = current["mean"], reference["mean"]
    std, ref_std = current["std"], reference["std"]
    if None in (mean, ref_mean, std, ref_std):
        return  # only non-finite values on one side: nothing to measure
    shift = _ratio(abs(mean - ref_mean), ref_std)
    if shift > t.numeric_std:
        yield Drift(
            name,
            "numeric.mean_shift",
            shift,
            t.numeric_std,
            f"mean {ref_mean:.6g} -> {mean:.6g}: {shift:.3g} reference standard deviations",
        )
    ratio = 1.0 if std == ref_std else _ratio(std, ref_std)
    spread = max(ratio, _ratio(1.0, ratio))
    if spread > t.std_ratio:
        yield Drift(
            name, "numeric.std_ratio", ratio, t.std_ratio, f"std {ref_std:.6g} -> {std:.6g}"
        )


def _ratio(numerator: float, denominator: float) -> float:
    """A shift measured in units of ``denominator``: 0 / 0 is no shift, x / 0 is infinite."""
    if numerator == 0:
        return 0.0
    return numerator / denominator if denominator else math.inf


def _median_drift(
    name: str, unit: str, median: int | None, ref_median: int | None, t: DriftThresholds
) -> Iterator[Drift]:
    if median is None or ref_median is None:
        return
    shift = _ratio(abs(median - ref_median), ref_median)
    if shift > t.text_median:
        yield Drift(
            name,
            f"text.median_{unit}",
            shift,
            t.text_median,
            f"median length {ref_median} -> {median} {unit}",
        )


def _normalised(stats: Mapping[str, Any]) -> tuple[dict[str, float], float, bool]:
    """Value shares, the share of values the output did not list, and whether it is complete."""
    total = stats["count"]
    frequencies = stats["frequencies"]
    listed = sum(frequencies.values())
    shares = {value: count / total for value, count in frequencies.items()}
    return shares, (total - listed) / total, stats["num_distinct"] == len(frequencies)


def jensen_shannon(p: Mapping[Any, float], q: Mapping[Any, float]) -> float:
    """Jensen-Shannon divergence in bits (0 = identical, 1 = disjoint)."""
    divergence = 0.0
    for key in sorted(p.keys() | q.keys(), key=repr):
        a, b = p.get(key, 0.0), q.get(key, 0.0)
        middle = (a + b) / 2
        if a > 0:
            divergence += a / 2 * math.log2(a / middle)
        if b > 0:
            divergence += b / 2 * math.log2(b / middle)
    return min(1.0, max(0.0, divergence))


def _categorical_drift(
    name: str, current: Mapping[str, Any], reference: Mapping[str, Any], t: DriftThresholds
) -> Iterator[Drift]:
    shares, other, complete = _normalised(current)
    ref_shares, ref_other, ref_complete = _normalised(reference)
    values = sorted(shares.keys() | ref_shares.keys())
    linf, worst = max(
        ((abs(shares.get(v, 0.0) - ref_shares.get(v, 0.0)), v) for v in values),
        key=lambda item: item[0],
    )
    # Values past the listed most frequent ones are pooled, so both sides still sum to 1.
    js = jensen_shannon({**shares, (): other}, {**ref_shares, (): ref_other})
    if linf > t.categorical_linf:
        yield Drift(
            name,
            "categorical.linf",
            linf,
            t.categorical_linf,
            f"share of {worst!r} {ref_shares.get(worst, 0.0):.1%} -> {shares.get(worst, 0.0):.1%}"
            f" (Jensen-Shannon divergence {js:.3f})",
        )
    if t.categorical_js is not None and js > t.categorical_js:
        yield Drift(
            name, "categorical.js", js, t.categorical_js, f"Jensen-Shannon divergence {js:.3f}"
        )
    # "New" and "gone" are only certain when the other side listed every value it saw.
    if ref_complete:
        new = [value for value in shares if value not in ref_shares]
        yield from _category_set_drift(
            name, "categorical.new_values", new, shares, t.new_category_mass, "not in the reference"
        )
    if complete:
        gone = [value for value in ref_shares if value not in shares]
        yield from _category_set_drift(
            name,
            "categorical.missing_values",
            gone,
            ref_shares,
            t.missing_category_mass,
            "in the reference only",
        )


def _category_set_drift(
    name: str,
    check: str,
    values: list[str],
    shares: Mapping[str, float],
    threshold: float,
    what: str,
) -> Iterator[Drift]:
    mass = sum(shares[value] for value in values)
    if values and mass > threshold:
        named = ", ".join(repr(value) for value in sorted(values)[:LISTED_VALUES])
        if len(values) > LISTED_VALUES:
            named += ", …"
        count = f"{len(values)} value{'' if len(values) == 1 else 's'}"
        yield Drift(
            name, check, mass, threshold, f"{count} {what} ({named}): {mass:.1%} of records"
        )


# ---------------------------------------------------------------------------- validation


def validate_dataset(
    dataset_dir: str | Path,
    reference_dir: str | Path | None = None,
    *,
    split: str = "train",
    thresholds: DriftThresholds = DriftThresholds(),
) -> ValidationReport:
    """Verify a dataset and, given a reference dataset, check ``split`` for drift."""
    manifest, problems = _verify(os.fspath(dataset_dir))
    report = ValidationReport(
        dataset_dir=str(dataset_dir),
        reference_dir=None if reference_dir is None else str(reference_dir),
        split=split,
        problems=problems,
    )
    if manifest is None:
        report.not_datasets.append(str(dataset_dir))
    if reference_dir is None or manifest is None:
        return report
    try:
        reference = read_manifest(reference_dir)
    except DatasetError as exc:
        report.not_datasets.append(str(reference_dir))
        report.problems.append(
            Problem("error", "drift", f"cannot compare with the reference: {exc}")
        )
        return report
    try:
        report.drifts = compare_statistics(manifest, reference, split=split, thresholds=thresholds)
    except DatasetError as exc:
        report.problems.append(
            Problem("error", "drift", f"cannot compare with the reference: {exc}")
        )
    return report


_SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "drift": "magenta"}


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def render_report(report: ValidationReport) -> RenderableType:
    """The report as a person reads it in a terminal: a verdict, then one table per kind."""
    parts: list[RenderableType] = []
    verdict = Text()
    if report.ok:
        verdict.append("PASSED", style="bold green")
    else:
        verdict.append("FAILED", style="bold red")
    verdict.append(
        f"  {report.dataset_dir}: {len(report.errors)} errors, {len(report.warnings)} warnings"
    )
    if report.reference_dir is not None:
        verdict.append(
            f", {len(report.drifts)} drifts in split {report.split!r} "
            f"against {report.reference_dir}"
        )
    parts.append(verdict)
    if report.problems:
        table = Table(title="Problems", title_justify="left", show_lines=False)
        table.add_column("severity")
        table.add_column("check")
        table.add_column("message", overflow="fold")
        for problem in report.problems:
            style = _SEVERITY_STYLE[problem.severity]
            table.add_row(Text(problem.severity, style=style), problem.check, problem.message)
        parts.append(table)
    if report.drifts:
        table = Table(title=f"Drift ({report.split})", title_justify="left")
        table.add_column("feature")
        table.add_column("check")
        table.add_column("value", justify="right")
        table.add_column("threshold", justify="right")
        table.add_column("detail", overflow="fold")
        for drift in report.drifts:
            table.add_row(
                Text(drift.feature, style=_SEVERITY_STYLE[drift.severity]),
                drift.check,
                _number(drift.value),
                _number(drift.threshold),
                drift.message,
            )
        parts.append(table)
    return Group(*parts)
