"""``slipway serve --processes 2``: two real worker processes behind one pair of ports.

Requests go over a fresh connection each, so the kernel spreads them over the workers
(``SO_REUSEPORT`` picks a listener per connection). Which worker answered is read from
the workers themselves, on the Unix sockets they answer their siblings on. Every wait polls
with a deadline; nothing depends on how fast a worker starts or applies a change.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Callable, Iterator
from http.client import HTTPConnection
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tensorflow_serving.apis import (
    get_model_status_pb2,
    model_service_pb2_grpc,
    prediction_service_pb2_grpc,
)

from serving.pool import TENSORFLOW_THREAD_VARIABLES, tensorflow_threads
from serving.process import GatewayProcess
from slipway.cli import main
from tests.support.grpc_requests import predict_request
from tests.support.http import fetch
from tests.support.ports import free_port
from tests.support.serving_models import MODEL_NAME, ServingModel, sample_instances
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(600)

TOKEN = "pool-test-token"
MODEL = MODEL_NAME
WAIT_S = 120.0
REQUESTS = 16


@pytest.fixture(scope="module")
def pool(
    tmp_path_factory: pytest.TempPathFactory, serving_model: ServingModel
) -> Iterator[GatewayProcess]:
    workdir = tmp_path_factory.mktemp("pool")
    root = workdir / "models"
    serving_model.publish(root, 1)
    config = workdir / "gateway.yaml"
    config.write_text(
        "poll_interval_s: 0.3\n"
        "admin: {token_env: SLIPWAY_POOL_TOKEN}\n"
        "batching: {batch_timeout_micros: 1000}\n"
    )
    process = GatewayProcess(root, config=config, processes=2, env={"SLIPWAY_POOL_TOKEN": TOKEN})
    with process:
        wait_until(lambda: "pool of 2 workers serving" in process.output(), "both workers", WAIT_S)
        yield process


# -- what the test reads off the processes --------------------------------------------------


def exited(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0]
    except FileNotFoundError:
        return True
    return state == "Z"  # exited, not yet reaped


def worker_pids(pool: GatewayProcess) -> list[int]:
    """The supervisor's live children: one killed but not yet reaped is still listed."""
    assert pool.process is not None
    pid = pool.process.pid
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return sorted(int(child) for child in children if not exited(int(child)))


def wait_until_every_worker_is_ready(pool: GatewayProcess) -> list[int]:
    """Both workers up and announced ready, so the test never acts on one still loading."""

    def ready() -> bool:
        workers = worker_pids(pool)
        output = pool.output()
        return len(workers) == 2 and all(f"ready (pid {pid})" in output for pid in workers)

    wait_until(ready, "both workers ready", WAIT_S)
    return worker_pids(pool)


def pool_directory(pool: GatewayProcess) -> Path:
    arguments = Path(f"/proc/{worker_pids(pool)[0]}/cmdline").read_bytes().split(b"\0")
    return Path(arguments[arguments.index(b"--pool-dir") + 1].decode())


class UnixHTTPConnection(HTTPConnection):
    def __init__(self, path: Path) -> None:
        super().__init__("worker", timeout=30)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(30)
        self.sock.connect(str(self._path))


def ask_worker(socket_path: Path, body: dict[str, Any]) -> dict[str, Any]:
    """A label sent to one worker only, as a sibling would: it never relays."""
    connection = UnixHTTPConnection(socket_path)
    try:
        connection.request(
            "POST", f"/feedback/{MODEL}", json.dumps(body), {"Content-Type": "application/json"}
        )
        return json.loads(connection.getresponse().read())
    finally:
        connection.close()


def predict_rest(pool: GatewayProcess, request_id: str) -> None:
    status, answer, _ = fetch(
        f"{pool.rest_url}/v1/models/{MODEL}:predict",
        "POST",
        sample_instances(),
        {"X-Request-Id": request_id},
    )
    assert status == 200, answer


def on_fresh_channel(pool: GatewayProcess, call: Callable[[grpc.Channel], Any]) -> Any:
    with grpc.insecure_channel(pool.grpc_target) as channel:
        return call(channel)


def predicted_version(pool: GatewayProcess) -> int:
    def predict(channel: grpc.Channel) -> int:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        return stub.Predict(predict_request(), timeout=30).model_spec.version.value

    return on_fresh_channel(pool, predict)


def metric_total(pool: GatewayProcess, name: str, **labels: str) -> float:
    status, text, _ = fetch(pool.rest_url + "/metrics", "GET")
    assert status == 200
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


