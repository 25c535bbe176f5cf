"""Measuring a model artifact on held-out data: accuracy, agreement, size and speed.

Every figure in a compression report comes from running the artifact itself: the
``.tflite`` flatbuffer through LiteRT's ``serving_default`` signature runner, the
SavedModel through its ``serving_default`` concrete function. Both are fed the same
examples of one split, in the same order, so a compressed model's outputs can be
compared one for one with the float model's (agreement, largest output difference).

Speed is measured the way a serving process sees it: latency at batch 1 after a
warm-up, as percentiles over many runs, with inputs already in the model's dtype
(quantizing a float input for an int8 model is done before the clock starts, as a
client would); throughput is examples per second over the whole split in batches.
Several flatbuffers measured together (:func:`evaluate_tflite_models`) are timed in
interleaved rounds, so the ratios of their latencies compare models, not moments.
"""

from __future__ import annotations

import gzip
import io
import os
import tarfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import tensorflow as tf

from compression.errors import CompressionError
from compression.finetune import check_inputs, open_dataset, sequence_length
from compression.latency import interleaved_latencies_ms
from contracts.model_manifest import MANIFEST_FILE, SIGNATURE_KEY
from research.data.input_pipeline import make_dataset

GZIP_LEVEL = 9
_MAX_PASSES = 1000


@dataclass(frozen=True)
class EvalSettings:
    """How an artifact is measured; recorded in the report beside the numbers."""

    batch_size: int = 32  # for the accuracy pass and throughput
    throughput_seconds: float = 0.2  # passes over the split repeat at least this long
    latency_runs: int = 200
    warmup_runs: int = 20
    num_threads: int = 1  # LiteRT interpreter threads
    max_examples: int | None = None  # the first N examples of the split; None: all

    def __post_init__(self) -> None:
        for name in ("batch_size", "latency_runs", "num_threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.throughput_seconds < 0:
            raise ValueError(f"throughput_seconds must be >= 0, got {self.throughput_seconds}")
        if self.warmup_runs < 0:
            raise ValueError(f"warmup_runs must be >= 0, got {self.warmup_runs}")
        if self.max_examples is not None and self.max_examples < 1:
            raise ValueError(f"max_examples must be >= 1, got {self.max_examples}")

    def to_json(self) -> dict[str, Any]:
        return {
            "batch_size": self.batch_size,
            "throughput_seconds": self.throughput_seconds,
            "latency_runs": self.latency_runs,
            "warmup_runs": self.warmup_runs,
            "num_threads": self.num_threads,
            "max_examples": self.max_examples,
        }


@dataclass(frozen=True)
class EvalData:
    """One split held in memory: input arrays by model input name, labels by label name."""

    dataset_dir: Path
    split: str
    features: dict[str, np.ndarray]
    labels: dict[str, np.ndarray]

    @property
    def num_examples(self) -> int:
        return len(next(iter(self.features.values())))


@dataclass(frozen=True)
class Evaluation:
    """What one artifact scored on one split.

    ``accuracy`` is per classification head (top-1), ``mae`` per regression head;
    ``agreement`` (top-1 agreement per class-scoring output) and ``max_abs_diff`` compare
    with a reference model's outputs and are None without one. Sizes are in bytes,
    latencies in milliseconds at batch 1, throughput in examples per second.
    ``outputs`` are the artifact's predictions on the split, for later comparisons.
    """

    examples: int
    accuracy: dict[str, float]
    mae: dict[str, float]
    agreement: dict[str, float] | None
    max_abs_diff: float | None
    size_bytes: int
    gzip_bytes: int
    latency_p50_ms: float
    latency_p99_ms: float
    latency_mean_ms: float
    throughput: float
    outputs: dict[str, np.ndarray] = field(repr=False, compare=False)

    @property
    def mean_accuracy(self) -> float | None:
        """The one accuracy a table shows: the mean over classification heads."""
        if not self.accuracy:
            return None
        return float(np.mean(list(self.accuracy.values())))

    @property
    def mean_agreement(self) -> float | None:
        if not self.agreement:
            return None
        return float(np.mean(list(self.agreement.values())))

    def to_json(self) -> dict[str, Any]:
        return {
            "examples": self.examples,
            "accuracy": self.mean_accuracy,
            "accuracy_per_head": dict(self.accuracy),
            "mae_per_head": dict(self.mae),
            "agreement": self.mean_agreement,
            "agreement_per_output": None if self.agreement is None else dict(self.agreement),
            "max_abs_diff": self.max_abs_diff,
            "size_bytes": self.size_bytes,
            "gzip_bytes": self.gzip_bytes,
            "latency_p50_ms": self.latency_p50_ms,
            "latency_p99_ms": self.latency_p99_ms,
            "latency_mean_ms": self.latency_mean_ms,
            "throughput": self.throughput,
        }


# -- sizes ----------------------------------------------------------------------------


def gzip_size(content: bytes) -> int:
    """Bytes after gzip level 9: what a download of the artifact costs."""
    return len(gzip.compress(content, compresslevel=GZIP_LEVEL, mtime=0))


def directory_files(directory: str | Path) -> list[Path]:
    """The files that make up a SavedModel directory (``slipway.json`` is not the model)."""
    root = Path(directory)
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST_FILE)


