"""The REST API against hostile or unlucky clients: malformed URLs and versions, clients
hanging up mid-body, and bodies large enough to stall the event loop gRPC shares."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tensorflow as tf
from grpc_health.v1 import health_pb2, health_pb2_grpc

from serving.config import GatewayConfig
from serving.errors import InvalidArgument
from serving.rest_api import json_to_feature
from tests.support.gateways import GatewayThread
from tests.support.http import http
from tests.support.serving_models import ServingModel
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(300)

WIDTH = 1000


def write_sum_model(directory: Path) -> None:
    """``x`` float32 [-1, WIDTH] -> ``total`` [-1]: a big request with a small answer."""

    class Model(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, WIDTH], tf.float32, name="x")])
        def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"total": tf.reduce_sum(x, axis=1)}

    module = Model()
    tf.saved_model.save(module, str(directory), signatures={"serving_default": module.serve})


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, serving_model: ServingModel
) -> Iterator[GatewayThread]:
    root = tmp_path_factory.mktemp("hardening") / "models"
    serving_model.publish(root, 1)
    write_sum_model(root / "wide" / "1")
    config = GatewayConfig.model_validate(
        {
            "poll_interval_s": 0.2,
            "batching": {"batch_timeout_micros": 1000},
            # A 32 MiB body is about 5,000 rows of 1,000 values.
            "models": {"wide": {"batching": {"max_batch_size": 8192}}},
        }
    )
    with GatewayThread(root, config) as thread:
        yield thread


def quoted(path: str) -> str:
    return urllib.parse.quote(path, safe="/:")


# -- versions and malformed URLs ---------------------------------------------------------------


@pytest.mark.parametrize(
    "version",
    ["²", "①", "١", "1" * 5000, str(2**63), str(2**64), "-1", "+1", " 1", "1.0", "0x1"],
)
def test_a_version_is_an_int64_in_ascii_digits_or_the_request_is_malformed(server, version) -> None:
    for method, suffix in (("GET", ""), ("GET", "/metadata"), ("POST", ":predict")):
        path = quoted(f"/v1/models/digits/versions/{version}{suffix}")
        status, body = http(server, method, path, {"instances": [1]} if method == "POST" else None)
        assert status == 400, (version, suffix, body)
        assert "Malformed request" in body["error"]
        assert len(body["error"]) < 400  # 5,000 digits are not echoed back


def test_the_largest_int64_is_a_version_like_any_other(server) -> None:
    status, body = http(server, "GET", f"/v1/models/digits/versions/{2**63 - 1}")
    assert status == 404 and str(2**63 - 1) in body["error"]
    assert http(server, "GET", "/v1/models/digits/versions/01")[0] == 200


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/models/digits:predict"),
        ("GET", "/v1/models/digits:classify"),
        ("POST", "/v1/models/digits"),
        ("POST", "/v1/models/digits/metadata"),
        ("GET", "/v1/models/digits/feedback"),
        ("GET", "/v1/models/digits/version/1"),
        ("POST", "/v1/models/digits/version/1:predict"),
        ("GET", "/v1/models/digits/versions/1/labels/stable"),
        ("GET", "/v1/models/digits/labels/stable/versions/1"),
        ("GET", "/v1/models"),
        ("POST", "/v1/models"),
        ("GET", "/v1/models/"),
        ("GET", "/v1/foo"),
        ("POST", "/v1/models/digits:explain"),
        ("POST", "/v1/models/digits:"),
        ("GET", "/v1/models/digits/versions/1/extra"),
    ],
)
def test_malformed_urls_are_400_as_in_tf_serving(server, method, path) -> None:
    status, body = http(server, method, path, {"instances": [1]} if method == "POST" else None)
    assert status == 400, body
    assert body["error"].startswith("Malformed request"), body


def test_an_unknown_signature_name_is_a_bad_request_not_a_missing_resource(server) -> None:
    status, body = http(
        server, "POST", "/v1/models/digits:predict", {"signature_name": "nope", "instances": [1]}
    )
    assert status == 400 and "'nope'" in body["error"] and "serving_default" in body["error"]


# -- clients that hang up -------------------------------------------------------------------


def metric_value(server: GatewayThread, series: str) -> float:
    _, text = http(server, "GET", "/metrics")
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{series} not in /metrics")


def hang_up_mid_body(server: GatewayThread) -> None:
    port = server.server.rest_port
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(
            b"POST /v1/models/digits:predict HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Type: application/json\r\nContent-Length: 1000000\r\n\r\n"
            b'{"instances": [' + b"0.5, " * 2000
        )
        # A reset, as a client killed mid-request leaves it.
        connection.setsockopt(
            socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
        )


def test_a_client_hanging_up_mid_body_is_counted_not_logged_as_an_error(
    server, caplog: pytest.LogCaptureFixture
) -> None:
    series = 'slipway_gateway_client_disconnects_total{stage="body"}'
    before = metric_value(server, series)
    hangups = 30
    with caplog.at_level(logging.DEBUG):
        for _ in range(hangups):
            hang_up_mid_body(server)
        wait_until(  # the gateway notices the resets on its own loop
            lambda: metric_value(server, series) >= before + hangups,
            "every disconnect to be counted",
            timeout=60,
        )
    assert metric_value(server, series) == before + hangups
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert loud == [], [r.getMessage() for r in loud]
    assert any("closed the connection" in r.getMessage() for r in caplog.records)
    # The gateway answers as before.
    assert http(server, "GET", "/v1/models/digits")[0] == 200


# -- large bodies stay off the event loop -----------------------------------------------------


def big_body(megabytes: int) -> tuple[bytes, np.ndarray]:
    """A ``:predict`` body of about ``megabytes`` MiB for the ``wide`` model."""
    row = json.dumps(np.round(np.random.default_rng(0).random(WIDTH), 6).tolist())
    rows = megabytes * 2**20 // (len(row) + 2) + 1
    body = ('{"instances": [' + ", ".join([row] * rows) + "]}").encode()
    return body, np.asarray(json.loads(row), np.float32)


class Heartbeat:
    """A coroutine on the gateway's loop that wakes every few milliseconds and records
    the longest time between two wake-ups: how long the loop was unable to run anything."""

    PERIOD_S = 0.002

    def __init__(self, server: GatewayThread) -> None:
        self.server = server
        self.max_gap = 0.0
        self.beats = 0
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._future: Any = None

    async def _run(self) -> None:
        self._stop = asyncio.Event()
        self._started.set()
        loop = asyncio.get_running_loop()
        last = loop.time()
        while not self._stop.is_set():
            await asyncio.sleep(self.PERIOD_S)
            now = loop.time()
            self.max_gap = max(self.max_gap, now - last - self.PERIOD_S)
            self.beats += 1
            last = now

    def __enter__(self) -> Heartbeat:
        self._future = asyncio.run_coroutine_threadsafe(self._run(), self.server.loop)
        assert self._started.wait(30)
        return self

    def __exit__(self, *exc_info: object) -> None:
        assert self._stop is not None
        self.server.loop.call_soon_threadsafe(self._stop.set)
        self._future.result(30)


def predict_big(server: GatewayThread, body: bytes) -> tuple[int, Any]:
    return http(server, "POST", "/v1/models/wide:predict", raw=body)


@pytest.mark.process  # large bodies are parsed in worker processes
def test_a_32_mib_body_does_not_stall_the_loop_that_serves_grpc(server) -> None:
    body, row = big_body(32)
    assert len(body) >= 32 * 2**20
    rows = body.count(b"], [") + 1
    # The first large body starts the worker processes; the second is the one measured.
    status, answer = predict_big(server, body)
    assert status == 200, answer
    np.testing.assert_allclose(answer["predictions"], [row.sum()] * rows, rtol=1e-4)

    def measure(send: bool) -> tuple[Heartbeat, list[float], float]:
        """The loop's longest stall and gRPC health-check latencies over one window:
        while the 32 MiB body is handled (``send``), or as long with no body at all."""
        latencies: list[float] = []
        done = threading.Event()

        def health_checks() -> None:
            with grpc.insecure_channel(server.grpc_target) as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                stub.Check(health_pb2.HealthCheckRequest(), timeout=30)
                while not done.is_set():
                    started = time.monotonic()
                    stub.Check(health_pb2.HealthCheckRequest(), timeout=30)
                    latencies.append(time.monotonic() - started)
                    done.wait(0.01)

        checker = threading.Thread(target=health_checks)
        with Heartbeat(server) as heartbeat:
            checker.start()
            started = time.monotonic()
            try:
                if send:
                    status, answer = predict_big(server, body)
                    assert status == 200 and len(answer["predictions"]) == rows
                else:
                    done.wait(window)
            finally:
                done.set()
                checker.join(60)
        return heartbeat, latencies, time.monotonic() - started

    loaded, latencies, window = measure(send=True)
    # The same window with no body: what this machine's scheduling alone costs the loop.
    idle, _, _ = measure(send=False)
    # What parsing the body costs on this machine as loaded as it is now: the least a
    # gateway that parsed on its loop would stall it for.
    started = time.perf_counter()
    json.loads(body)
    parsing = time.perf_counter() - started
    # The loop kept running all along: handling the body added at most half of that
    # to its longest pause (a bound that scales with the machine's load, where a fixed
    # 50 ms failed a good gateway on a busy machine).
    assert loaded.beats > 10
    extra = loaded.max_gap - idle.max_gap
    assert extra < max(0.1, parsing / 2), (
        f"the event loop stalled for {loaded.max_gap:.3f} s (idle: {idle.max_gap:.3f} s; "
        f"parsing the body takes {parsing:.3f} s)"
    )
    # gRPC was answered meanwhile (a generous bound: each check is a millisecond or two).
    assert latencies and max(latencies) < 1.0, latencies


@pytest.mark.process  # large bodies are parsed in worker processes
def test_a_large_bad_body_is_refused_with_the_same_messages(server) -> None:
    body, _ = big_body(1)
    status, answer = http(server, "POST", "/v1/models/wide:predict", raw=body[:-5])
    assert status == 400 and "not valid JSON" in answer["error"]
    status, answer = http(
        server, "POST", "/v1/models/digits:predict", raw=body.replace(b"{", b'{"x": 1, ', 1)
    )
    assert status == 400 and "error" in answer
    padded = json.dumps({"signature_name": "nope", "instances": [[0.0] * WIDTH] * 200})
    status, answer = http(server, "POST", "/v1/models/wide:predict", raw=padded.encode())
    assert len(padded) > 128 * 1024
    assert status == 400 and "'nope'" in answer["error"]
    # Examples too: parsed in a worker, answered as usual.
    examples = json.dumps({"examples": [{"x": [0.5] * WIDTH}] * 100})
    assert len(examples) > 128 * 1024
    status, answer = http(server, "POST", "/v1/models/wide:regress", raw=examples.encode())
    assert status == 200 and answer == {"results": [500.0] * 100}


@pytest.mark.parametrize(
    ("value", "kind", "values"),
    [([10, 11], "int64_list", [10, 11]), ([10.5, 10], "float_list", [10.5, 10.0]),
     (3, "int64_list", [3]), ([], None, [])],
)  # fmt: skip
def test_the_first_number_types_an_example_feature(value: Any, kind: Any, values: list) -> None:
    feature = json_to_feature(value, "feature 'n'")
    assert feature.WhichOneof("kind") == kind
    assert (list(getattr(feature, kind).value) if kind else []) == values


def test_a_fraction_in_an_integer_feature_is_refused_as_tf_serving_refuses_it() -> None:
    with pytest.raises(InvalidArgument, match="feature 'n' expecting type: int64"):
        json_to_feature([10, 10.0], "feature 'n'")
