"""``build_dataset``: the whole dataset build as one Apache Beam pipeline.

read -> conform to schema -> clean (normalise, required, length, PII) -> exact and
near de-duplication -> deterministic split -> subword vocabulary from the training
split -> token ids -> statistics, categories and shards.

The build writes into a staging directory beside the destination and renames it into
place only when everything succeeded, so a failed or interrupted build never leaves
a directory that looks like a dataset, and an existing dataset is replaced only when
asked to (``overwrite``), by a rename.
"""

from __future__ import annotations

import json
import re
import shutil
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from contracts.atomic_files import write_json_atomically
from contracts.dataset_manifest import (
    MANIFEST_FILE,
    DatasetExistsError,
    Manifest,
    ShardInfo,
    SplitInfo,
    write_manifest,
)
from contracts.features import FeatureSpec
from contracts.yaml_config import ConfigError
from research.data import records
from research.data.categories import CategoryVocabularies
from research.data.clean import CleanRecords
from research.data.dedup import DeduplicateExact, DeduplicateNear
from research.data.report import REPORT_FILE, build_report
from research.data.schema import ConformToSchema, resolve_schema
from research.data.shards import WriteShards, shard_file_name, write_shard
from research.data.sources import ReadSources, check_sources
from research.data.spec import DatasetSpec, FieldSchema
from research.data.split import SPLIT, AssignSplit
from research.data.stats import ComputeStatistics, empty_statistics
from research.data.vocab import FieldVocabularies, TokenizeRecords

IN_PROCESS_RUNNER = "apache_beam.runners.portability.fn_api_runner.FnApiRunner"
QUARANTINE_FILE = "quarantine.jsonl"
VOCAB_DIR = "vocab"
_BUILD_DIR = "_build"


@dataclass(frozen=True)
class BuildResult:
    output_dir: Path
    manifest: Manifest
    report: dict[str, Any]


def feature_specs(spec: DatasetSpec, schema: dict[str, FieldSchema]) -> dict[str, FeatureSpec]:
    """The manifest's features before the build fills in vocabularies."""
    return {
        name: FeatureSpec(
            name=name,
            type=field.type,
            dtype=field.dtype,
            shape=tuple(field.shape),
            height=field.height,
            width=field.width,
            channels=field.channels,
            is_label=name in spec.labels,
        )
        for name, field in schema.items()
    }


def required_fields(spec: DatasetSpec, schema: dict[str, FieldSchema]) -> list[str]:
    """Declared required fields plus labels and images, without which a record is useless."""
    implied = [name for name, field in schema.items() if field.type == "image"]
    ordered = [*spec.clean.required, *spec.labels, *implied]
    return list(dict.fromkeys(ordered))


def vocab_fields(spec: DatasetSpec, schema: dict[str, FieldSchema]) -> list[str]:
    if spec.vocab.fields is not None:
        return list(spec.vocab.fields)
    return [name for name, field in schema.items() if field.type == "text"]


def _input_order(entry: dict[str, str]) -> tuple[Any, ...]:
    parts = re.split(r"(\d+)", entry["origin"])
    natural = [int(part) if index % 2 else part for index, part in enumerate(parts)]
    return natural, entry["stage"], entry["reason"]


def write_quarantine(entries: list[dict[str, str]], path: str) -> str:
    """Quarantined inputs in input order (file, then line), whatever order bundles ran in.

    The list is held by one worker; each entry's raw text is capped (records.quarantine_entry).
    """
    with open(path, "w", encoding="utf-8") as handle:
        for entry in sorted(entries, key=_input_order):
            handle.write(json.dumps(entry, ensure_ascii=False) + "\n")
    return path


def _write_json(path: str) -> Any:
    def write(value: Any) -> str:
        write_json_atomically(path, value)
        return path

    return beam.Map(write)


def _save_vocabulary(directory: str) -> Any:
    def save(item: tuple[str, Any]) -> str:
        field, vocabulary = item
        path = str(Path(directory) / f"{field}.json")
        vocabulary.save(path)
        return path

    return beam.Map(save)


