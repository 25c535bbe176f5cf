"""Backends run real models: SavedModel and TFLite agree with Keras, stay correct from
many threads, and a remote TensorFlow Serving is reached over PredictionService with
deadlines and status codes carried through."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    predict_pb2,
    prediction_log_pb2,
    prediction_service_pb2_grpc,
)

from serving.backends import Backend, open_backend
from serving.backends.remote import RemoteBackend
from serving.backends.savedmodel import SavedModelBackend
from serving.backends.tflite import TFLiteBackend
from serving.errors import DeadlineExceeded, NotFound, Unavailable
from serving.signature import Signature
from serving.tensors import numpy_to_tensor_proto, tensor_proto_to_numpy
from serving.warmup import warm_up
from tests.support.serving_models import ServingModel, sample_inputs
from tests.support.warmup import Recording

SIGNATURE = "serving_default"


@pytest.fixture(scope="module")
def savedmodel(serving_model: ServingModel) -> Iterator[SavedModelBackend]:
    backend = SavedModelBackend(serving_model.saved_model_dir)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def tflite(
    tmp_path_factory: pytest.TempPathFactory, serving_model: ServingModel
) -> Iterator[TFLiteBackend]:
    directory = tmp_path_factory.mktemp("tflite")
    serving_model.write_version(directory, kind="tflite", manifest=False)
    backend = TFLiteBackend(directory / "model.tflite", num_threads=1)
    yield backend
    backend.close()


def expected_signature(serving_model: ServingModel) -> Signature:
    return Signature.from_json(serving_model.signature_json())


def test_savedmodel_signature_is_the_exported_one(
    savedmodel: SavedModelBackend, serving_model: ServingModel
) -> None:
    signature = savedmodel.signatures[SIGNATURE]
    assert signature == expected_signature(serving_model)
    assert signature.inputs["image"].tensor_name == "serving_default_image:0"


def test_tflite_signature_is_the_exported_one(
    tflite: TFLiteBackend, serving_model: ServingModel
) -> None:
    assert tflite.signatures[SIGNATURE] == expected_signature(serving_model)


def test_savedmodel_predicts_like_keras(
    savedmodel: SavedModelBackend, serving_model: ServingModel
) -> None:
    inputs = sample_inputs(5)
    outputs = savedmodel.run(SIGNATURE, inputs)
    expected = serving_model.keras_outputs(inputs)
    assert set(outputs) == {"label", "value"}
    for name in expected:
        np.testing.assert_allclose(outputs[name], expected[name], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("batch", [1, 5, 3])
def test_tflite_predicts_like_keras_at_any_batch_size(
    tflite: TFLiteBackend, batch: int, serving_model: ServingModel
) -> None:
    inputs = sample_inputs(batch, seed=batch)
    outputs = tflite.run(SIGNATURE, inputs)
    expected = serving_model.keras_outputs(inputs)
    for name in expected:
        assert outputs[name].shape == expected[name].shape
        np.testing.assert_allclose(outputs[name], expected[name], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend_name", ["savedmodel", "tflite"])
def test_concurrent_calls_get_their_own_answers(
    backend_name: str, request: pytest.FixtureRequest
) -> None:
    backend: Backend = request.getfixturevalue(backend_name)
    batches = [sample_inputs(1 + i % 4, seed=i) for i in range(24)]
    expected = [backend.run(SIGNATURE, batch) for batch in batches]
    start = threading.Barrier(6)

    def call(index: int) -> dict[str, np.ndarray]:
        if index < 6:
            start.wait(timeout=60)
        return backend.run(SIGNATURE, batches[index])

    with futures.ThreadPoolExecutor(6) as pool:
        results = list(pool.map(call, range(len(batches))))
    for got, want in zip(results, expected, strict=True):
        for name in want:
            np.testing.assert_array_equal(got[name], want[name])


@pytest.mark.parametrize("backend_name", ["savedmodel", "tflite"])
def test_empty_batch(backend_name: str, request: pytest.FixtureRequest) -> None:
    backend: Backend = request.getfixturevalue(backend_name)
    outputs = backend.run(SIGNATURE, sample_inputs(0))
    assert outputs["label"].shape == (0, 10) and outputs["value"].shape == (0, 1)


@pytest.mark.parametrize("backend_name", ["savedmodel", "tflite"])
def test_unknown_signature_and_expired_deadline(
    backend_name: str, request: pytest.FixtureRequest
) -> None:
    backend: Backend = request.getfixturevalue(backend_name)
    with pytest.raises(NotFound, match="available signatures: serving_default"):
        backend.run("classify", sample_inputs(1))
    with pytest.raises(DeadlineExceeded):
        backend.run(SIGNATURE, sample_inputs(1), timeout=0)


@pytest.mark.parametrize("kind", ["savedmodel", "tflite"])
def test_open_backend_picks_the_format_and_closed_backends_refuse(
    kind: str, tmp_path: Path, serving_model: ServingModel
) -> None:
    serving_model.write_version(tmp_path, kind=kind, manifest=False)
    backend = open_backend(tmp_path)
    assert isinstance(backend, SavedModelBackend if kind == "savedmodel" else TFLiteBackend)
    assert isinstance(backend, Backend)
    backend.close()
    with pytest.raises(Unavailable, match="unloaded"):
        backend.run(SIGNATURE, sample_inputs(1))


def test_open_backend_needs_a_model(tmp_path: Path) -> None:
    with pytest.raises(NotFound, match="no saved_model.pb or model.tflite"):
        open_backend(tmp_path)


# -- warm-up ----------------------------------------------------------------------------


def test_no_warmup_file_means_no_warmup_requests(
    savedmodel: SavedModelBackend, tmp_path: Path
) -> None:
    # TF Serving makes no request up: a made-up input is not one the model is known to take.
    recording = Recording(savedmodel)
    assert warm_up(recording, tmp_path) == 0
    assert recording.calls == []


def test_recorded_warmup_requests_are_replayed(
    savedmodel: SavedModelBackend, tmp_path: Path
) -> None:
    path = tmp_path / "assets.extra" / "tf_serving_warmup_requests"
    path.parent.mkdir()
    with tf.io.TFRecordWriter(str(path)) as writer:
        for batch in (3, 2):
            request = predict_pb2.PredictRequest()
            request.model_spec.name = "digits"
            for name, array in sample_inputs(batch).items():
                request.inputs[name].CopyFrom(numpy_to_tensor_proto(array))
            log = prediction_log_pb2.PredictionLog(
                predict_log=prediction_log_pb2.PredictLog(request=request)
            )
            writer.write(log.SerializeToString())
    recording = Recording(savedmodel)
    assert warm_up(recording, tmp_path) == 2
    assert [inputs["image"].shape[0] for _, inputs in recording.calls] == [3, 2]


def test_unreadable_warmup_file_fails_the_warmup(
    savedmodel: SavedModelBackend, tmp_path: Path
) -> None:
    path = tmp_path / "assets.extra" / "tf_serving_warmup_requests"
    path.parent.mkdir()
    path.write_bytes(b"\x01\x02\x03 not a tfrecord")
    with pytest.raises(Exception, match="tf_serving_warmup_requests"):
        warm_up(Recording(savedmodel), tmp_path)


# -- remote TensorFlow Serving ------------------------------------------------------------


class FakeModelServer(prediction_service_pb2_grpc.PredictionServiceServicer):
    """A PredictionService answering from a local backend, as TensorFlow Serving would."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.requests: list[predict_pb2.PredictRequest] = []
        self.peers: list[str] = []
        self.release = threading.Event()  # a "slow" model waits for this

    def Predict(self, request: predict_pb2.PredictRequest, context: grpc.ServicerContext):  # noqa: N802
        self.requests.append(request)
        self.peers.append(context.peer())
        if request.model_spec.name != "digits":
            context.abort(
                grpc.StatusCode.NOT_FOUND, f"Servable not found: {request.model_spec.name}"
            )
        if request.model_spec.version_label == "slow":
            self.release.wait(30)
        inputs = {k: tensor_proto_to_numpy(v, k) for k, v in request.inputs.items()}
        outputs = self.backend.run(request.model_spec.signature_name or SIGNATURE, inputs)
        response = predict_pb2.PredictResponse()
        response.model_spec.CopyFrom(request.model_spec)
        for name, array in outputs.items():
            response.outputs[name].CopyFrom(numpy_to_tensor_proto(array))
        return response

    def GetModelMetadata(self, request, context):  # noqa: N802
        definitions = get_model_metadata_pb2.SignatureDefMap()
        for name, signature in self.backend.signatures.items():
            definitions.signature_def[name].CopyFrom(signature.to_proto())
        definitions.signature_def["__saved_model_init_op"].method_name = ""
        response = get_model_metadata_pb2.GetModelMetadataResponse()
        response.model_spec.name = request.model_spec.name
        response.metadata["signature_def"].Pack(definitions)
        return response


