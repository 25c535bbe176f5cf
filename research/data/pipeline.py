"""``build_dataset``: the whole dataset build as one Apache Beam pipeline.

read -> conform to schema -> clean (normalise, required, length, PII) -> exact and
near de-duplication -> deterministic split -> a sentencepiece model per text field from the
training split -> statistics (token counts with those models), categories and shards.

The build writes into a staging directory beside the destination and renames it into
place only when everything succeeded and the result passed research.data.quality's
checks (complete, no empty split, bounded loss), so a failed, interrupted or refused
build never leaves a directory that looks like a dataset, and an existing dataset is
replaced only when asked to (``overwrite``), by a rename.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import apache_beam as beam

from contracts.dataset_manifest import MANIFEST_FILE, Manifest, ShardInfo, SplitInfo
from contracts.features import FeatureSpec
from contracts.yaml_config import ConfigError
from research.data import filesystems, publish, records
from research.data.categories import CategoryVocabularies
from research.data.category_checks import category_findings
from research.data.category_merge import MergeCategorySpellings, merge_notes
from research.data.clean import STRING_TYPES, CleanRecords
from research.data.dedup import DeduplicateExact, DeduplicateNear
from research.data.quality import (
    BuildRejectedError,
    check_build,
    judge_categories,
    read_side_file,
    require_side_file,
)
from research.data.records import DROPPED_TAG
from research.data.rejects import DROPPED_FILE, QUARANTINE_FILE, WriteRejects, pii_mask
from research.data.report import REPORT_FILE, build_report
from research.data.runners import pipeline_options
from research.data.schema import ConformToSchema, resolve_schema
from research.data.shards import WriteShards, shard_file_name, write_shard
from research.data.sources import ReadSources, check_sources, source_notes
from research.data.spec import DatasetSpec, FieldSchema, WordsSpec
from research.data.split import SPLIT, AssignSplit
from research.data.stats import ComputeStatistics, empty_statistics
from research.data.tokenizer import (
    CountTokens,
    LearnTokenizers,
    save_field_files,
    tokenizer_path,
    vocab_size,
)
from research.data.words import LearnWordBags, words_fields, words_path

_BUILD_DIR = "_build"


@dataclass(frozen=True)
class BuildResult:
    output_dir: str  # a local path, or a URI (``gs://…``)
    manifest: Manifest
    report: dict[str, Any]


def feature_specs(
    spec: DatasetSpec, schema: dict[str, FieldSchema], columns: dict[str, str] | None = None
) -> dict[str, FeatureSpec]:
    """The manifest's features before the build fills in vocabularies and tokenizers.

    ``columns`` maps a feature named otherwise than its source column to that column.
    String features record how cleaning normalized them, which serving repeats.
    """
    form = spec.clean.unicode_normalization
    strings = {
        "normalization": None if form == "none" else form,
        "collapse_whitespace": spec.clean.collapse_whitespace,
    }
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
            source_name=(columns or {}).get(name),
            clip=field.clip,
            transform=field.transform,
            **(strings if field.type in STRING_TYPES else {}),
        )
        for name, field in schema.items()
    }


def required_fields(spec: DatasetSpec, schema: dict[str, FieldSchema]) -> list[str]:
    """Declared required fields plus labels and images, without which a record is useless."""
    implied = [name for name, field in schema.items() if field.type == "image"]
    ordered = [*spec.clean.required, *spec.labels, *implied]
    return list(dict.fromkeys(ordered))


def vocab_fields(spec: DatasetSpec, schema: dict[str, FieldSchema]) -> list[str]:
    """The text fields that get a sentencepiece model: those named, else every text field
    that models do not read as a bag of words."""
    if spec.vocab.fields is not None:
        return list(spec.vocab.fields)
    return [name for name, field in schema.items() if field.type == "text" and not field.words]


MERGES_FILE = "category_merges.json"  # in the build directory: the spellings merged


def training_split(spec: DatasetSpec) -> str:
    """The split tokenizers and category vocabularies are learned from."""
    return "train" if "train" in spec.split.ratios else next(iter(spec.split.ratios))


def _write_json(path: str) -> Any:
    def write(value: Any) -> str:
        filesystems.write_json(path, value)
        return path

    return beam.Map(write)


def construct_pipeline(
    pipeline: beam.Pipeline,
    spec: DatasetSpec,
    schema: dict[str, FieldSchema],
    features: dict[str, FeatureSpec],
    staging: str,
    columns: dict[str, str] | None = None,
) -> None:
    """Lay the build's transforms onto ``pipeline``; results land in ``staging``.

    ``columns``: ``ResolvedSchema.columns``, the source column of each renamed field.
    """
    build_dir = filesystems.join(staging, _BUILD_DIR)
    # Workers' unfinished files; removed with build_dir, so they never reach the dataset.
    scratch = filesystems.join(build_dir, "tmp")
    read = pipeline | "Read" >> ReadSources(spec)
    conformed = read.records | "Conform" >> ConformToSchema(schema, columns)
    quarantine = (
        read[records.QUARANTINE_TAG],
        conformed[records.QUARANTINE_TAG],
    ) | "AllQuarantine" >> beam.Flatten()
    _ = quarantine | "WriteQuarantine" >> WriteRejects(
        filesystems.join(staging, QUARANTINE_FILE), scratch, pii_mask(spec.clean, schema, columns)
    )

    read_records = conformed.records
    if spec.quality.category_variants == "merge":
        merge = MergeCategorySpellings(
            [name for name, field in features.items() if field.type == "categorical"]
        )
        read_records = read_records | "MergeCategorySpellings" >> merge
        _ = (
            merge.merges
            | "MergeRows" >> beam.Map(lambda m: [m[0][0], m[0][1], m[1][0], m[1][1]])
            | "MergeList" >> beam.combiners.ToList()
            | "WriteMerges" >> _write_json(filesystems.join(build_dir, MERGES_FILE))
        )

    # Each stage that removes records sends them to its ``dropped`` output.
    stages = [("Clean", CleanRecords(spec.clean, schema, required_fields(spec, schema)))]
    if spec.dedup.exact.enabled:
        stages.append(("ExactDedup", DeduplicateExact(spec.dedup.exact.fields, temp_dir=scratch)))
    if spec.dedup.near is not None:
        stages.append(("NearDedup", DeduplicateNear(spec.dedup.near, temp_dir=scratch)))
    unique, dropped = read_records, []
    for label, transform in stages:
        outputs = unique | label >> transform
        unique = outputs.records
        dropped.append(outputs[DROPPED_TAG])
    (
        tuple(dropped)
        | "AllDropped" >> beam.Flatten()
        | "WriteDropped" >> WriteRejects(filesystems.join(staging, DROPPED_FILE), scratch)
    )
    tagged = unique | "Split" >> AssignSplit(spec.split)

    text_fields = vocab_fields(spec, schema)
    bag_fields = words_fields(schema)
    train_split = training_split(spec)
    if text_fields or bag_fields:
        training = tagged | "TrainingRecords" >> beam.Filter(lambda r: r[SPLIT] == train_split)
    if bag_fields:
        bags = training | "WordBags" >> LearnWordBags(bag_fields)
        _ = bags | "SaveWordBags" >> save_field_files(staging, scratch, words_path)
    if text_fields:
        models = training | "Tokenizers" >> LearnTokenizers(text_fields, spec.vocab)
        _ = models | "SaveTokenizers" >> save_field_files(staging, scratch)
        tagged = tagged | "CountTokens" >> CountTokens(text_fields, beam.pvalue.AsDict(models))

    (
        tagged
        | "KeyBySplit" >> beam.Map(lambda record: (record[SPLIT], record))
        | "Statistics" >> ComputeStatistics(features)
        | "StatisticsDict" >> beam.combiners.ToDict()
        | "WriteStatistics" >> _write_json(filesystems.join(build_dir, "statistics.json"))
    )
    categorical = [n for n, f in features.items() if f.type == "categorical" and not f.is_label]
    labels = [n for n, f in features.items() if f.type == "categorical" and f.is_label]
    (
        tagged
        | "Categories" >> CategoryVocabularies(categorical, labels, train_split)
        | "WriteCategories" >> _write_json(filesystems.join(build_dir, "categories.json"))
    )
    shards = {split: spec.output.shards_for(split) for split in spec.split.ratios}
    (
        tagged
        | "Shards" >> WriteShards(staging, features, shards, spec.output.compression, scratch)
        | "ShardList" >> beam.combiners.ToList()
        | "WriteShardList" >> _write_json(filesystems.join(build_dir, "shards.json"))
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


def _collect_splits(
    spec: DatasetSpec, staging: str, written: list[list[Any]]
) -> dict[str, SplitInfo]:
    """Shard infos per split, adding empty shards so every split has all its files."""
    by_name = {info["path"]: ShardInfo(**info) for _, info in written}
    for name in by_name:
        require_side_file(filesystems.join(staging, name))
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
    features: dict[str, FeatureSpec],
    staging: str,
    categories: dict[str, list[str]],
    text_fields: list[str],
    bag_fields: dict[str, WordsSpec],
    training_texts: dict[str, int],
) -> dict[str, FeatureSpec]:
    """Features with their category vocabularies, tokenizers and word terms filled in.

    ``training_texts``: text field -> how many texts the training split holds.
    """
    from dataclasses import replace

    def learned(name: str, relative: str, what: str, scarce: str | None = None) -> bytes:
        """The file the build learned; ``scarce``: why there is none despite texts."""
        path = filesystems.join(staging, *relative.split("/"))
        if not filesystems.exists(path):
            if not training_texts.get(name):
                raise BuildRejectedError(
                    f"text field {name!r}: the training split holds no text to learn its "
                    f"{what} from"
                )
            if scarce:
                raise BuildRejectedError(f"text field {name!r}: {scarce}")
        return filesystems.read_bytes(require_side_file(path))

    finished = {}
    for name, feature in features.items():
        if feature.type == "categorical":
            feature = replace(feature, vocabulary=tuple(categories.get(name, ())))
        if name in text_fields:
            model = learned(name, tokenizer_path(name), "tokenizer")
            feature = replace(
                feature,
                tokenizer_file=tokenizer_path(name),
                tokenizer_sha256=hashlib.sha256(model).hexdigest(),
                vocab_size=vocab_size(model),
            )
        if name in bag_fields:
            scarce = (
                f"no term is in {bag_fields[name].min_documents} or more training texts "
                "(words.min_documents)"
            )
            terms = learned(name, words_path(name), "word terms", scarce)
            feature = replace(
                feature,
                words_file=words_path(name),
                words_sha256=hashlib.sha256(terms).hexdigest(),
                words_size=len(json.loads(terms)["terms"]),
            )
        finished[name] = feature
    return finished


def build_dataset(
    spec: DatasetSpec,
    output_dir: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    beam_args: list[str] | None = None,
) -> BuildResult:
    """Build the dataset ``spec`` describes into ``output_dir`` (see module docstring).

    ``output_dir``: a local path, or a URI of any filesystem Beam has installed.
    """
    destination = publish.absolute(output_dir)
    publish.check_destination(destination, overwrite)
    check_sources(spec)
    as_written = spec
    resolved = resolve_schema(spec)
    spec, schema = resolved.spec, resolved.fields  # fields go by their feature names from here
    features = feature_specs(spec, schema, resolved.columns)

    try:
        pipeline = beam.Pipeline(options=pipeline_options(beam_args))
    except ValueError as exc:
        raise ConfigError(f"Beam options: {exc}") from None

    with publish.staging_area(destination) as staging:
        try:
            construct_pipeline(pipeline, spec, schema, features, staging, resolved.columns)
            result = pipeline.run()
            result.wait_until_finish()

            build_dir = filesystems.join(staging, _BUILD_DIR)
            shards = read_side_file(filesystems.join(build_dir, "shards.json"))
            splits = _collect_splits(spec, staging, shards)
            statistics = read_side_file(filesystems.join(build_dir, "statistics.json"))
            categories = read_side_file(filesystems.join(build_dir, "categories.json"))
            report = build_report(
                _counters(result),
                {name: split.num_records for name, split in splits.items()},
                spec.quality,
            )
            report["schema"] = resolved.report()
            report["notes"] = source_notes(spec)
            if spec.quality.category_variants == "merge":
                merges = read_side_file(filesystems.join(build_dir, MERGES_FILE)) or []
                report["merged_categories"] = merge_notes(merges)
            judge_categories(
                report,
                *category_findings(
                    statistics,
                    [name for name, f in features.items() if f.type == "categorical"],
                    spec.labels,
                    spec.quality.min_class_records,
                ),
                spec.quality,
            )
            check_build(report, staging, destination)
            train_stats = (statistics.get(training_split(spec)) or {}).get("features", {})
            features = _finish_features(
                features,
                staging,
                categories,
                vocab_fields(spec, schema),
                words_fields(schema),
                {name: (stats or {}).get("count", 0) for name, stats in train_stats.items()},
            )
            manifest = Manifest(
                name=spec.name,
                spec_hash=as_written.spec_hash(),
                compression=spec.output.compression,
                features=features,
                labels=list(spec.labels),
                splits=splits,
                statistics={
                    split: statistics.get(split) or empty_statistics(features) for split in splits
                },
                vocabularies={
                    name: feature.tokenizer_file
                    for name, feature in features.items()
                    if feature.tokenizer_file
                },
                created=datetime.now(UTC).isoformat(timespec="seconds"),
                provenance={"spec": as_written.model_dump(mode="json", by_alias=True)},
            )
            filesystems.delete_tree(build_dir)
            filesystems.write_json(filesystems.join(staging, REPORT_FILE), report)
            filesystems.write_json(filesystems.join(staging, MANIFEST_FILE), manifest.to_json())
            publish.publish(staging, destination, overwrite)
        except BaseException:
            filesystems.delete_tree(staging)
            raise
    return BuildResult(output_dir=destination, manifest=manifest, report=report)