def directory_size(directory: str | Path) -> int:
    return sum(path.stat().st_size for path in directory_files(directory))


def directory_gzip_size(directory: str | Path) -> int:
    """Bytes of a gzipped tar of the directory, built deterministically in memory."""
    root = Path(directory)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=GZIP_LEVEL) as archive:
        for path in directory_files(root):
            info = tarfile.TarInfo(path.relative_to(root).as_posix())
            info.size = path.stat().st_size
            info.mtime = 0
            with open(path, "rb") as handle:
                archive.addfile(info, handle)
    return buffer.tell()


# -- data -----------------------------------------------------------------------------


def load_eval_data(
    dataset_dir: str | Path,
    signature: Mapping[str, Any],
    split: str = "test",
    *,
    max_examples: int | None = None,
    raw: bool = False,
) -> EvalData:
    """Read ``split`` for a model whose ``serving_default`` is described by ``signature``.

    ``signature`` is in ``slipway.json``'s layout (``{"inputs": {name: {"dtype",
    "shape"}}, "outputs": ...}``). The model's inputs must be input features of the
    dataset with matching shapes, and token inputs are padded to the model's length.
    ``raw`` reads the features as a client sends them, for a served graph that
    preprocesses them itself; records come in the same order either way.
    """
    manifest = open_dataset(dataset_dir, split)
    specs = {
        name: tf.TensorSpec(
            [None if d == -1 else d for d in entry["shape"]], tf.as_dtype(entry["dtype"])
        )
        for name, entry in signature["inputs"].items()
    }
    if not raw:
        check_inputs(manifest, specs, dataset_dir)
    dataset = make_dataset(
        dataset_dir,
        split,
        batch_size=256,
        shuffle=False,
        features=list(specs),
        sequence_length=None if raw else sequence_length(specs),
        verify="sha256",
        raw=raw,
    )
    label_names = list(manifest.labels) + [
        name
        for name, spec in manifest.features.items()
        if spec.is_label and name not in manifest.labels
    ]
    features: dict[str, list[np.ndarray]] = {name: [] for name in specs}
    labels: dict[str, list[np.ndarray]] = {name: [] for name in label_names}
    for element in dataset:
        batch_features, batch_labels = element if isinstance(element, tuple) else (element, {})
        if not isinstance(batch_labels, Mapping):
            batch_labels = {label_names[0]: batch_labels}
        for name in features:
            features[name].append(batch_features[name].numpy())
        for name in labels:
            labels[name].append(batch_labels[name].numpy())
    if not next(iter(features.values())):
        raise CompressionError(f"{dataset_dir}: split {split!r} has no records to evaluate on")
    stop = max_examples
    arrays = {name: np.concatenate(parts)[:stop] for name, parts in features.items()}
    for name, values in arrays.items():
        entry = signature["inputs"][name]
        if not raw:
            _check_dtype(name, values.dtype, np.dtype(entry["dtype"]), "quantization" in entry)
    return EvalData(
        dataset_dir=Path(dataset_dir),
        split=split,
        features=arrays,
        labels={name: np.concatenate(parts)[:stop] for name, parts in labels.items()},
    )


def _check_dtype(name: str, data: np.dtype, model: np.dtype, quantized: bool = False) -> None:
    """Integer data may feed float inputs (the zoo casts integer features on the way in),
    and float data a quantized int8 input, but float data never feeds an integer input:
    ids cannot be made up from values."""
    if np.issubdtype(data, np.floating) and not np.issubdtype(model, np.floating) and not quantized:
        raise CompressionError(
            f"input {name!r}: the model takes {np.dtype(model).name} but the dataset holds "
            f"{np.dtype(data).name} values"
        )


