"""``slipway data build|validate|show``: dataset commands for researchers."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from contracts.dataset_manifest import DatasetError
from contracts.yaml_config import ConfigError

USER_ERRORS = (ConfigError, DatasetError)
EXIT_BUILT = 0
EXIT_REFUSED = 3  # 2, a usage or input error, is slipway's for every command
EXIT_VALID, EXIT_INVALID, EXIT_NOT_A_DATASET = 0, 1, 2  # of ``data validate``

console = Console()
errors = Console(stderr=True)


def register(subparsers: argparse._SubParsersAction) -> None:
    data = subparsers.add_parser("data", help="build, validate and inspect datasets")
    commands = data.add_subparsers(dest="data_command", metavar="COMMAND", required=True)

    build = commands.add_parser(
        "build",
        help="build TFRecord shards + manifest from a dataset spec (Apache Beam)",
        description="Build a dataset. Options this command does not know (e.g. --runner "
        "FlinkRunner, --flink_master=…) are passed to Apache Beam; the default runner is "
        "Beam's in-process runner. A finished build is published only when every split "
        "holds records and at most quality.max_quarantine_fraction of the input was "
        "quarantined or dropped; otherwise it is discarded and the destination, with any "
        "dataset already there, is left as it was. Exit codes: 0 built; 2 the spec, a "
        "source or the destination is wrong (nothing ran or nothing changed); 3 the build "
        "ran and was refused (an empty split, too much input lost, or output missing).",
    )
    build.add_argument("spec", type=Path, help="dataset spec YAML")
    build.add_argument(
        "-o",
        "--output",
        help="dataset directory, or a URI such as gs://bucket/datasets/name on any "
        "filesystem Beam has installed (default: datasets/<name>)",
    )
    build.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing dataset (a refused build replaces nothing)",
    )
    build.set_defaults(handler=run_build, accepts_extra_args=True)

    validate = commands.add_parser(
        "validate",
        help="verify shards against the manifest; compare statistics with a reference",
        description="Verify a dataset's shards (SHA-256, record counts, schema) against its "
        "manifest, and with --reference flag statistics that drifted from another dataset. "
        "Exit codes: 0 passed, 1 failed, 2 the dataset or the reference is not a dataset "
        "(no readable manifest.json).",
    )
    validate.add_argument(
        "dataset", help="dataset directory (manifest.json + shards), or a URI such as gs://…"
    )
    validate.add_argument(
        "--reference", help="reference dataset (directory or URI) for drift checks"
    )
    validate.add_argument("--split", default="train", help="split compared for drift")
    validate.add_argument("--json", action="store_true", help="print the report as JSON")
    validate.set_defaults(handler=run_validate)

    show = commands.add_parser(
        "show",
        help="summarise a dataset's manifest",
        description="Summarise a dataset: features with their statistics, splits and record counts; with --examples, its first records as stored.",
    )
    show.add_argument(
        "dataset", help="dataset directory (manifest.json + shards), or a URI such as gs://…"
    )
    show.add_argument(
        "--examples",
        type=int,
        default=0,
        metavar="N",
        help="also print the first N records of --split as stored (default 0)",
    )
    show.add_argument(
        "--split", help="the split --examples reads (default: train, else the largest)"
    )
    show.set_defaults(handler=run_show)


def run_build(args: argparse.Namespace) -> int:
    from research.data.pipeline import build_dataset
    from research.data.quality import BuildRejectedError
    from research.data.report import render_report
    from research.data.sources import source_notes
    from research.data.spec import load_spec

    spec = load_spec(args.spec)
    output = args.output or str(Path("datasets") / spec.name)
    started = time.monotonic()
    try:
        for note in source_notes(spec):
            errors.print(f"[yellow]note:[/] {escape(note)}", highlight=False, soft_wrap=True)
        with console.status(f"building dataset [bold]{spec.name}[/] with Apache Beam…"):
            result = build_dataset(
                spec, output, overwrite=args.overwrite, beam_args=args.extra_args
            )
    except ConfigError as exc:
        message = str(exc)
        raise ConfigError(
            message if message.startswith(str(args.spec)) else f"{args.spec}: {message}"
        ) from None
    except BuildRejectedError as exc:
        if exc.report is not None:
            console.print(render_report(exc.report, title=f"{spec.name}: data report"))
        errors.print(f"[bold red]build refused:[/] {escape(str(exc))}", highlight=False)
        return EXIT_REFUSED
    console.print(render_report(result.report, title=f"{spec.name}: data report"))
    for merged in result.report.get("merged_categories", []):
        errors.print(f"[yellow]note:[/] {escape(merged)}", highlight=False, soft_wrap=True)
    for warning in result.report.get("warnings", []):
        errors.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False, soft_wrap=True)
    console.print(
        f"wrote [bold]{result.output_dir}[/] in {time.monotonic() - started:.1f}s "
        f"(spec {result.manifest.spec_hash[:12]})"
    )
    return EXIT_BUILT


def run_validate(args: argparse.Namespace) -> int:
    from research.data.validate import render_report, validate_dataset

    report = validate_dataset(args.dataset, args.reference, split=args.split)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        console.print(render_report(report))
    if report.not_datasets:
        return EXIT_NOT_A_DATASET
    return EXIT_VALID if report.ok else EXIT_INVALID


def run_show(args: argparse.Namespace) -> int:
    from rich.table import Table

    from research.data.show import first_records, statistics_line
    from research.data.validate import read_manifest

    if args.examples < 0:
        raise ConfigError(f"--examples must be 0 or more, got {args.examples}")
    manifest = read_manifest(args.dataset)
    if args.split is not None and args.split not in manifest.splits:
        raise ConfigError(
            f"--split: no split {args.split!r}; the dataset has {list(manifest.splits)}"
        )
    table = Table(title=f"{manifest.name} ({manifest.spec_hash[:12]})")
    table.add_column("feature")
    table.add_column("type")
    table.add_column("details")
    table.add_column(f"statistics ({manifest.statistics_split or 'none'})")
    for name, feature in manifest.features.items():
        details = {
            "numeric": f"{feature.dtype} shape {list(feature.shape)}",
            "categorical": f"{len(feature.vocabulary)} categories",
            "text": f"{feature.words_size} word terms (TF-IDF)"
            if feature.reads_words
            else f"vocabulary {feature.vocab_size or '-'} tokens",
            "image": f"{feature.height}x{feature.width}x{feature.channels}",
        }[feature.type]
        table.add_row(
            name + (" (label)" if feature.is_label else ""),
            feature.type,
            details,
            statistics_line(manifest.feature_statistics(name)),
        )
    console.print(table)
    splits = Table(title="splits")
    splits.add_column("split")
    splits.add_column("records", justify="right")
    splits.add_column("shards", justify="right")
    for name, split in manifest.splits.items():
        splits.add_row(name, f"{split.num_records:,}", str(len(split.shards)))
    console.print(splits)
    split = args.split or manifest.statistics_split
    if args.examples and split:
        examples = Table(title=f"the first {args.examples} records of {split!r}")
        for name in manifest.features:
            examples.add_column(name, overflow="fold")
        for record in first_records(args.dataset, manifest, split, args.examples):
            examples.add_row(*record.values())
        console.print(examples)
    return 0