def admin(pool: GatewayProcess, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    status, answer, _ = fetch(
        pool.rest_url + path, method, body, {"Authorization": f"Bearer {TOKEN}"}
    )
    return status, answer


# -- the tests ------------------------------------------------------------------------------


@pytest.mark.process
def test_connections_spread_over_workers_and_each_keeps_its_own_answers(
    pool: GatewayProcess,
) -> None:
    ids = [f"spread-{i}" for i in range(REQUESTS)]
    for request_id in ids:
        predict_rest(pool, request_id)
    sockets = sorted((pool_directory(pool) / "workers").glob("*.sock"))
    assert len(sockets) == 2
    answered_by: dict[Path, int] = dict.fromkeys(sockets, 0)
    for request_id in ids:
        replies = [ask_worker(path, {"request_id": request_id, "label": 0}) for path in sockets]
        knowing = [path for path, reply in zip(sockets, replies, strict=True) if "answer" in reply]
        assert len(knowing) == 1, replies  # exactly one worker answered it
        assert all(r.get("code") == "NOT_FOUND" for r in replies if "answer" not in r)
        answered_by[knowing[0]] += 1
    assert all(count > 0 for count in answered_by.values()), answered_by


@pytest.mark.process
def test_labels_reach_the_worker_that_answered(pool: GatewayProcess) -> None:
    before = metric_total(pool, "slipway_gateway_feedback_total", model=MODEL)
    ids = [f"relay-{i}" for i in range(REQUESTS)]
    for request_id in ids:
        predict_rest(pool, request_id)
    for request_id in ids[: REQUESTS // 2]:  # one item per call, on fresh connections
        status, answer, _ = fetch(
            f"{pool.rest_url}/v1/models/{MODEL}/feedback",
            "POST",
            {"request_id": request_id, "label": 3},
        )
        assert status == 200, answer
        assert answer["rows"][0]["outcome"] in ("correct", "incorrect")
    batch = {"feedback": [{"request_id": i, "label": 3} for i in ids[REQUESTS // 2 :]]}
    batch["feedback"].append({"request_id": "never-answered", "label": 3})
    status, answer, _ = fetch(f"{pool.rest_url}/v1/models/{MODEL}/feedback", "POST", batch)
    assert status == 200, answer
    *found, unknown = answer["results"]
    assert all("rows" in result for result in found), found
    assert unknown["code"] == "NOT_FOUND"
    status, again, _ = fetch(
        f"{pool.rest_url}/v1/models/{MODEL}/feedback", "POST", {"request_id": ids[0], "label": 3}
    )
    assert status == 409, again  # a row is labelled once, whichever worker is asked
    after = metric_total(pool, "slipway_gateway_feedback_total", model=MODEL)
    assert after - before == REQUESTS


@pytest.mark.process
def test_metrics_add_up_every_worker(pool: GatewayProcess) -> None:
    counted = {"name": "slipway_gateway_requests_total", "model": MODEL, "code": "OK"}
    before = metric_total(pool, **counted)
    for _ in range(REQUESTS):
        assert predicted_version(pool) == 1
    # Each scrape is a fresh connection too, so it reaches either worker: all agree.
    totals = {metric_total(pool, **counted) for _ in range(8)}
    assert totals == {before + REQUESTS}
    assert metric_total(pool, "slipway_gateway_model_loaded", model=MODEL, version="1") == 1


@pytest.mark.process
def test_a_new_version_loads_in_every_worker(
    pool: GatewayProcess, serving_model: ServingModel
) -> None:
    serving_model.publish(pool.model_root, 2)

    def status_everywhere() -> bool:
        def available(channel: grpc.Channel) -> bool:
            request = get_model_status_pb2.GetModelStatusRequest()
            request.model_spec.name = MODEL
            stub = model_service_pb2_grpc.ModelServiceStub(channel)
            states = {
                status.version: status.state
                for status in stub.GetModelStatus(request, timeout=30).model_version_status
            }
            return states.get(2) == get_model_status_pb2.ModelVersionStatus.AVAILABLE

        return all(on_fresh_channel(pool, available) for _ in range(8))

    wait_until(status_everywhere, "version 2 available in every worker", WAIT_S)


@pytest.mark.process
def test_routing_changed_through_one_worker_holds_in_every_worker(pool: GatewayProcess) -> None:
    # Version 1 was unloaded when 2 came (latest, one version). Labelling it 'stable'
    # with no canary traffic must load it again and send every request to it, in both
    # workers, whichever one the admin call reached.
    routing = {"labels": {"stable": 1, "canary": 2}, "canary_weight": 0.0}
    status, answer = admin(pool, "PUT", f"/admin/routing/{MODEL}", routing)
    assert status == 200, answer
    wait_until(lambda: versions_answering(pool) == {1}, "every request on stable", WAIT_S)
    status, answer = admin(pool, "PUT", f"/admin/routing/{MODEL}", {**routing, "canary_weight": 1})
    assert status == 200, answer
    wait_until(lambda: versions_answering(pool) == {2}, "every request on the canary", WAIT_S)
    assert all(
        admin(pool, "GET", f"/admin/routing/{MODEL}")[1]["canary_weight"] == 1.0 for _ in range(8)
    )


def versions_answering(pool: GatewayProcess) -> set[int | str]:
    """The versions that answer 8 requests on fresh connections (an error counts as one)."""
    answered: set[int | str] = set()
    for _ in range(8):
        try:
            answered.add(predicted_version(pool))
        except grpc.RpcError as exc:
            answered.add(exc.code().name)
    return answered


@pytest.mark.process
def test_batching_cannot_change_in_one_worker_only(pool: GatewayProcess) -> None:
    status, answer = admin(pool, "PUT", f"/admin/batching/{MODEL}", {"max_batch_size": 4})
    assert status == 400, answer
    assert "pool of processes" in json.dumps(answer)


@pytest.mark.process
def test_a_killed_worker_is_replaced_and_counts_stay(pool: GatewayProcess) -> None:
    counted = {"name": "slipway_gateway_requests_total", "model": MODEL}
    before = metric_total(pool, **counted)
    victim = worker_pids(pool)[0]
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: victim not in worker_pids(pool), "the killed worker to be gone", WAIT_S)
    wait_until_every_worker_is_ready(pool)  # and its replacement ready
    assert all(predicted_version(pool) == 2 for _ in range(REQUESTS))
    assert metric_total(pool, **counted) >= before + REQUESTS  # the dead worker's count stays


@pytest.mark.process
def test_sigterm_stops_every_worker(pool: GatewayProcess) -> None:
    workers = worker_pids(pool)
    assert pool.stop() == 0
    for pid in workers:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_port_in_use_is_refused_before_any_worker_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "models").mkdir()
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        started = time.monotonic()
        code = main(
            [
                "serve", "--processes", "2", "--model-root", str(tmp_path / "models"),
                "--host", "127.0.0.1", "--grpc-port", str(port), "--rest-port", str(free_port()),
            ]
        )  # fmt: skip
    stderr = capsys.readouterr().err
    assert code == 2, stderr
    assert f"gRPC: cannot listen on 127.0.0.1:{port}" in stderr
    assert "worker 0 started" not in stderr + caplog.text
    assert time.monotonic() - started < 60


@pytest.mark.process
def test_a_worker_that_cannot_start_stops_the_pool_with_its_code(
    tmp_path: Path, serving_model: ServingModel
) -> None:
    serving_model.publish(tmp_path / "models", 1)
    config = tmp_path / "gateway.yaml"
    config.write_text(f"tls: {{cert: {tmp_path}/missing.pem, key: {tmp_path}/missing.key}}\n")
    process = GatewayProcess(tmp_path / "models", config=config, processes=2)
    with pytest.raises(Exception, match="exited with 2"):
        process.start()
    assert "cannot read" in process.output()
    assert "before it was ready: stopping" in process.output()


def test_each_worker_gets_its_share_of_the_cores_unless_the_operator_chose(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cores = len(os.sched_getaffinity(0))
    for name in TENSORFLOW_THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert tensorflow_threads(1) == dict.fromkeys(TENSORFLOW_THREAD_VARIABLES, str(cores))
    assert tensorflow_threads(cores * 4) == dict.fromkeys(TENSORFLOW_THREAD_VARIABLES, "1")
    monkeypatch.setenv("TF_NUM_INTRAOP_THREADS", "7")
    assert tensorflow_threads(2)["TF_NUM_INTRAOP_THREADS"] == "7"


@pytest.fixture(scope="module")
def watched_pool(
    tmp_path_factory: pytest.TempPathFactory, serving_model: ServingModel
) -> Iterator[GatewayProcess]:
    """A pool whose supervisor probes its workers twice a second and gives up after 10 s."""
    workdir = tmp_path_factory.mktemp("watched")
    serving_model.publish(workdir / "models", 1)
    config = workdir / "gateway.yaml"
    config.write_text("pool: {probe_interval_s: 0.5, unresponsive_after_s: 10}\n")
    process = GatewayProcess(workdir / "models", config=config, processes=2)
    with process:
        wait_until(lambda: "pool of 2 workers serving" in process.output(), "both workers", WAIT_S)
        yield process


@pytest.mark.process
def test_a_worker_that_stops_answering_is_killed_and_replaced(
    watched_pool: GatewayProcess,
) -> None:
    stuck, healthy = worker_pids(watched_pool)
    os.kill(stuck, signal.SIGSTOP)  # keeps its sockets, answers nothing
    wait_until(lambda: exited(stuck), "the stopped worker to be killed", WAIT_S)
    assert f"(pid {stuck}) has not answered" in watched_pool.output()
    assert healthy in wait_until_every_worker_is_ready(watched_pool)  # and a replacement
    assert all(predicted_version(watched_pool) == 1 for _ in range(REQUESTS))


@pytest.mark.process
def test_workers_drain_and_end_when_the_supervisor_is_killed(
    watched_pool: GatewayProcess,
) -> None:
    workers = wait_until_every_worker_is_ready(watched_pool)
    watched_pool.kill()  # SIGKILL: no chance to stop its workers itself
    wait_until(lambda: all(exited(pid) for pid in workers), "the workers to exit", WAIT_S)
    for index in range(2):  # each drained, and could still say so
        assert f"[worker {index}] serving.server: stopped" in watched_pool.output()
    with socket.socket() as probe:  # nobody holds the port any more
        probe.bind(("127.0.0.1", watched_pool.grpc_port))