def _as_model_input(name: str, values: np.ndarray, dtype: np.dtype, shape: tuple) -> np.ndarray:
    """Data arrays in the dtype and per-example shape an artifact declares for ``name``."""
    _check_dtype(name, values.dtype, dtype)
    per_example = values.shape[1:]
    if None not in shape and -1 not in shape and tuple(shape) != per_example:
        if int(np.prod(shape)) != int(np.prod(per_example)):
            raise CompressionError(
                f"input {name!r}: the model takes shape {list(shape)} per example but the "
                f"dataset holds {list(per_example)}"
            )
        values = values.reshape((len(values), *shape))
    return values.astype(dtype, copy=False)


# -- runners --------------------------------------------------------------------------


class Runner(Protocol):
    """One artifact ready to run: ``feed`` prepares a batch, ``invoke`` runs it.

    ``feed`` turns data arrays into exactly what ``invoke`` consumes, so a latency
    measurement times the model and nothing else; ``invoke`` returns float outputs.
    """

    def feed(self, batch: Mapping[str, np.ndarray]) -> Any: ...

    def invoke(self, fed: Any) -> dict[str, np.ndarray]: ...


class TFLiteRunner:
    """A ``.tflite`` flatbuffer behind LiteRT's ``serving_default`` signature runner.

    Inputs stored as int8/uint8 with a scale are quantized with that tensor's
    parameters and such outputs are dequantized, so an int8-I/O model is compared with
    the float model on the same real-valued scale.
    """

    def __init__(self, tflite: bytes, num_threads: int = 1) -> None:
        from ai_edge_litert.interpreter import Interpreter

        try:
            interpreter = Interpreter(model_content=tflite, num_threads=num_threads)
        except ValueError as exc:
            raise CompressionError(f"not a TFLite model LiteRT can load: {exc}") from None
        if SIGNATURE_KEY not in interpreter.get_signature_list():
            raise CompressionError(
                f"the TFLite model has no {SIGNATURE_KEY!r} signature "
                f"(it has {sorted(interpreter.get_signature_list())})"
            )
        self._runner = interpreter.get_signature_runner(SIGNATURE_KEY)
        self.inputs = self._runner.get_input_details()
        self.outputs = self._runner.get_output_details()
        for name, detail in self.inputs.items():
            batch = int(detail["shape_signature"][0]) if len(detail["shape_signature"]) else 0
            if batch not in (-1, 1):
                raise CompressionError(
                    f"TFLite input {name!r} has a fixed batch size of {batch}; convert the "
                    "model with a free batch dimension"
                )

    def signature(self) -> dict[str, Any]:
        """The signature in ``slipway.json``'s layout, with int8 tensors' quantization."""

        def describe(details: Mapping[str, Any]) -> dict[str, Any]:
            described = {}
            for name, detail in details.items():
                entry: dict[str, Any] = {
                    "dtype": np.dtype(detail["dtype"]).name,
                    "shape": [int(d) for d in detail["shape_signature"]],
                }
                scale, zero_point = detail["quantization"]
                if scale:
                    entry["quantization"] = {"scale": float(scale), "zero_point": int(zero_point)}
                described[name] = entry
            return described

        return {
            "name": SIGNATURE_KEY,
            "inputs": describe(self.inputs),
            "outputs": describe(self.outputs),
        }

    def feed(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        fed = {}
        for name, detail in self.inputs.items():
            if name not in batch:
                raise CompressionError(f"TFLite input {name!r} is not in the data")
            dtype = np.dtype(detail["dtype"])
            values = batch[name]
            scale, zero_point = detail["quantization"]
            if scale and np.issubdtype(values.dtype, np.floating):
                info = np.iinfo(dtype)
                quantized = np.round(values / scale + zero_point)
                values = np.clip(quantized, info.min, info.max).astype(dtype)
            shape = tuple(int(d) for d in detail["shape_signature"][1:])
            fed[name] = np.ascontiguousarray(_as_model_input(name, values, dtype, shape))
        return fed

    def invoke(self, fed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        raw = self._runner(**fed)
        outputs = {}
        for name, values in raw.items():
            scale, zero_point = self.outputs[name]["quantization"]
            if scale and not np.issubdtype(values.dtype, np.floating):
                values = (values.astype(np.float32) - zero_point) * np.float32(scale)
            outputs[name] = values
        return outputs


class SavedModelRunner:
    """A SavedModel's ``serving_default`` concrete function."""

    def __init__(self, directory: str | Path) -> None:
        try:
            loaded = tf.saved_model.load(str(directory))
        except (OSError, ValueError) as exc:
            raise CompressionError(f"{directory}: not a loadable SavedModel: {exc}") from None
        if SIGNATURE_KEY not in loaded.signatures:
            raise CompressionError(
                f"{directory}: the SavedModel has no {SIGNATURE_KEY!r} signature "
                f"(it has {sorted(loaded.signatures)})"
            )
        self._loaded = loaded  # the function needs its object graph alive
        self._function = loaded.signatures[SIGNATURE_KEY]
        self.inputs = dict(self._function.structured_input_signature[1])

    def feed(self, batch: Mapping[str, np.ndarray]) -> dict[str, tf.Tensor]:
        fed = {}
        for name, spec in self.inputs.items():
            if name not in batch:
                raise CompressionError(f"SavedModel input {name!r} is not in the data")
            shape = tuple(spec.shape[1:])
            values = _as_model_input(name, batch[name], spec.dtype.as_numpy_dtype, shape)
            fed[name] = tf.constant(values)
        return fed

    def invoke(self, fed: dict[str, tf.Tensor]) -> dict[str, np.ndarray]:
        """The numeric outputs (class names the export adds are not predictions)."""
        return {
            name: value.numpy()
            for name, value in self._function(**fed).items()
            if value.dtype != tf.string
        }


# -- scoring --------------------------------------------------------------------------


def _slice(features: Mapping[str, np.ndarray], start: int, stop: int) -> dict[str, np.ndarray]:
    return {name: values[start:stop] for name, values in features.items()}


def _predict(runner: Runner, data: EvalData, settings: EvalSettings) -> tuple[dict, float]:
    """All outputs over the split, and examples per second over repeated passes.

    Only full batches are timed: a last, smaller batch would make LiteRT resize its
    tensors twice per pass and time the reallocation. A small split passes in
    milliseconds, too short to time, so passes repeat until ``throughput_seconds`` have
    gone by (at most ``_MAX_PASSES``).
    """
    size = settings.batch_size
    fed = [
        runner.feed(_slice(data.features, start, start + size))
        for start in range(0, data.num_examples, size)
    ]
    parts = [runner.invoke(batch) for batch in fed]  # also allocates and traces
    outputs = {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}
    timed = fed[:-1] if len(fed) > 1 and data.num_examples % size else fed
    examples = min(data.num_examples, len(timed) * size)
    runner.invoke(timed[0])
    passes, started = 0, time.perf_counter()
    while passes < _MAX_PASSES:
        for batch in timed:
            runner.invoke(batch)
        passes += 1
        if time.perf_counter() - started >= settings.throughput_seconds:
            break
    elapsed = time.perf_counter() - started
    return outputs, passes * examples / max(elapsed, 1e-9)


def _latency_examples(data: EvalData, settings: EvalSettings) -> list[dict[str, np.ndarray]]:
    """The single-example batches latency cycles through (the split's first ones)."""
    count = min(data.num_examples, settings.latency_runs)
    return [_slice(data.features, index, index + 1) for index in range(count)]


def _scores_classes(outputs: np.ndarray) -> bool:
    return outputs.ndim >= 2 and outputs.shape[-1] > 1


def score(
    outputs: Mapping[str, np.ndarray],
    data: EvalData,
    reference: Mapping[str, np.ndarray] | None = None,
) -> tuple[dict[str, float], dict[str, float], dict[str, float] | None, float | None]:
    """(accuracy per head, MAE per head, agreement per output, max |diff|) of ``outputs``.

    Only outputs named after a label are scored against it: an output scoring classes
    (last dimension above 1) for a label holding one class id per example by top-1
    accuracy, any other by mean absolute error. Agreement covers every output that
    scores classes.
    """
    accuracy, mae = {}, {}
    for name, truth in data.labels.items():
        if name not in outputs:
            continue
        predicted = np.asarray(outputs[name])
        if _scores_classes(predicted) and truth.size == len(truth):
            hits = np.argmax(predicted, axis=-1) == truth.reshape(len(truth))
            accuracy[name] = float(np.mean(hits))
        else:
            mae[name] = float(np.mean(np.abs(predicted - truth.reshape(predicted.shape))))
    if reference is None:
        return accuracy, mae, None, None
    missing = sorted(set(reference) - set(outputs))
    if missing:
        raise CompressionError(f"the model lacks the reference model's outputs {missing}")
    agreement, largest = {}, 0.0
    for name, expected in reference.items():
        actual = np.asarray(outputs[name], dtype=np.float64)
        expected = np.asarray(expected, dtype=np.float64)
        if actual.shape != expected.shape:
            raise CompressionError(
                f"output {name!r} has shape {list(actual.shape)}, the reference "
                f"{list(expected.shape)}"
            )
        largest = max(largest, float(np.max(np.abs(actual - expected), initial=0.0)))
        if _scores_classes(actual):
            same = np.argmax(actual, axis=-1) == np.argmax(expected, axis=-1)
            agreement[name] = float(np.mean(same))
    return accuracy, mae, agreement, largest


def _evaluate(
    runner: Runner,
    data: EvalData,
    sizes: tuple[int, int],
    reference: Mapping[str, np.ndarray] | None,
    settings: EvalSettings,
    latencies: np.ndarray | None = None,
) -> Evaluation:
    """Score ``runner`` on ``data``; its latencies are timed here unless given."""
    outputs, throughput = _predict(runner, data, settings)
    accuracy, mae, agreement, largest = score(outputs, data, reference)
    if latencies is None:
        examples = _latency_examples(data, settings)
        latencies = interleaved_latencies_ms({"model": runner}, examples, settings)["model"]
    return Evaluation(
        examples=data.num_examples,
        accuracy=accuracy,
        mae=mae,
        agreement=agreement,
        max_abs_diff=largest,
        size_bytes=sizes[0],
        gzip_bytes=sizes[1],
        latency_p50_ms=float(np.percentile(latencies, 50)),
        latency_p99_ms=float(np.percentile(latencies, 99)),
        latency_mean_ms=float(np.mean(latencies)),
        throughput=float(throughput),
        outputs=outputs,
    )


def _data_for(
    dataset: str | Path | EvalData,
    split: str,
    signature: Callable[[], Mapping[str, Any]],
    settings: EvalSettings,
    *,
    raw: bool = False,
) -> EvalData:
    if isinstance(dataset, EvalData):
        return dataset
    return load_eval_data(dataset, signature(), split, max_examples=settings.max_examples, raw=raw)


def evaluate_tflite(
    tflite: bytes,
    dataset: str | Path | EvalData,
    split: str = "test",
    *,
    reference_outputs: Mapping[str, np.ndarray] | None = None,
    settings: EvalSettings | None = None,
) -> Evaluation:
    """Run a TFLite flatbuffer over ``split`` of a dataset directory (or loaded data)."""
    settings = settings or EvalSettings()
    runner = TFLiteRunner(tflite, settings.num_threads)
    data = _data_for(dataset, split, runner.signature, settings)
    sizes = (len(tflite), gzip_size(tflite))
    return _evaluate(runner, data, sizes, reference_outputs, settings)


def evaluate_tflite_models(
    tflites: Mapping[str, bytes],
    data: EvalData,
    *,
    reference: str,
    settings: EvalSettings | None = None,
) -> dict[str, Evaluation]:
    """Measure several flatbuffers like for like, by name.

    All run in the same LiteRT runner with the same threads; their batch-1 latencies are
    timed in interleaved rounds (:mod:`compression.latency`) so their ratios compare the
    models and not the moments they were timed at. Agreement is taken against the outputs
    of ``tflites[reference]`` (the float32 conversion), whose own agreement is None.
    """
    settings = settings or EvalSettings()
    if reference not in tflites:
        raise CompressionError(f"the reference model {reference!r} is not among those measured")
    runners = {
        name: TFLiteRunner(flatbuffer, settings.num_threads) for name, flatbuffer in tflites.items()
    }
    latencies = interleaved_latencies_ms(runners, _latency_examples(data, settings), settings)
    order = [reference] + [name for name in tflites if name != reference]
    evaluations: dict[str, Evaluation] = {}
    for name in order:
        flatbuffer = tflites[name]
        outputs = None if name == reference else evaluations[reference].outputs
        evaluations[name] = _evaluate(
            runners[name],
            data,
            (len(flatbuffer), gzip_size(flatbuffer)),
            outputs,
            settings,
            latencies[name],
        )
    return {name: evaluations[name] for name in tflites}


def evaluate_saved_model(
    directory: str | Path,
    dataset: str | Path | EvalData,
    split: str = "test",
    *,
    reference_outputs: Mapping[str, np.ndarray] | None = None,
    settings: EvalSettings | None = None,
) -> Evaluation:
    """Run a SavedModel's ``serving_default`` over ``split``; sizes cover its files.

    A version that preprocesses in its graph is given the split's raw features, as its
    clients send them.
    """
    from compression.loading import read_signature, served_raw_inputs

    settings = settings or EvalSettings()
    runner = SavedModelRunner(directory)
    raw = bool(served_raw_inputs(directory))
    data = _data_for(dataset, split, lambda: read_signature(directory), settings, raw=raw)
    sizes = (directory_size(directory), directory_gzip_size(directory))
    return _evaluate(runner, data, sizes, reference_outputs, settings)


def cpu_description() -> dict[str, Any]:
    """Where the timings were taken, so a reader can judge them."""
    return {"cpu_count": os.cpu_count(), "load_average": list(os.getloadavg())}