@pytest.fixture(scope="module")
def model_server(savedmodel: SavedModelBackend) -> Iterator[tuple[str, FakeModelServer]]:
    servicer = FakeModelServer(savedmodel)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", servicer
    servicer.release.set()
    server.stop(grace=None)


def test_remote_backend_reads_signatures_and_predicts(
    model_server: tuple[str, FakeModelServer], savedmodel: SavedModelBackend
) -> None:
    target, servicer = model_server
    backend = RemoteBackend(target, "digits", 7, pool_size=2)
    try:
        assert list(backend.signatures) == [SIGNATURE]
        assert backend.signatures[SIGNATURE] == savedmodel.signatures[SIGNATURE]
        inputs = sample_inputs(3)
        outputs = backend.run(SIGNATURE, inputs, timeout=10)
        local = savedmodel.run(SIGNATURE, inputs)
        for name in local:
            np.testing.assert_array_equal(outputs[name], local[name])
        spec = servicer.requests[-1].model_spec
        assert (spec.name, spec.version.value, spec.signature_name) == ("digits", 7, SIGNATURE)
    finally:
        backend.close()


def test_remote_backend_spreads_calls_over_its_channels(
    model_server: tuple[str, FakeModelServer],
) -> None:
    target, servicer = model_server
    backend = RemoteBackend(target, "digits", "stable", pool_size=3)
    try:
        first = len(servicer.peers)
        for _ in range(6):
            backend.run(SIGNATURE, sample_inputs(1), timeout=10)
        assert len(set(servicer.peers[first:])) == 3
        assert servicer.requests[-1].model_spec.version_label == "stable"
    finally:
        backend.close()
    with pytest.raises(Unavailable, match="closed"):
        backend.run(SIGNATURE, sample_inputs(1))


def test_remote_deadline_is_propagated(model_server: tuple[str, FakeModelServer]) -> None:
    target, _ = model_server
    backend = RemoteBackend(target, "digits", "slow", pool_size=1)
    try:
        with pytest.raises(DeadlineExceeded, match=target):
            backend.run(SIGNATURE, sample_inputs(1), timeout=0.3)
    finally:
        backend.close()


def test_remote_status_codes_come_back_as_serving_errors(
    model_server: tuple[str, FakeModelServer],
) -> None:
    target, _ = model_server
    backend = RemoteBackend(target, "other")
    try:
        with pytest.raises(NotFound, match="Servable not found: other"):
            backend.run(SIGNATURE, sample_inputs(1), timeout=10)
    finally:
        backend.close()


def test_unreachable_server_is_unavailable() -> None:
    with pytest.raises(Unavailable):
        RemoteBackend("127.0.0.1:1", "digits", metadata_timeout=5)
