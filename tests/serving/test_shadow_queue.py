"""Mirrored (shadow) copies queue apart from the requests clients wait for: a shadow
version that stalls, or is flooded, neither delays nor refuses real requests to it."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from serving.config import GatewayConfig
from serving.routing import ModelRouting
from serving.tensors import numpy_to_tensor_proto
from tests.support.gateways import GatewayThread
from tests.support.serving_models import MODEL_NAME, ServingModel, sample_inputs
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(180)

MODEL = MODEL_NAME
MIRRORED = 12  # real requests to stable, each copied to the canary


def request(*, version: int | None = None, fill: float = 0.0) -> predict_pb2.PredictRequest:
    made = predict_pb2.PredictRequest()
    made.model_spec.name = MODEL
    if version is not None:
        made.model_spec.version.value = version
    for name, array in sample_inputs(1).items():
        value = np.full_like(array, fill) if name == "image" else array
        made.inputs[name].CopyFrom(numpy_to_tensor_proto(value))
    return made


@pytest.fixture
def stalled_shadow(
    tmp_path, serving_model: ServingModel
) -> Iterator[tuple[GatewayThread, threading.Event]]:  # noqa: ANN001
    """Stable 1 mirrors every request to canary 2, whose model stalls on the mirrored
    inputs (blank images) until released; one batch thread, one row per batch."""
    root = tmp_path / "models"
    for version in (1, 2):
        serving_model.publish(root, version)
    config = GatewayConfig.model_validate(
        {
            "models": {
                MODEL: {
                    "version_policy": {"kind": "all"},
                    "batching": {
                        "max_batch_size": 1,
                        "num_batch_threads": 1,
                        "max_enqueued_batches": 4,
                    },
                }
            }
        }
    )
    release = threading.Event()
    with GatewayThread(root, config) as thread:
        canary = thread.gateway.repository.servable(MODEL, 2)
        run = canary.run

        def stalling(signature: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            if not inputs["image"].any():
                assert release.wait(120), "the test never released the shadow"
            return run(signature, inputs)

        canary.run = stalling  # type: ignore[method-assign]
        routing = ModelRouting(
            labels={"stable": 1, "canary": 2}, shadow={"label": "canary", "percent": 100}
        )
        thread.run(thread.gateway.set_model_routing(MODEL, routing))
        try:
            yield thread, release
        finally:
            release.set()


def test_a_stalled_shadow_neither_delays_nor_refuses_real_requests(stalled_shadow) -> None:  # noqa: ANN001
    server, release = stalled_shadow
    shed = {"model": MODEL, "version": "2", "code": "UNAVAILABLE"}
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        for _ in range(MIRRORED):
            assert stub.Predict(request(), timeout=30).model_spec.version.value == 1
        # The shadow queue holds one running and one queued copy: the rest were shed.
        wait_until(
            lambda: server.metric("slipway_gateway_shadow_requests_total", shed) > 0,
            "a mirrored copy to be shed",
        )
        # Real requests to the stalled canary version go through their own queue.
        for _ in range(5):
            answer = stub.Predict(request(version=2, fill=0.5), timeout=30)
            assert answer.model_spec.version.value == 2
        shed_copies = server.metric("slipway_gateway_shadow_requests_total", shed)
        assert 0 < shed_copies <= MIRRORED - 2
        release.set()
        ok = {"model": MODEL, "version": "2", "code": "OK"}
        wait_until(
            lambda: (
                server.metric("slipway_gateway_shadow_requests_total", ok) + shed_copies >= MIRRORED
            ),
            "every mirrored copy to be answered or shed",
        )
