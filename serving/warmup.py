"""Run a freshly loaded model before it takes traffic.

The first call of a TensorFlow function traces and allocates, and a TFLite interpreter
allocates its tensors; paid by a user's request, that is a latency spike on every new
version. TensorFlow Serving replays the requests recorded in
``assets.extra/tf_serving_warmup_requests`` (a TFRecord of ``PredictionLog``); versions
without that file get one generated request per signature: batch 1, zeros or empty
strings, free dimensions set to 1.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from serving.backends.base import Backend, find_signature
from serving.errors import InvalidArgument
from serving.signature import DEFAULT_SIGNATURE, STRING, Signature
from serving.validation import validate_inputs

WARMUP_FILE = ("assets.extra", "tf_serving_warmup_requests")
MAX_WARMUP_RECORDS = 1000  # TensorFlow Serving's limit as well

log = logging.getLogger(__name__)


def warm_up(backend: Backend, version_dir: Path) -> int:
    """Warm ``backend`` up; returns how many requests ran. Failures propagate, since a
    model that cannot answer its own warm-up must not become AVAILABLE."""
    recorded = Path(version_dir).joinpath(*WARMUP_FILE)
    if recorded.is_file():
        count = replay_warmup_requests(backend, recorded)
        if count:
            return count
    count = 0
    for name, signature in backend.signatures.items():
        inputs = generated_inputs(signature)
        if inputs is not None:
            backend.run(name, inputs)
            count += 1
    return count


def generated_inputs(signature: Signature) -> dict[str, np.ndarray] | None:
    """One example per input (None if some input has an unknown rank)."""
    inputs = {}
    for name, spec in signature.inputs.items():
        if spec.shape is None:
            return None
        shape = tuple(1 if d is None else d for d in spec.shape)
        if spec.dtype is STRING:
            array = np.empty(shape, dtype=object)
            array.fill(b"")
        else:
            array = np.zeros(shape, dtype=spec.dtype)
        inputs[name] = array
    return inputs


def replay_warmup_requests(backend: Backend, path: Path) -> int:
    """Run the ``predict_log`` requests recorded in ``path``; other kinds are skipped."""
    # The protos load the tensorflow package: only versions with recorded requests pay.
    from tensorflow_serving.apis import prediction_log_pb2

    from serving.tensors import protos_to_inputs

    count = 0
    for index, record in enumerate(_records(path)):
        entry = prediction_log_pb2.PredictionLog.FromString(record)
        if entry.WhichOneof("log_type") != "predict_log":
            log.warning(
                "%s: record %d is a %s, only predict_log is replayed",
                path,
                index,
                entry.WhichOneof("log_type"),
            )
            continue
        request = entry.predict_log.request
        name = request.model_spec.signature_name or DEFAULT_SIGNATURE
        signature = find_signature(backend.signatures, name)
        try:
            inputs = protos_to_inputs(request.inputs, signature)
            backend.run(name, validate_inputs(inputs, signature))
        except InvalidArgument as exc:
            raise InvalidArgument(f"{path}: record {index}: {exc.message}") from None
        count += 1
    return count


def _records(path: Path) -> Iterator[bytes]:
    """The file's records, CRC-checked by TensorFlow's reader."""
    import tensorflow as tf

    try:
        for record in tf.data.TFRecordDataset(str(path)).take(MAX_WARMUP_RECORDS):
            yield record.numpy()
    except tf.errors.OpError as exc:
        raise InvalidArgument(f"{path}: not a readable TFRecord file: {exc.message}") from None
