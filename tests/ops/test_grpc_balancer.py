"""Two real gateway replicas behind a real nginx (Debian's package), written by
``slipway balancer nginx``, driven by TF Serving's stock gRPC stubs over one connection:
calls spread over both replicas, canary weights and sticky keys hold whichever replica
answers, and a killed replica costs no call."""

from __future__ import annotations

import getpass
import json
import re
import shutil
import subprocess
from collections.abc import Iterator

import grpc
import pytest
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from ops.balancer import Listen, nginx_config
from serving.process import GatewayProcess
from serving.routing import sticky_fraction
from tests.support.grpc_requests import predict_request
from tests.support.ports import free_port
from tests.support.serving_models import MODEL_NAME, ServingModel

pytestmark = pytest.mark.timeout(600)

MODEL = MODEL_NAME
CANARY_WEIGHT = 0.3
STICKY_HEADER = "x-user-id"
READY_TIMEOUT_S = 60.0


def nginx_binary() -> str:
    path = shutil.which("nginx")
    if path is None:
        pytest.skip("nginx is not installed; install it with `make nginx` (Debian's 'nginx')")
    return path


def replica_requests(replica: GatewayProcess) -> float:
    """Predict calls a replica answered, from its own /metrics."""
    with urlopen(replica.rest_url + "/metrics") as response:
        text = response.read().decode()
    pattern = r'^slipway_gateway_requests_total\{[^}]*api="grpc"[^}]*\} (\S+)$'
    return sum(float(value) for value in re.findall(pattern, text, re.MULTILINE))


def urlopen(url: str):  # noqa: ANN201 - a context manager from urllib
    import urllib.request

    return urllib.request.urlopen(url, timeout=10)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, serving_model: ServingModel) -> Iterator[dict]:
    nginx = nginx_binary()
    workdir = tmp_path_factory.mktemp("balancer")
    root = workdir / "models"
    for version in (1, 2):
        serving_model.publish(root, version)
    routing = {
        "models": {
            MODEL: {
                "labels": {"stable": 1, "canary": 2},
                "canary_weight": CANARY_WEIGHT,
                "sticky_header": STICKY_HEADER,
            }
        }
    }
    (workdir / "routing.json").write_text(json.dumps(routing))
    config = workdir / "gateway.yaml"
    config.write_text(
        json.dumps({"routing_file": "routing.json", "version_policy": {"kind": "all"}})
    )
    replicas = [
        GatewayProcess(root, config=config, log_path=workdir / f"gateway-{index}.log")
        for index in range(2)
    ]
    port = free_port()
    prefix = workdir / "nginx"
    prefix.mkdir()
    (prefix / "nginx.conf").write_text(
        nginx_config(
            Listen(f"127.0.0.1:{port}", tuple(r.grpc_target for r in replicas)),
            prefix=prefix,
            user=getpass.getuser(),
        )
    )
    started = []
    try:
        for replica in replicas:
            started.append(replica.start())
        log = (workdir / "nginx.log").open("wb")
        balancer = subprocess.Popen(
            [nginx, "-p", str(prefix), "-c", str(prefix / "nginx.conf")],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        try:
            grpc.channel_ready_future(channel).result(timeout=READY_TIMEOUT_S)
            yield {
                "stub": prediction_service_pb2_grpc.PredictionServiceStub(channel),
                "replicas": replicas,
                "log": workdir / "nginx.log",
            }
        finally:
            channel.close()
            balancer.terminate()
            balancer.wait(timeout=30)
            log.close()
    finally:
        for replica in started:
            replica.stop()


def call(fleet: dict, user: str | None = None) -> predict_pb2.PredictResponse:
    metadata = [(STICKY_HEADER, user)] if user is not None else None
    return fleet["stub"].Predict(predict_request(), timeout=60, metadata=metadata)


@pytest.mark.process
def test_calls_over_one_connection_spread_over_both_replicas(fleet: dict) -> None:
    before = [replica_requests(replica) for replica in fleet["replicas"]]
    calls = 60
    for _ in range(calls):
        call(fleet)
    answered = [replica_requests(r) - b for r, b in zip(fleet["replicas"], before, strict=True)]
    assert sum(answered) == calls
    assert min(answered) >= calls * 0.3, f"calls per replica: {answered}"


@pytest.mark.process
def test_sticky_keys_and_the_canary_weight_hold_whichever_replica_answers(fleet: dict) -> None:
    users = [f"user-{index}" for index in range(60)]
    for user in users:
        expected = 2 if sticky_fraction(MODEL, user) < CANARY_WEIGHT else 1
        versions = {call(fleet, user).model_spec.version.value for _ in range(2)}
        assert versions == {expected}, f"{user}: answered by {versions}, expected {expected}"
    canaries = sum(sticky_fraction(MODEL, user) < CANARY_WEIGHT for user in users)
    assert 0 < canaries < len(users)  # both sides of the split were exercised


@pytest.mark.process
def test_a_killed_replica_costs_no_call(fleet: dict) -> None:
    victim, survivor = fleet["replicas"]
    before = replica_requests(survivor)
    victim.kill()
    answers = [call(fleet) for _ in range(30)]
    assert all("label" in answer.outputs for answer in answers)
    assert replica_requests(survivor) - before == len(answers)


@pytest.mark.process
def test_the_written_configuration_passes_nginx_own_check(tmp_path) -> None:  # noqa: ANN001
    from slipway.cli import main

    nginx = nginx_binary()
    written = tmp_path / "nginx.conf"
    replicas = ["--grpc-replica", "10.0.0.1:8500", "--grpc-replica", "10.0.0.2:8500"]
    rest = ["--rest-listen", "8501", "--rest-replica", "10.0.0.1:8501"]
    arguments = ["balancer", "nginx", *replicas, *rest, "--prefix", str(tmp_path)]
    assert main([*arguments, "-o", str(written)]) == 0
    checked = subprocess.run(
        [nginx, "-t", "-p", str(tmp_path), "-c", str(written)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert checked.returncode == 0, checked.stderr


@pytest.mark.parametrize("replica", ["gateway", "gateway:0", "gateway:http", ":8500"])
def test_a_replica_that_is_not_host_and_port_is_a_usage_error(replica: str, capsys) -> None:  # noqa: ANN001
    from slipway.cli import main

    assert main(["balancer", "nginx", "--grpc-replica", replica]) == 2
    assert "expected HOST:PORT or PORT" in capsys.readouterr().err
