"""Run a freshly loaded model before it takes traffic, as TensorFlow Serving does.

The first call of a TensorFlow function traces and allocates, and a TFLite interpreter
allocates its tensors; paid by a user's request, that is a latency spike on every new
version. TensorFlow Serving (``saved_model_warmup.cc``) replays the requests recorded in
``assets.extra/tf_serving_warmup_requests``, a TFRecord of ``PredictionLog``: predict,
classify, regress and multi-inference records, each must succeed, more than 1000 records
or a ``session_run_log`` fail the load. Versions without that file are not warmed up.

No request is made up for them: a made-up input is not one the model is known to take.
Zeros and empty strings fail any graph that parses, looks up or checks its input (a
``serialized tf.Example`` input with required features: "Feature: x ... is required but
could not be found"), and a failed warm-up keeps the version out, so a model TF Serving
loads would never load here.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc

from serving.backends.base import Backend, find_signature
from serving.errors import InvalidArgument, ServingError
from serving.signature import DEFAULT_SIGNATURE
from serving.validation import validate_inputs

WARMUP_FILE = ("assets.extra", "tf_serving_warmup_requests")
MAX_WARMUP_RECORDS = 1000  # TensorFlow Serving's limit as well

log = logging.getLogger(__name__)


def warm_up(backend: Backend, version_dir: Path) -> int:
    """Replay ``version_dir``'s recorded warm-up requests on ``backend``; returns how many
    records ran (0 without the file). Failures propagate, since a model that cannot
    answer its own warm-up must not become AVAILABLE."""
    recorded = Path(version_dir).joinpath(*WARMUP_FILE)
    if not recorded.is_file():
        log.debug("%s: no warm-up requests recorded", version_dir)
        return 0
    return replay_warmup_requests(backend, recorded)


def replay_warmup_requests(backend: Backend, path: Path) -> int:
    """Run every request recorded in ``path`` (a TFRecord of ``PredictionLog``)."""
    # The protos load the tensorflow package: only versions with recorded requests pay.
    from google.protobuf.message import DecodeError
    from tensorflow_serving.apis import prediction_log_pb2

    count = 0
    for index, record in enumerate(_records(path)):
        if index >= MAX_WARMUP_RECORDS:
            raise InvalidArgument(
                f"{path}: number of warm-up records exceeds the maximum ({MAX_WARMUP_RECORDS})"
            )
        try:
            entry = prediction_log_pb2.PredictionLog.FromString(record)
        except DecodeError:
            raise InvalidArgument(f"{path}: record {index} is not a PredictionLog") from None
        try:
            _replay(backend, entry)
        except ServingError as exc:
            raise ServingError.for_code(
                exc.code, f"{path}: record {index}: {exc.message}"
            ) from None
        count += 1
    return count


def _replay(backend: Backend, entry: Any) -> None:
    """Run one ``PredictionLog`` the way its API would (answers are discarded)."""
    from serving.tensors import protos_to_inputs

    kind = entry.WhichOneof("log_type")
    if kind == "predict_log":
        request = entry.predict_log.request
        name = request.model_spec.signature_name or DEFAULT_SIGNATURE
        signature = find_signature(backend.signatures, name)
        _run(backend, name, protos_to_inputs(request.inputs, signature))
    elif kind in ("classify_log", "regress_log"):
        request = getattr(entry, kind).request
        _run_examples(backend, request.model_spec.signature_name, request.input)
    elif kind == "multi_inference_log":
        request = entry.multi_inference_log.request
        if not request.tasks:
            raise InvalidArgument("MultiInferenceRequest: no tasks")
        for task in request.tasks:
            _run_examples(backend, task.model_spec.signature_name, request.input)
    elif kind == "session_run_log":
        raise ServingError(
            grpc.StatusCode.UNIMPLEMENTED, "session_run_log is not supported for warm-up"
        )
    # A record with no request at all is skipped, as TF Serving skips it.


def _run_examples(backend: Backend, signature_name: str, input_proto: Any) -> None:
    from serving.example_inputs import examples_to_inputs

    name = signature_name or DEFAULT_SIGNATURE
    signature = find_signature(backend.signatures, name)
    which = input_proto.WhichOneof("kind")
    if which == "example_list":
        examples, context = input_proto.example_list.examples, None
    elif which == "example_list_with_context":
        listed = input_proto.example_list_with_context
        examples, context = listed.examples, listed.context
    else:
        raise InvalidArgument("input: expected example_list or example_list_with_context")
    _run(backend, name, examples_to_inputs(examples, context, signature))


def _run(backend: Backend, name: str, inputs: Any) -> None:
    backend.run(name, validate_inputs(inputs, find_signature(backend.signatures, name)))


def _records(path: Path) -> Iterator[bytes]:
    """The file's records, CRC-checked by TensorFlow's reader."""
    import tensorflow as tf

    try:
        for record in tf.data.TFRecordDataset(str(path)).take(MAX_WARMUP_RECORDS + 1):
            yield record.numpy()
    except tf.errors.OpError as exc:
        raise InvalidArgument(f"{path}: not a readable TFRecord file: {exc.message}") from None
