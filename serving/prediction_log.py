"""A sampled share of requests and answers, as TensorFlow Serving ``PredictionLog`` files.

The files are TFRecord files of ``tensorflow.serving.PredictionLog`` records, the format
TF Serving's request logger writes and TFX reads (BulkInferrer, TFDV), so logged traffic
can be re-run, analysed or labelled with the tools that already read it. Each record
holds the request and the answer as TF Serving's protos (a REST request is logged as the
``PredictRequest`` a gRPC client would have sent) and ``log_metadata``: the model spec
that answered (name, version, signature), the sampling rate and the time. LogMetadata
has no request-id field, so the request id goes in ``request_origin``, which TF Serving
leaves empty: it is what joins a record with the label sent later.

Sampling is decided by the request id's hash (``sample`` is the fraction logged), so a
client that resends an id gets the same decision, and tests can predict it exactly.
Logging never slows a request down: the request path only puts the served arrays in a
bounded queue (a full queue drops the record and counts it); protos are built and
written on a thread of their own. A file is written as ``*.tfrecord.part`` and renamed
to ``*.tfrecord`` once closed — when it reaches ``max_file_bytes``, is
``max_file_age_s`` old, or the gateway stops — so readers only ever see whole files.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import tensorflow as tf
from google.protobuf.message import Message
from tensorflow.core.example.example_pb2 import Example
from tensorflow_serving.apis import model_pb2, prediction_log_pb2

from contracts.yaml_config import ConfigError
from serving.config import PredictionLogConfig
from serving.inference_results import classification_proto, regression_proto
from serving.metrics import GatewayMetrics
from serving.request_id import id_fraction
from serving.tensors import numpy_to_tensor_proto

logger = logging.getLogger(__name__)

SUFFIX = ".tfrecord"
PART_SUFFIX = ".part"
# TFRecord framing per record: length (8), its CRC (4) and the data's CRC (4).
_RECORD_OVERHEAD = 16
CLOSE_TIMEOUT_S = 30.0

FillLog = Callable[[prediction_log_pb2.PredictionLog, model_pb2.ModelSpec], None]


def fill_predict(inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray]) -> FillLog:
    """A Predict call's ``predict_log``: the inputs the version ran on, the outputs served."""

    def fill(log: prediction_log_pb2.PredictionLog, spec: model_pb2.ModelSpec) -> None:
        request, response = log.predict_log.request, log.predict_log.response
        request.model_spec.CopyFrom(spec)
        response.model_spec.CopyFrom(spec)
        for name, array in inputs.items():
            request.inputs[name].CopyFrom(numpy_to_tensor_proto(array))
        for name, array in outputs.items():
            response.outputs[name].CopyFrom(numpy_to_tensor_proto(array))

    return fill


def fill_classify(
    examples: Sequence[Example], context: Example | None, classes: list[list[tuple[str, float]]]
) -> FillLog:
    """A Classify call's ``classify_log``."""
    return _fill_examples("classify_log", examples, context, lambda: classification_proto(classes))


def fill_regress(
    examples: Sequence[Example], context: Example | None, values: list[float]
) -> FillLog:
    """A Regress call's ``regress_log``."""
    return _fill_examples("regress_log", examples, context, lambda: regression_proto(values))


def _fill_examples(
    field: str, examples: Sequence[Example], context: Example | None, result: Callable[[], Message]
) -> FillLog:
    """Fill the Classify or Regress log ``field``: the examples in, ``result()`` out."""

    def fill(log: prediction_log_pb2.PredictionLog, spec: model_pb2.ModelSpec) -> None:
        entry = getattr(log, field)
        entry.request.model_spec.CopyFrom(spec)
        if context is None:
            entry.request.input.example_list.examples.extend(examples)
        else:
            listed = entry.request.input.example_list_with_context
            listed.examples.extend(examples)
            listed.context.CopyFrom(context)
        entry.response.model_spec.CopyFrom(spec)
        entry.response.result.CopyFrom(result())

    return fill


@dataclass(frozen=True)
class _Pending:
    """A sampled answer waiting for the writer thread."""

    request_id: str
    model: str
    version: int
    signature_name: str
    timestamp: float
    fill: FillLog


