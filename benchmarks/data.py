"""Data benchmarks: ``python -m benchmarks.data [--quick]``.

Everything is compared side by side in one run, so the figures that matter are
ratios and goals, not absolute times on whatever machine runs it:

1. input pipeline: ``research.data.input_pipeline.make_dataset`` against a plain
   Python generator that reads the same TFRecord files and yields the same parsed
   batches (goal: at least 10x the examples per second). PNG decoding dominates
   both; tf.data spreads it over every core while the generator uses one, so the
   ratio grows with the core count (the results record the machine's cores and load);
   the same comparison without the images isolates the parsing;
2. Beam build: records per second of ``build_dataset`` over a synthetic text corpus
   with cleaning, PII masking and near de-duplication on;
3. build memory: peak resident memory of a build run in a child process (goal: under
   2 GiB for a million records).

Results are printed as a table and written to ``benchmarks/results/data.json``.
"""

from __future__ import annotations

import argparse
import io
import json
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import benchmark_parser, machine_info, write_results

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_FILE = REPO_ROOT / "benchmarks" / "results" / "data.json"
PIPELINE_GOAL = 10.0
MEMORY_GOAL_BYTES = 2 * 1024**3
BATCH_SIZE = 256
NUM_SHARDS = 8
IMAGE_SIZE = 28
WORDS = tuple(f"w{i}" for i in range(2000))
SOURCES = ("scan", "photo", "tablet")


@dataclass(frozen=True)
class Sizes:
    pipeline_records: int
    pipeline_repeats: int
    build_records: int
    memory_records: int


FULL = Sizes(60_000, pipeline_repeats=3, build_records=100_000, memory_records=1_000_000)
QUICK = Sizes(15_000, pipeline_repeats=2, build_records=10_000, memory_records=50_000)


# --- 1. tf.data input pipeline against a Python generator ---------------------------


def _digit_templates() -> list[np.ndarray]:
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.load_default(size=22)
    templates = []
    for digit in range(10):
        image = Image.new("L", (IMAGE_SIZE, IMAGE_SIZE))
        ImageDraw.Draw(image).text((8, 1), str(digit), fill=255, font=font)
        templates.append(np.asarray(image, dtype=np.float32))
    return templates


def write_digits_dataset(root: Path, num_records: int, seed: int = 0) -> None:
    """Digit-like 28x28 images with a caption, a source and a numeric feature.

    Written the way the dataset builder writes them (Examples per the feature contract,
    sharded TFRecords, a manifest with SHA-256 and token statistics), with a one-shard
    ``check`` split for comparing the two readers record by record.
    """
    import tensorflow as tf
    from PIL import Image

    from contracts.dataset_manifest import Manifest, ShardInfo, SplitInfo, write_manifest
    from contracts.digests import file_sha256
    from contracts.features import FeatureSpec, encode_example

    rng = np.random.default_rng(seed)
    templates = _digit_templates()
    features = {
        "image": FeatureSpec("image", "image", height=IMAGE_SIZE, width=IMAGE_SIZE, channels=1),
        "caption": FeatureSpec("caption", "text", vocab_size=len(WORDS) + 2),
        "source": FeatureSpec("source", "categorical", vocabulary=SOURCES[:2]),
        "ink": FeatureSpec("ink", "numeric"),
        "digit": FeatureSpec(
            "digit", "categorical", vocabulary=tuple(map(str, range(10))), is_label=True
        ),
    }

    def example() -> tuple[bytes, int]:
        digit = int(rng.integers(10))
        shifted = np.roll(templates[digit], rng.integers(-3, 4, size=2), axis=(0, 1))
        pixels = shifted * rng.uniform(0.6, 1.0)
        buffer = io.BytesIO()
        Image.fromarray(pixels.astype(np.uint8)).save(buffer, format="PNG")
        ids = rng.integers(2, len(WORDS) + 2, size=int(rng.integers(4, 48)))
        record = {
            "image": buffer.getvalue(),
            "caption": " ".join(WORDS[i - 2] for i in ids),
            "source": SOURCES[int(rng.integers(len(SOURCES)))],
            "ink": float(pixels.mean() / 255.0),
            "digit": str(digit),
        }
        return encode_example(record, features, {"caption": ids.tolist()}), len(ids)

    root.mkdir(parents=True, exist_ok=True)
    splits: dict[str, SplitInfo] = {}
    statistics: dict[str, Any] = {}
    for split, count, num_shards in (("train", num_records, NUM_SHARDS), ("check", 512, 1)):
        shards, longest = [], 0
        for index in range(num_shards):
            name = f"{split}-{index:05d}-of-{num_shards:05d}.tfrecord"
            records = count // num_shards + (index < count % num_shards)
            with tf.io.TFRecordWriter(str(root / name)) as writer:
                for _ in range(records):
                    serialized, length = example()
                    writer.write(serialized)
                    longest = max(longest, length)
            path = root / name
            shards.append(ShardInfo(name, records, file_sha256(path), path.stat().st_size))
        splits[split] = SplitInfo(split, tuple(shards))
        statistics[split] = {
            "num_records": count,
            "features": {"caption": {"type": "text", "token_quantiles": {"p100": longest}}},
        }
    manifest = Manifest(
        name="bench-digits",
        spec_hash="0" * 64,
        compression="none",
        features=features,
        labels=["digit"],
        splits=splits,
        statistics=statistics,
    )
    write_manifest(root, manifest)


