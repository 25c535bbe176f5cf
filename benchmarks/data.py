"""Data benchmarks: ``python -m benchmarks.data [--quick]``.

Everything is compared side by side in one run, so the figures that matter are
ratios and goals, not absolute times on whatever machine runs it:

1. input pipeline: ``research.data.input_pipeline.make_dataset`` against the
   generator people often write first, TensorFlow ops called record by record
   (goal: at least 20x the examples per second), and against this machine's ideal,
   the same pipeline confined to one thread on one core times the cores it may use
   (goal: at least 0.8 of it, on a machine no other work keeps busy). A plain Python
   generator (protobuf + Pillow) is shown too. PNG decoding dominates; the same
   comparisons without the images isolate the parsing;
2. Beam builds: records per second and peak memory of ``build_dataset`` over a
   synthetic text corpus (cleaning, PII masking, exact and near de-duplication on),
   each in a fresh process: on Beam's in-process runner, and on the Dask runner with
   two local worker processes, whose resident memory is summed with the driver's,
   which hosts the scheduler (goal: under 2 GiB for a million records). The two
   builds must write the same shards.

Results are printed as a table and written to ``benchmarks/results/data.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from benchmarks.common import benchmark_parser, machine_info, write_results

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_FILE = REPO_ROOT / "benchmarks" / "results" / "data.json"
PIPELINE_GOAL = 10.0
EAGER_GOAL = 20.0
IDEAL_GOAL = 0.8
BUSY_CORES = 0.25  # CPU other processes may use during a timed pass before it is noise
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
    build_timeout_seconds: int


FULL = Sizes(60_000, pipeline_repeats=3, build_records=1_000_000, build_timeout_seconds=4 * 3600)
QUICK = Sizes(10_000, pipeline_repeats=2, build_records=4_000, build_timeout_seconds=300)


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
    sharded TFRecords, a sentencepiece model for the caption, a manifest with SHA-256 and
    token statistics), with a one-shard ``check`` split for comparing the two readers
    record by record.
    """
    import sentencepiece as spm
    import tensorflow as tf
    from PIL import Image

    from contracts.dataset_manifest import Manifest, ShardInfo, SplitInfo, write_manifest
    from contracts.digests import file_sha256
    from contracts.features import FeatureSpec, encode_example
    from research.data.spec import VocabSpec
    from research.data.tokenizer import tokenizer_path, train_tokenizer

    rng = np.random.default_rng(seed)
    templates = _digit_templates()
    model = train_tokenizer(list(WORDS), VocabSpec(size=len(WORDS) + 64), "caption")
    processor = spm.SentencePieceProcessor(model_proto=model)
    model_path = root / tokenizer_path("caption")
    model_path.parent.mkdir(parents=True, exist_ok=True)
    model_path.write_bytes(model)
    features = {
        "image": FeatureSpec("image", "image", height=IMAGE_SIZE, width=IMAGE_SIZE, channels=1),
        "caption": FeatureSpec(
            "caption",
            "text",
            tokenizer_file=tokenizer_path("caption"),
            tokenizer_sha256=file_sha256(model_path),
            vocab_size=processor.get_piece_size(),
        ),
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
        words = rng.integers(0, len(WORDS), size=int(rng.integers(4, 48)))
        caption = " ".join(WORDS[i] for i in words)
        record = {
            "image": buffer.getvalue(),
            "caption": caption,
            "source": SOURCES[int(rng.integers(len(SOURCES)))],
            "ink": float(pixels.mean() / 255.0),
            "digit": str(digit),
        }
        return encode_example(record, features), len(processor.encode(caption))

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
    (PNG decoded by Pillow, categories looked up in a dict, captions tokenized by
    sentencepiece's Python API and padded) and batches are stacked with numpy.
    """
    import sentencepiece as spm
    import tensorflow as tf
    from PIL import Image
    from tensorflow.core.example import example_pb2

    from contracts.dataset_manifest import load_manifest
    from research.data.input_pipeline import default_sequence_length

    manifest = load_manifest(dataset_dir)
    processor = spm.SentencePieceProcessor(
        model_file=str(dataset_dir / manifest.features["caption"].tokenizer_file)
    )
    ids = {n: {v: i for i, v in enumerate(s.vocabulary)} for n, s in manifest.features.items()}
    length = default_sequence_length(manifest, "caption")

    def category(name: str) -> Callable[[Any], np.int64]:
        """An input's id as the graph's lookup gives it: from 1, and 0 for a value the
        vocabulary lacks."""
        vocabulary = ids[name]
        return lambda f: np.int64(vocabulary.get(f[name].bytes_list.value[0].decode(), -1) + 1)

    def label_class(f: Any) -> np.int64:
        """A label's position in the vocabulary (its length for a value it lacks)."""
        vocabulary = ids["digit"]
        return np.int64(vocabulary.get(f["digit"].bytes_list.value[0].decode(), len(vocabulary)))

    def tokens(f: Any) -> np.ndarray:
        padded = np.zeros(length, np.int32)
        values = processor.encode(f["caption"].bytes_list.value[0].decode())[:length]
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
    label = label_class

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
    from contracts.features import parsing_spec
    from research.data.input_pipeline import default_sequence_length
    from research.preprocessing.text import tokenizer_for

    manifest = load_manifest(dataset_dir)
    spec = parsing_spec(manifest.features)
    ids = {n: {v: i for i, v in enumerate(s.vocabulary)} for n, s in manifest.features.items()}
    length = default_sequence_length(manifest, "caption")
    tokenizer = tokenizer_for(dataset_dir, manifest.features["caption"], length)
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
            row["caption"] = tokenizer(parsed["caption"][None])[0].numpy()
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


class Pass(NamedTuple):
    """One timed pass of a reader, and what the machine did meanwhile."""

    examples_per_second: float
    cores_used: float  # this process's CPU seconds per second of the pass
    others_cores: float  # other processes' CPU seconds per second; nan if unknown


def _machine_busy_seconds() -> float:
    """CPU seconds every process has used since boot (``/proc/stat``), nan elsewhere.

    Next to this process's own CPU time it tells how much of the machine other work
    took during a pass: a pass another process shared the cores with measures that
    process, not the reader, and the report should say so.
    """
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            ticks = [int(value) for value in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return float("nan")
    idle, iowait = ticks[3], ticks[4]
    return (sum(ticks[:8]) - idle - iowait) / os.sysconf("SC_CLK_TCK")


def _examples_per_second(batches: Callable[[], Iterator[Any]]) -> Pass:
    """A full pass, from making the iterator to releasing it.

    Releasing counts: it is what an epoch costs, and it once took up to 0.6 s (tf.data's
    autotuning thread) in a pass that decodes in 0.7 s.
    """
    machine, own, start = _machine_busy_seconds(), time.process_time(), time.perf_counter()
    examples = sum(int(label.shape[0]) for _, label in batches())
    seconds = time.perf_counter() - start
    own = time.process_time() - own
    machine = _machine_busy_seconds() - machine
    return Pass(examples / seconds, own / seconds, max(0.0, machine - own) / seconds)


def usable_cores() -> int:
    return len(os.sched_getaffinity(0))


def on_one_thread(dataset: Any) -> Any:
    """The same pipeline with all its work on one thread: what one core decodes.

    The parallel decoding runs on tf.data's thread pool, which this shrinks to one
    thread. tf.data's own threads (the one that reads and batches records for the
    decoding map, the prefetch thread) stay outside that pool, so iterate this through
    :func:`on_one_core` to keep them off the other cores too.
    """
    import tensorflow as tf

    options = tf.data.Options()
    options.threading.private_threadpool_size = 1
    options.threading.max_intra_op_parallelism = 1
    return dataset.with_options(options)


def on_one_core(dataset: Any) -> Iterator[Any]:
    """Iterate ``dataset`` with every thread of this process pinned to one CPU.

    Without the pin the one-thread pipeline overlapped reading with decoding on a
    second core: 1.25 cores' worth of CPU without the images, 1.02 with them, and the
    ideal multiplied that by the core count as if it were one. Threads the pass starts
    inherit the pin from the pinned threads that start them; all get back the CPUs
    they may use when the pass ends, however it ends.
    """
    allowed = os.sched_getaffinity(0)

    def pin_all(cpus: set[int]) -> None:
        for task in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError):  # the thread ended meanwhile
                os.sched_setaffinity(int(task), cpus)

    pin_all({min(allowed)})
    try:
        yield from dataset
    finally:
        pin_all(allowed)


def compare_readers(
    dataset_dir: Path, features: Sequence[str] | None, repeats: int
) -> dict[str, Any]:
    """Best of ``repeats`` full passes of each reader, alternating so all see the same
    machine load (after one untimed pass each that warms caches and tracing).

    The ideal is the one-core rate times the usable cores: perfect scaling of the very
    same decoding work. The pipeline and its one-core self take under two seconds a
    pass, so they run three times per round, back to back: each such pair gives a
    fraction of the ideal under one machine load, and the spread of those fractions
    shows how far the headline, best rate over best rate, can be trusted. Both figures
    are only as good as the machine was quiet: another process on one of two cores
    halves the pipeline but not its one-core self, so the CPU other processes used
    during the passes is reported with them.
    """
    from research.data.input_pipeline import make_dataset

    pairs = 3
    dataset = make_dataset(
        dataset_dir, "train", batch_size=BATCH_SIZE, shuffle=False, verify="none", features=features
    )
    one_thread = on_one_thread(dataset)
    slow_readers = {
        "python": lambda: python_batches(dataset_dir, "train", BATCH_SIZE, features),
        "eager_tf": lambda: eager_tf_batches(dataset_dir, "train", BATCH_SIZE, features),
    }
    passes: dict[str, list[Pass]] = {"tf_data": [], "one_core": [], "python": [], "eager_tf": []}
    warm_up: list[Pass] = []
    for attempt in range(repeats + 1):
        for name, batches in slow_readers.items():
            timed = _examples_per_second(batches)
            if attempt:
                passes[name].append(timed)
        for _ in range(pairs if attempt else 1):
            ours = _examples_per_second(lambda: iter(dataset))
            one = _examples_per_second(lambda: on_one_core(one_thread))
            if attempt:
                passes["tf_data"].append(ours)
                passes["one_core"].append(one)
            else:
                warm_up.append(ours)
    best = {name: max(timed, key=lambda p: p.examples_per_second) for name, timed in passes.items()}
    rate = {name: timed.examples_per_second for name, timed in best.items()}
    cores = usable_cores()
    ideal = rate["one_core"] * cores
    per_pair = sorted(
        ours.examples_per_second / (one.examples_per_second * cores)
        for ours, one in zip(passes["tf_data"], passes["one_core"], strict=True)
    )
    others = [p.others_cores for name in ("tf_data", "one_core") for p in passes[name]]

    def median(values: Sequence[float]) -> float:
        return round(float(np.median(values)), 2)

    return {
        "tf_data_examples_per_second": round(rate["tf_data"], 1),
        "tf_data_first_pass_examples_per_second": round(warm_up[0].examples_per_second, 1),
        "python_examples_per_second": round(rate["python"], 1),
        "ratio": round(rate["tf_data"] / rate["python"], 2),
        "eager_tf_examples_per_second": round(rate["eager_tf"], 1),
        "ratio_vs_eager_tf": round(rate["tf_data"] / rate["eager_tf"], 2),
        "one_core_examples_per_second": round(rate["one_core"], 1),
        "ideal_examples_per_second": round(ideal, 1),
        "fraction_of_ideal": round(rate["tf_data"] / ideal, 3),
        "fraction_of_ideal_per_pair": {
            "pairs": len(per_pair),
            "min": round(per_pair[0], 3),
            "median": round(float(np.median(per_pair)), 3),
            "max": round(per_pair[-1], 3),
        },
        "tf_data_cores_used": median([p.cores_used for p in passes["tf_data"]]),
        "one_core_cores_used": median([p.cores_used for p in passes["one_core"]]),
        "one_core_cores_used_in_best_pass": round(best["one_core"].cores_used, 2),
        "other_processes_cores": {
            "median": median(others),
            "max": round(max(others), 2),
            "in_best_tf_data_pass": round(best["tf_data"].others_cores, 2),
        },
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
        "cores": usable_cores(),
        "goal_ratio": PIPELINE_GOAL,
        "goal_ratio_vs_eager_tf": EAGER_GOAL,
        "goal_fraction_of_ideal": IDEAL_GOAL,
        "same_batches": same_batches(dataset_dir),
        "without_images": compare_readers(dataset_dir, ["caption", "source", "ink"], repeats),
    }


# --- 2. Beam builds: throughput and memory, per runner --------------------------------

SPEC_YAML = """\
name: bench-corpus
sources:
  - type: jsonl
    path: corpus-*.jsonl
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
# A large corpus arrives as many files; each runner may read them in parallel.
CORPUS_FILES = 16
RUNNERS: dict[str, list[str]] = {
    "in_process": [],
    "dask": ["--runner", "dask", "--workers", "2"],
}
SAMPLE_SECONDS = 0.5


def builder_missing() -> str | None:
    """Why the dataset build cannot run here, or None when it can."""
    try:
        import research.data.pipeline  # noqa: F401
        import research.data.synthetic  # noqa: F401
    except ImportError as exc:
        return f"skipped: the dataset builder is not available ({exc})"
    return None


def prepare_corpus(workdir: Path, num_records: int) -> Path:
    """Write the synthetic corpus in ``CORPUS_FILES`` consecutive parts and its spec;
    returns the spec path."""
    from research.data.synthetic import generate_corpus

    workdir.mkdir(parents=True, exist_ok=True)
    dumps = json.JSONEncoder(ensure_ascii=False).encode
    per_file = -(-num_records // CORPUS_FILES)
    records = generate_corpus(num_records, seed=0)
    for index in range(CORPUS_FILES):
        path = workdir / f"corpus-{index:02d}.jsonl"
        with path.open("w", encoding="utf-8", buffering=1 << 20) as handle:
            for _, record in zip(range(per_file), records, strict=False):
                handle.write(dumps(record) + "\n")
    spec_path = workdir / "spec.yaml"
    spec_path.write_text(SPEC_YAML, encoding="utf-8")
    return spec_path


def run_build(spec_path: Path, output_dir: Path, beam_args: list[str]) -> dict[str, Any]:
    """The child's side: one build, timed, with this process's own peak memory."""
    from research.data.pipeline import build_dataset
    from research.data.spec import load_spec

    start = time.perf_counter()
    result = build_dataset(load_spec(spec_path), output_dir, overwrite=True, beam_args=beam_args)
    seconds = time.perf_counter() - start
    return {
        "seconds": round(seconds, 2),
        "records_written": {
            name: split.num_records for name, split in result.manifest.splits.items()
        },
        "shard_sha256": {
            shard.path: shard.sha256
            for split in result.manifest.splits.values()
            for shard in split.shards
        },
        "driver_peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


@dataclass
class MemoryPeaks:
    """Peaks, over samples, of the summed memory of a build's descendant processes: the
    Dask workers (and the small helper process that multiprocessing starts with them).

    RSS counts the pages a process maps, so a shared library's pages count once per
    process that maps them; PSS splits shared pages between the processes that share
    them, so its sum is what the processes take from the machine together.
    """

    workers: int = 0
    workers_rss_bytes: int = 0
    workers_pss_bytes: int = 0

    def sample(self, parent: Any) -> None:
        import psutil

        rss = pss = 0
        children = parent.children(recursive=True)
        for child in children:
            try:
                memory = child.memory_full_info()
            except psutil.Error:  # ended between the listing and the reading
                continue
            rss += memory.rss
            pss += memory.pss
        self.workers = max(self.workers, len(children))
        self.workers_rss_bytes = max(self.workers_rss_bytes, rss)
        self.workers_pss_bytes = max(self.workers_pss_bytes, pss)


def build_in_child(spec_path: Path, output_dir: Path, runner: str, timeout: int) -> dict[str, Any]:
    """One build in a fresh process, its workers' memory sampled until it ends.

    The child leads its own process group, so a build that overruns ``timeout`` is
    stopped with every worker it started.
    """
    import psutil

    command = [
        sys.executable, "-m", "benchmarks.data", "--child-build", str(spec_path),
        "--child-output", str(output_dir), "--child-runner", runner,
    ]  # fmt: skip
    peaks = MemoryPeaks()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen(
            command, cwd=REPO_ROOT, stdout=out, stderr=err, text=True, start_new_session=True
        )
        deadline = time.monotonic() + timeout
        process = psutil.Process(child.pid)
        while child.poll() is None:
            if time.monotonic() > deadline:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
                return {"error": f"no result within {timeout} s; stopped"}
            peaks.sample(process)
            time.sleep(SAMPLE_SECONDS)
        out.seek(0)
        err.seek(0)
        if child.returncode != 0:
            return {"error": err.read().strip()[-2000:]}
        outcome = json.loads(out.read().strip().splitlines()[-1])
    return {**outcome, **vars(peaks)}


def bench_builds(workdir: Path, num_records: int, timeout: int) -> dict[str, Any]:
    """Each runner builds the same corpus; memory is the process's (in-process) or the
    workers' and the driver's summed (Dask: the driver plans and runs the scheduler).
    Peaks are summed though they may come at different times, so Dask's figure is an
    upper bound."""
    if reason := builder_missing():
        return {"skipped": reason}
    spec_path = prepare_corpus(workdir / "corpus", num_records)
    results: dict[str, Any] = {"records": num_records, "input_files": CORPUS_FILES}
    for runner in RUNNERS:
        outcome = build_in_child(spec_path, workdir / f"dataset-{runner}", runner, timeout)
        if "error" not in outcome:
            outcome["records_per_second"] = round(num_records / outcome["seconds"], 1)
            # The Dask driver hosts the scheduler, which holds the task graph: it counts.
            peak = outcome["workers_rss_bytes"] + outcome["driver_peak_rss_bytes"]
            outcome["peak_rss_bytes"] = peak
            outcome["peak_rss_gib"] = round(peak / 1024**3, 3)
        results[runner] = outcome
    hashes = [results[runner].get("shard_sha256") for runner in RUNNERS]
    results["same_shards"] = None not in hashes and all(h == hashes[0] for h in hashes)
    results["goal_gib"] = MEMORY_GOAL_BYTES / 1024**3
    return results


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


def _failure_row(name: str, data: Mapping[str, Any], goal: str) -> tuple[str, ...] | None:
    if "skipped" in data:
        return (name, data["skipped"], "", "", "", goal, "[yellow]skipped")
    if "error" in data:
        last_line = data["error"].strip().splitlines()[-1][:300]
        return (name, f"failed: {last_line}", "", "", "", goal, "[red]failed")
    return None


def _build_rows(builds: Mapping[str, Any]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    goal = f"< {MEMORY_GOAL_BYTES / 1024**3:g} GiB"
    if failed := _failure_row("Beam builds", builds, goal):
        return [failed]
    reference = builds["in_process"].get("records_per_second")
    for runner, title, memory in (
        ("in_process", "in-process runner", "peak RSS of the process"),
        ("dask", "Dask runner, 2 worker processes", "peak RSS of workers + driver, summed"),
    ):
        data = builds[runner]
        name = f"Beam build, {builds['records']:,} records, {title}"
        if failed := _failure_row(name, data, goal):
            rows.append(failed)
            continue
        speed = data["records_per_second"]
        versus = (
            (f"{reference:,.0f}", f"{speed / reference:.2f}x")
            if runner != "in_process"
            else ("", "")
        )
        rows.append((name, "records/s", f"{speed:,.0f}", *versus, "", ""))
        shared = f" (PSS {data['workers_pss_bytes'] / 1024**3:.2f} GiB)" if data["workers"] else ""
        rows.append(
            (
                f"  {memory}{shared}",
                "GiB",
                f"{data['peak_rss_gib']:.2f}",
                "",
                "",
                goal,
                _status(data["peak_rss_bytes"] < MEMORY_GOAL_BYTES),
            )
        )
    same = builds["same_shards"]
    rows.append(("  same shards from both runners", "", str(same), "", "", "True", _status(same)))
    return rows


def print_table(results: Mapping[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Slipway data benchmarks{' (quick)' if results['quick'] else ''}")
    for column in ("benchmark", "measure", "value", "baseline", "ratio", "goal", "status"):
        table.add_column(column)
    pipe = results["input_pipeline"]
    met = pipe["ratio"] >= PIPELINE_GOAL and pipe["same_batches"]
    agreement = "" if pipe["same_batches"] else " [red](batches differ!)"
    table.add_row(
        *_reader_row(
            f"input pipeline, {pipe['records']:,} images + text, vs Python generator{agreement}",
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
        f">= {EAGER_GOAL:g}x",
        _status(eager >= EAGER_GOAL),
    )
    fraction = pipe["fraction_of_ideal"]
    spread, others = pipe["fraction_of_ideal_per_pair"], pipe["other_processes_cores"]
    # When other work shared the cores during the best pass of the pipeline, or took
    # part of the one core from its one-core self, the figure measures that work, not
    # the pipeline: neither "met" nor "missed" can be read from it.
    busy = (
        others["in_best_tf_data_pass"] > BUSY_CORES
        or pipe["one_core_cores_used_in_best_pass"] < 1 - BUSY_CORES
    )
    table.add_row(
        f"  vs ideal: one core's rate x {pipe['cores']} cores (per pair "
        f"{spread['min']:.2f}-{spread['max']:.2f}, median {spread['median']:.2f}; "
        f"other processes used {others['in_best_tf_data_pass']:.2f} cores)",
        "examples/s",
        f"{pipe['tf_data_examples_per_second']:,.0f}",
        f"{pipe['ideal_examples_per_second']:,.0f}",
        f"{fraction:.2f}",
        f">= {IDEAL_GOAL:g}",
        "[yellow]machine busy" if busy else _status(fraction >= IDEAL_GOAL),
    )
    for row in _build_rows(results["beam_builds"]):
        table.add_row(*row)
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
            "beam_builds": bench_builds(workdir, sizes.build_records, sizes.build_timeout_seconds),
        }
    write_results(output, results, print_table)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(
        "benchmarks.data", __doc__, "small sizes; under two minutes", RESULTS_FILE
    )
    parser.add_argument("--child-build", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--child-output", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--child-runner", choices=sorted(RUNNERS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_build:
        outcome = run_build(args.child_build, args.child_output, RUNNERS[args.child_runner])
        print(json.dumps(outcome))
        return 0
    run(args.quick, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