def construct_pipeline(
    pipeline: beam.Pipeline,
    spec: DatasetSpec,
    schema: dict[str, FieldSchema],
    features: dict[str, FeatureSpec],
    staging: Path,
) -> None:
    """Lay the build's transforms onto ``pipeline``; results land in ``staging``."""
    build_dir = staging / _BUILD_DIR
    read = pipeline | "Read" >> ReadSources(spec)
    conformed = read.records | "Conform" >> ConformToSchema(schema)
    quarantine = (
        read[records.QUARANTINE_TAG],
        conformed[records.QUARANTINE_TAG],
    ) | "AllQuarantine" >> beam.Flatten()
    (
        quarantine
        | "QuarantineList" >> beam.combiners.ToList()
        | "WriteQuarantine" >> beam.Map(write_quarantine, str(staging / QUARANTINE_FILE))
    )

    clean = conformed.records | "Clean" >> CleanRecords(
        spec.clean, schema, required_fields(spec, schema)
    )
    unique = clean
    if spec.dedup.exact.enabled:
        unique = unique | "ExactDedup" >> DeduplicateExact(spec.dedup.exact.fields)
    if spec.dedup.near is not None:
        unique = unique | "NearDedup" >> DeduplicateNear(spec.dedup.near)
    tagged = unique | "Split" >> AssignSplit(spec.split)

    text_fields = vocab_fields(spec, schema)
    train_split = "train" if "train" in spec.split.ratios else next(iter(spec.split.ratios))
    if text_fields:
        training = tagged | "TrainingRecords" >> beam.Filter(lambda r: r[SPLIT] == train_split)
        vocabularies = training | "Vocabularies" >> FieldVocabularies(
            text_fields,
            size=spec.vocab.size,
            min_frequency=spec.vocab.min_frequency,
            lowercase=spec.vocab.lowercase,
        )
        _ = vocabularies | "SaveVocabularies" >> _save_vocabulary(str(staging / VOCAB_DIR))
        tagged = tagged | "Tokenize" >> TokenizeRecords(
            text_fields, beam.pvalue.AsDict(vocabularies)
        )

    (
        tagged
        | "KeyBySplit" >> beam.Map(lambda record: (record[SPLIT], record))
        | "Statistics" >> ComputeStatistics(features)
        | "StatisticsDict" >> beam.combiners.ToDict()
        | "WriteStatistics" >> _write_json(str(build_dir / "statistics.json"))
    )
    categorical = [n for n, f in features.items() if f.type == "categorical" and not f.is_label]
    labels = [n for n, f in features.items() if f.type == "categorical" and f.is_label]
    (
        tagged
        | "Categories" >> CategoryVocabularies(categorical, labels, train_split)
        | "WriteCategories" >> _write_json(str(build_dir / "categories.json"))
    )
    shards = {split: spec.output.shards_for(split) for split in spec.split.ratios}
    (
        tagged
        | "Shards" >> WriteShards(staging, features, shards, spec.output.compression)
        | "ShardList" >> beam.combiners.ToList()
        | "WriteShardList" >> _write_json(str(build_dir / "shards.json"))
    )


def _counters(result: beam.runners.runner.PipelineResult) -> dict[str, int]:
    query = result.metrics().query(
        beam.metrics.MetricsFilter().with_namespace(records.METRICS_NAMESPACE)
    )
    totals: dict[str, int] = {}
    for counter in query["counters"]:
        value = counter.committed if counter.committed is not None else counter.attempted
        totals[counter.key.metric.name] = totals.get(counter.key.metric.name, 0) + int(value or 0)
    return totals


def _read_json(path: Path, default: Any) -> Any:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else default


def _collect_splits(
    spec: DatasetSpec, staging: Path, written: list[list[Any]]
) -> dict[str, SplitInfo]:
    """Shard infos per split, adding empty shards so every split has all its files."""
    by_name = {info["path"]: ShardInfo(**info) for _, info in written}
    splits: dict[str, SplitInfo] = {}
    for split in spec.split.ratios:
        count = spec.output.shards_for(split)
        shards = []
        for index in range(count):
            name = shard_file_name(split, index, count, spec.output.compression)
            info = by_name.get(name) or write_shard(staging, name, [], spec.output.compression)
            shards.append(info)
        splits[split] = SplitInfo(name=split, shards=tuple(shards))
    return splits