def python_batches(
    dataset_dir: Path, split: str, batch_size: int, features: Sequence[str] | None = None
) -> Iterator[Any]:
    """The baseline: the same ``(features, label)`` batches, parsed in plain Python.

    Records come from TensorFlow's record reader (``tf_record_iterator``, about 2 us a
    record; iterating a ``TFRecordDataset`` eagerly costs some 90 us and would flatter
    the comparison). Every Example is parsed with the protobuf API into numpy arrays
    (PNG decoded by Pillow, categories looked up in a dict, token ids padded) and
    batches are stacked with numpy.
    """
    import tensorflow as tf
    from PIL import Image
    from tensorflow.core.example import example_pb2

    from contracts.dataset_manifest import load_manifest
    from contracts.features import token_ids_key
    from research.data.input_pipeline import default_sequence_length

    manifest = load_manifest(dataset_dir)
    ids = {n: {v: i for i, v in enumerate(s.vocabulary)} for n, s in manifest.features.items()}
    length = default_sequence_length(manifest, "caption")

    def category(name: str) -> Callable[[Any], np.int64]:
        vocabulary = ids[name]
        return lambda f: np.int64(
            vocabulary.get(f[name].bytes_list.value[0].decode(), len(vocabulary))
        )

    def tokens(f: Any) -> np.ndarray:
        padded = np.zeros(length, np.int32)
        values = f[token_ids_key("caption")].int64_list.value[:length]
        padded[: len(values)] = values
        return padded

    def image(f: Any) -> np.ndarray:
        pixels = Image.open(io.BytesIO(f["image"].bytes_list.value[0]))
        return (np.asarray(pixels, np.float32) / 255.0)[:, :, None]

    converters: dict[str, Callable[[Any], Any]] = {
        "image": image,
        "caption": tokens,
        "source": category("source"),
        "ink": lambda f: np.float32(f["ink"].float_list.value[0]),
    }
    wanted = {name: converters[name] for name in (features or converters)}
    label = category("digit")

    def stack(rows: list[dict[str, Any]], labels: list[np.int64]) -> Any:
        return {key: np.stack([row[key] for row in rows]) for key in wanted}, np.stack(labels)

    rows: list[dict[str, Any]] = []
    labels: list[np.int64] = []
    for path in manifest.shard_paths(dataset_dir, split):
        for raw in tf.compat.v1.io.tf_record_iterator(path):
            feature = example_pb2.Example.FromString(raw).features.feature
            rows.append({name: convert(feature) for name, convert in wanted.items()})
            labels.append(label(feature))
            if len(rows) == batch_size:
                yield stack(rows, labels)
                rows, labels = [], []
    if rows:
        yield stack(rows, labels)