class PredictionLogWriter:
    """Samples answers and writes them to rotating TFRecord files on its own thread."""

    def __init__(
        self,
        directory: Path,
        metrics: GatewayMetrics,
        *,
        sample: float,
        max_file_bytes: int,
        max_file_age_s: float,
        queue_size: int,
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.sample = sample
        self._metrics = metrics
        self._max_file_bytes = max_file_bytes
        self._max_file_age_s = max_file_age_s
        self._queue: queue.Queue[_Pending | None] = queue.Queue(queue_size)
        self._writer: tf.io.TFRecordWriter | None = None
        self._path: Path | None = None
        self._file_bytes = 0
        self._file_deadline = 0.0
        self._files = 0
        self._thread = threading.Thread(target=self._run, name="prediction-log", daemon=True)
        self._thread.start()

    def sampled(self, request_id: str) -> bool:
        return id_fraction(request_id) < self.sample

    def submit(
        self, request_id: str, model: str, version: int, signature_name: str, fill: FillLog
    ) -> None:
        """Queue a sampled answer for writing; never blocks (a full queue drops it)."""
        if not self.sampled(request_id):
            return
        pending = _Pending(request_id, model, version, signature_name, time.time(), fill)
        try:
            self._queue.put_nowait(pending)
        except queue.Full:
            self._metrics.count_prediction_log("dropped")

    def close(self) -> None:
        """Write what is queued, close the current file and stop the thread."""
        self._queue.put(None)
        self._thread.join(CLOSE_TIMEOUT_S)
        if self._thread.is_alive():
            logger.error("prediction log: still writing after %.0f s; giving up", CLOSE_TIMEOUT_S)

    def _run(self) -> None:
        while True:
            timeout = None
            if self._writer is not None:
                timeout = max(0.0, self._file_deadline - time.monotonic())
            try:
                pending = self._queue.get(timeout=timeout)
            except queue.Empty:
                self._finish_file()  # the file is old enough: hand it to readers
                continue
            if pending is None:
                self._finish_file()
                return
            self._write(pending)

    def _write(self, pending: _Pending) -> None:
        try:
            record = _record(pending, self.sample).SerializeToString()
            if self._writer is None:
                self._open_file()
            assert self._writer is not None
            self._writer.write(record)
            self._file_bytes += len(record) + _RECORD_OVERHEAD
        except Exception:
            logger.exception("prediction log: cannot write request %s", pending.request_id)
            self._metrics.count_prediction_log("failed")
            return
        self._metrics.count_prediction_log("written")
        if self._file_bytes >= self._max_file_bytes or time.monotonic() >= self._file_deadline:
            self._finish_file()

    def _open_file(self) -> None:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
        self._files += 1
        name = f"predictions-{stamp}-{os.getpid()}-{self._files:05d}{SUFFIX}{PART_SUFFIX}"
        self._path = self.directory / name
        self._writer = tf.io.TFRecordWriter(str(self._path))
        self._file_bytes = 0
        self._file_deadline = time.monotonic() + self._max_file_age_s

    def _finish_file(self) -> None:
        if self._writer is None or self._path is None:
            return
        try:
            self._writer.close()
            self._path.rename(self._path.with_suffix(""))
        except Exception:
            logger.exception("prediction log: cannot close %s", self._path)
        self._writer, self._path = None, None


def open_prediction_log(
    settings: PredictionLogConfig, metrics: GatewayMetrics
) -> PredictionLogWriter | None:
    """The writer ``settings`` ask for, or None when logging is off; a directory that
    cannot be created is a ``ConfigError`` (the operator's to fix), not a traceback."""
    if settings.sample <= 0 or settings.directory is None:
        return None
    try:
        return PredictionLogWriter(
            settings.directory,
            metrics,
            sample=settings.sample,
            max_file_bytes=settings.max_file_bytes,
            max_file_age_s=settings.max_file_age_s,
            queue_size=settings.queue_size,
        )
    except OSError as exc:
        raise ConfigError(
            f"prediction_log.directory: cannot create {settings.directory}: {exc.strerror}"
        ) from None


def _record(pending: _Pending, sample: float) -> prediction_log_pb2.PredictionLog:
    log = prediction_log_pb2.PredictionLog()
    metadata = log.log_metadata
    metadata.model_spec.name = pending.model
    metadata.model_spec.version.value = pending.version
    metadata.model_spec.signature_name = pending.signature_name
    metadata.sampling_config.sampling_rate = sample
    metadata.timestamp_secs = int(pending.timestamp)
    metadata.request_origin = pending.request_id
    pending.fill(log, metadata.model_spec)
    return log