def _finish_features(
    features: dict[str, FeatureSpec], staging: Path, categories: dict[str, list[str]]
) -> dict[str, FeatureSpec]:
    from dataclasses import replace

    from research.data.vocab import Vocabulary

    finished = {}
    for name, feature in features.items():
        if feature.type == "categorical":
            feature = replace(feature, vocabulary=tuple(categories.get(name, ())))
        elif feature.type == "text":
            path = staging / VOCAB_DIR / f"{name}.json"
            if path.exists():
                feature = replace(
                    feature,
                    vocabulary_file=f"{VOCAB_DIR}/{name}.json",
                    vocab_size=Vocabulary.load(path).size,
                )
        finished[name] = feature
    return finished


def check_destination(output_dir: Path, overwrite: bool) -> None:
    """Replace only what a build made: a dataset directory, or an empty one."""
    if not output_dir.exists():
        return
    if not overwrite:
        raise DatasetExistsError(f"{output_dir} exists; pass --overwrite to replace it")
    empty = output_dir.is_dir() and not any(output_dir.iterdir())
    if not empty and not (output_dir / MANIFEST_FILE).is_file():
        raise DatasetExistsError(
            f"{output_dir} is not a dataset (no {MANIFEST_FILE}); refusing to replace it"
        )


def _publish(staging: Path, output_dir: Path, overwrite: bool) -> None:
    """Rename the finished staging directory into place (replacing only with overwrite)."""
    check_destination(output_dir, overwrite)
    if output_dir.exists():
        retired = output_dir.with_name(f".{output_dir.name}.replaced-{uuid.uuid4().hex[:8]}")
        output_dir.rename(retired)
        staging.rename(output_dir)
        shutil.rmtree(retired, ignore_errors=True)
    else:
        staging.rename(output_dir)


def pipeline_options(beam_args: list[str] | None) -> PipelineOptions:
    """Beam options from the command line; the in-process runner unless one is named."""
    options = PipelineOptions(beam_args or [])
    standard = options.view_as(StandardOptions)
    if not standard.runner:
        standard.runner = IN_PROCESS_RUNNER
    return options


def build_dataset(
    spec: DatasetSpec,
    output_dir: str | Path,
    *,
    overwrite: bool = False,
    beam_args: list[str] | None = None,
) -> BuildResult:
    """Build the dataset ``spec`` describes into ``output_dir`` (see module docstring)."""
    output_dir = Path(output_dir).resolve()
    check_destination(output_dir, overwrite)
    check_sources(spec)
    schema = resolve_schema(spec)
    features = feature_specs(spec, schema)

    try:
        pipeline = beam.Pipeline(options=pipeline_options(beam_args))
    except ValueError as exc:
        raise ConfigError(f"Beam options: {exc}") from None

    output_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = output_dir.with_name(f".{output_dir.name}.building-{uuid.uuid4().hex[:8]}")
    (staging / _BUILD_DIR).mkdir(parents=True)
    (staging / VOCAB_DIR).mkdir()
    try:
        construct_pipeline(pipeline, spec, schema, features, staging)
        result = pipeline.run()
        result.wait_until_finish()

        build_dir = staging / _BUILD_DIR
        splits = _collect_splits(spec, staging, _read_json(build_dir / "shards.json", []))
        statistics = _read_json(build_dir / "statistics.json", {})
        categories = _read_json(build_dir / "categories.json", {})
        features = _finish_features(features, staging, categories)
        manifest = Manifest(
            name=spec.name,
            spec_hash=spec.spec_hash(),
            compression=spec.output.compression,
            features=features,
            labels=list(spec.labels),
            splits=splits,
            statistics={
                split: statistics.get(split) or empty_statistics(features) for split in splits
            },
            vocabularies={
                name: feature.vocabulary_file
                for name, feature in features.items()
                if feature.vocabulary_file
            },
            created=datetime.now(UTC).isoformat(timespec="seconds"),
            provenance={"spec": spec.model_dump(mode="json", by_alias=True)},
        )
        report = build_report(
            _counters(result), {name: split.num_records for name, split in splits.items()}
        )
        shutil.rmtree(build_dir)
        if not any((staging / VOCAB_DIR).iterdir()):
            (staging / VOCAB_DIR).rmdir()
        write_json_atomically(staging / REPORT_FILE, report)
        write_manifest(staging, manifest)
        _publish(staging, output_dir, overwrite)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return BuildResult(output_dir=output_dir, manifest=manifest, report=report)