def eager_tf_batches(
    dataset_dir: Path, split: str, batch_size: int, features: Sequence[str] | None = None
) -> Iterator[Any]:
    """The generator people often write first: TensorFlow ops called record by record.

    Records are read by iterating a ``TFRecordDataset`` eagerly, parsed with
    ``tf.io.parse_single_example`` and decoded with ``tf.io.decode_png`` one at a time,
    then converted to numpy and batched in Python — the same values as ``python_batches``.
    """
    import tensorflow as tf

    from contracts.dataset_manifest import load_manifest
    from contracts.features import parsing_spec, token_ids_key
    from research.data.input_pipeline import default_sequence_length

    manifest = load_manifest(dataset_dir)
    spec = parsing_spec(manifest.features)
    ids = {n: {v: i for i, v in enumerate(s.vocabulary)} for n, s in manifest.features.items()}
    length = default_sequence_length(manifest, "caption")
    wanted = list(features or ("image", "caption", "source", "ink"))
    rows: list[dict[str, Any]] = []
    labels: list[np.int64] = []
    raw_records = tf.data.TFRecordDataset(manifest.shard_paths(dataset_dir, split))
    for raw in raw_records:
        parsed = tf.io.parse_single_example(raw, spec)
        row: dict[str, Any] = {}
        if "image" in wanted:
            pixels = tf.io.decode_png(parsed["image"], channels=1)
            row["image"] = tf.cast(pixels, tf.float32).numpy() / 255.0
        if "caption" in wanted:
            padded = np.zeros(length, np.int32)
            values = tf.sparse.to_dense(parsed[token_ids_key("caption")]).numpy()[:length]
            padded[: len(values)] = values
            row["caption"] = padded
        if "source" in wanted:
            vocabulary = ids["source"]
            row["source"] = np.int64(
                vocabulary.get(parsed["source"].numpy().decode(), len(vocabulary))
            )
        if "ink" in wanted:
            row["ink"] = np.float32(parsed["ink"].numpy())
        rows.append(row)
        digit = ids["digit"]
        labels.append(np.int64(digit.get(parsed["digit"].numpy().decode(), len(digit))))
        if len(rows) == batch_size:
            yield {k: np.stack([r[k] for r in rows]) for k in wanted}, np.stack(labels)
            rows, labels = [], []
    if rows:
        yield {k: np.stack([r[k] for r in rows]) for k in wanted}, np.stack(labels)


def _examples_per_second(batches: Callable[[], Iterator[Any]]) -> float:
    start = time.perf_counter()
    examples = sum(int(label.shape[0]) for _, label in batches())
    return examples / (time.perf_counter() - start)


def compare_readers(
    dataset_dir: Path, features: Sequence[str] | None, repeats: int
) -> dict[str, float]:
    """Best of ``repeats`` full passes of each reader, alternating so both see the same
    machine load (after one untimed pass each that warms caches and tracing)."""
    from research.data.input_pipeline import make_dataset

    dataset = make_dataset(
        dataset_dir, "train", batch_size=BATCH_SIZE, shuffle=False, verify="none", features=features
    )
    readers = {
        "tf_data": lambda: iter(dataset),
        "python": lambda: python_batches(dataset_dir, "train", BATCH_SIZE, features),
        "eager_tf": lambda: eager_tf_batches(dataset_dir, "train", BATCH_SIZE, features),
    }
    best = dict.fromkeys(readers, 0.0)
    for attempt in range(repeats + 1):
        for name, batches in readers.items():
            rate = _examples_per_second(batches)
            if attempt:
                best[name] = max(best[name], rate)
    return {
        "tf_data_examples_per_second": round(best["tf_data"], 1),
        "python_examples_per_second": round(best["python"], 1),
        "ratio": round(best["tf_data"] / best["python"], 2),
        "eager_tf_examples_per_second": round(best["eager_tf"], 1),
        "ratio_vs_eager_tf": round(best["tf_data"] / best["eager_tf"], 2),
    }


def same_batches(dataset_dir: Path) -> bool:
    """Whether both readers yield identical batches (on the one-shard ``check`` split)."""
    import tensorflow as tf

    from research.data.input_pipeline import make_dataset

    ours = make_dataset(dataset_dir, "check", batch_size=BATCH_SIZE, shuffle=False)
    theirs = python_batches(dataset_dir, "check", BATCH_SIZE)
    return all(
        np.allclose(got.numpy(), want, atol=1e-6)
        for ours_batch, theirs_batch in zip(ours, theirs, strict=True)
        for got, want in zip(
            tf.nest.flatten(ours_batch), tf.nest.flatten(theirs_batch), strict=True
        )
    )


def bench_input_pipeline(workdir: Path, num_records: int, repeats: int) -> dict[str, Any]:
    from research.data.input_pipeline import make_dataset

    dataset_dir = workdir / "digits"
    start = time.perf_counter()
    write_digits_dataset(dataset_dir, num_records)
    written = time.perf_counter() - start
    start = time.perf_counter()
    make_dataset(dataset_dir, "train", batch_size=BATCH_SIZE, verify="sha256")
    verify_seconds = time.perf_counter() - start
    return {
        "records": num_records,
        "batch_size": BATCH_SIZE,
        "shards": NUM_SHARDS,
        "dataset_bytes": sum(path.stat().st_size for path in dataset_dir.glob("train-*")),
        "write_seconds": round(written, 2),
        "sha256_verify_seconds": round(verify_seconds, 3),
        **compare_readers(dataset_dir, None, repeats),
        "goal_ratio": PIPELINE_GOAL,
        "same_batches": same_batches(dataset_dir),
        "without_images": compare_readers(dataset_dir, ["caption", "source", "ink"], repeats),
    }


# --- 2 and 3. Beam build throughput and memory -------------------------------------

SPEC_YAML = """\
name: bench-corpus
sources:
  - type: jsonl
    path: corpus.jsonl
schema:
  text: {type: text}
  topic: {type: categorical}
  score: {type: numeric}
labels: [topic]
clean:
  pii: {enabled: true, fields: [text]}
vocab:
  fields: [text]
dedup:
  exact: {enabled: true, fields: [text]}
  near: {field: text}
output:
  num_shards: 4
"""


def builder_missing() -> str | None:
    """Why the dataset build cannot run here, or None when it can."""
    try:
        import research.data.pipeline  # noqa: F401
        import research.data.synthetic  # noqa: F401
    except ImportError as exc:
        return f"skipped: the dataset builder is not available ({exc})"
    return None


def prepare_corpus(workdir: Path, num_records: int) -> Path:
    """Write the synthetic corpus and its spec; returns the spec path."""
    from research.data.synthetic import write_corpus_jsonl

    workdir.mkdir(parents=True, exist_ok=True)
    write_corpus_jsonl(workdir / "corpus.jsonl", num_records, seed=0)
    spec_path = workdir / "spec.yaml"
    spec_path.write_text(SPEC_YAML, encoding="utf-8")
    return spec_path


def run_build(spec_path: Path, output_dir: Path) -> dict[str, Any]:
    from research.data.pipeline import build_dataset
    from research.data.spec import load_spec

    start = time.perf_counter()
    result = build_dataset(load_spec(spec_path), output_dir, overwrite=True)
    seconds = time.perf_counter() - start
    written = {name: split.num_records for name, split in result.manifest.splits.items()}
    return {"seconds": round(seconds, 2), "records_written": written}


def bench_build(workdir: Path, num_records: int) -> dict[str, Any]:
    if reason := builder_missing():
        return {"skipped": reason}
    spec_path = prepare_corpus(workdir / "build", num_records)
    try:
        outcome = run_build(spec_path, workdir / "build" / "dataset")
    except (
        Exception
    ) as exc:  # a failed build is a result to report, not a reason to lose the others
        return {"records": num_records, "error": f"{type(exc).__name__}: {exc}"}
    return {
        "records": num_records,
        **outcome,
        "records_per_second": round(num_records / outcome["seconds"], 1),
    }


def bench_build_memory(workdir: Path, num_records: int) -> dict[str, Any]:
    """Peak RSS of a build in a child process, so this process's memory does not count.

    ``RUSAGE_CHILDREN`` reports the largest waited-for child; no other part of the
    benchmark starts a child process, so that is the build.
    """
    if reason := builder_missing():
        return {"skipped": reason}
    spec_path = prepare_corpus(workdir / "memory", num_records)
    command = [
        sys.executable, "-m", "benchmarks.data", "--child-build", str(spec_path),
        "--child-output", str(workdir / "memory" / "dataset"),
    ]  # fmt: skip
    child = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    if child.returncode != 0:
        return {"records": num_records, "error": child.stderr.strip()[-2000:]}
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # KiB on Linux
    outcome = json.loads(child.stdout.strip().splitlines()[-1])
    return {
        "records": num_records,
        **outcome,
        "peak_rss_bytes": peak,
        "peak_rss_gib": round(peak / 1024**3, 3),
        "goal_gib": MEMORY_GOAL_BYTES / 1024**3,
    }


# --- report ---------------------------------------------------------------------------


def _status(ok: bool) -> str:
    return "[green]met" if ok else "[red]missed"


def _reader_row(name: str, figures: Mapping[str, Any], goal: str, status: str) -> tuple[str, ...]:
    return (
        name,
        "examples/s",
        f"{figures['tf_data_examples_per_second']:,.0f}",
        f"{figures['python_examples_per_second']:,.0f}",
        f"{figures['ratio']:.1f}x",
        goal,
        status,
    )


def _build_row(
    name: str, data: Mapping[str, Any], measure: str, value: str, goal: str, ok: bool | None
) -> tuple[str, ...]:
    if "skipped" in data:
        return (name, data["skipped"], "", "", "", goal, "[yellow]skipped")
    if "error" in data:
        last_line = data["error"].strip().splitlines()[-1][:300]
        return (name, f"failed: {last_line}", "", "", "", goal, "[red]failed")
    return (name, measure, value, "", "", goal, "" if ok is None else _status(ok))


def print_table(results: Mapping[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Slipway data benchmarks{' (quick)' if results['quick'] else ''}")
    for column in ("benchmark", "measure", "value", "Python baseline", "ratio", "goal", "status"):
        table.add_column(column)
    pipe = results["input_pipeline"]
    met = pipe["ratio"] >= PIPELINE_GOAL and pipe["same_batches"]
    agreement = "" if pipe["same_batches"] else " [red](batches differ!)"
    table.add_row(
        *_reader_row(
            f"input pipeline, {pipe['records']:,} images + text{agreement}",
            pipe,
            f">= {PIPELINE_GOAL:g}x",
            _status(met),
        )
    )
    table.add_row(*_reader_row("  same, without images", pipe["without_images"], "", ""))
    eager = pipe["ratio_vs_eager_tf"]
    table.add_row(
        "  vs eager per-record TensorFlow generator",
        "examples/s",
        f"{pipe['tf_data_examples_per_second']:,.0f}",
        f"{pipe['eager_tf_examples_per_second']:,.0f}",
        f"{eager:.1f}x",
        f">= {PIPELINE_GOAL:g}x",
        _status(eager >= PIPELINE_GOAL),
    )
    build = results["beam_build"]
    table.add_row(
        *_build_row(
            f"Beam build, {build.get('records', 0):,} records",
            build,
            "records/s",
            f"{build.get('records_per_second', 0):,.0f}",
            "",
            None,
        )
    )
    memory = results["build_memory"]
    table.add_row(
        *_build_row(
            f"build peak memory, {memory.get('records', 0):,} records",
            memory,
            "peak RSS (child)",
            f"{memory.get('peak_rss_gib', 0):.2f} GiB",
            "< 2 GiB",
            memory.get("peak_rss_bytes", 0) < MEMORY_GOAL_BYTES,
        )
    )
    Console().print(table)


def run(quick: bool, output: Path) -> dict[str, Any]:

    sizes = QUICK if quick else FULL
    with tempfile.TemporaryDirectory(prefix="slipway-bench-data-") as tmp:
        workdir = Path(tmp)
        results: dict[str, Any] = {
            "quick": quick,
            "machine": machine_info(),
            "input_pipeline": bench_input_pipeline(
                workdir, sizes.pipeline_records, sizes.pipeline_repeats
            ),
            "beam_build": bench_build(workdir, sizes.build_records),
            "build_memory": bench_build_memory(workdir, sizes.memory_records),
        }
    write_results(output, results, print_table)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(
        "benchmarks.data", __doc__, "small sizes; about a minute", RESULTS_FILE
    )
    parser.add_argument("--child-build", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--child-output", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_build:
        print(json.dumps(run_build(args.child_build, args.child_output)))
        return 0
    run(args.quick, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
