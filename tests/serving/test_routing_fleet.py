"""Routing across a fleet: a routing source process and three real gateway processes.

Replica 2 reaches the source through a TCP relay the test can cut, so it can be made to
lag while staying alive. Every wait polls what a replica reports (its applied revision)
with a generous deadline; nothing here depends on how fast a change arrives.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ops.gateway_admin import GatewayAdmin, GatewayAdminError
from serving.process import GatewayProcess
from serving.routing import ModelRouting
from serving.routing_process import RoutingSourceProcess, admin_call, write_replica_config
from slipway.cli import main
from slipway.demo_rollout import ClientLoad, request_pool
from tests.support.ports import free_port
from tests.support.serving_models import MODEL_NAME, ServingModel
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.process, pytest.mark.timeout(600)]

TOKEN = "fleet-test-token"
DIGITS, OTHER = MODEL_NAME, "other"
APPLIED_TIMEOUT_S = 30.0
# The rollout judges errors only: on a loaded machine a freshly loaded, identical canary's
# p99 can exceed stable's several times over.
ERRORS_ONLY = {
    "window": "5s",
    "min_requests": 20,
    "checks": {"latency_p99": {"max_ratio": None, "max_added_ms": None}},
}


def routing(weight: float) -> ModelRouting:
    return ModelRouting(labels={"stable": 1, "canary": 2}, canary_weight=weight)


class Relay:
    """A TCP relay on a fixed loopback port; ``cut`` drops every connection and refuses
    new ones until ``mend``. Threads with socket timeouts, so nothing can hang."""

    def __init__(self, target_port: int) -> None:
        self.port = free_port()
        self._target = target_port
        self._listener: socket.socket | None = None
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def mend(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", self.port), reuse_port=False)
        threading.Thread(target=self._accept, args=(self._listener,), daemon=True).start()

    def cut(self) -> None:
        with self._lock:
            sockets, self._open = [self._listener, *self._open], set()
        for sock in sockets:
            _hang_up(sock)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # cut
                return
            try:
                server = socket.create_connection(("127.0.0.1", self._target), timeout=5)
            except OSError:  # the source is down: refuse this one, as it would
                client.close()
                continue
            with self._lock:
                self._open |= {client, server}
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            _hang_up(source)
            _hang_up(sink)


def _hang_up(sock: socket.socket) -> None:
    """Shut the connection down, then close: ``close`` alone neither wakes a thread blocked
    on the socket nor tells the peer while that thread holds it."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


@dataclass
class Fleet:
    source: RoutingSourceProcess
    relay: Relay
    replicas: list[GatewayProcess]

    @property
    def urls(self) -> list[str]:
        return [replica.rest_url for replica in self.replicas]

    def admin(self, **options: Any) -> GatewayAdmin:
        """The controller's view, given replicas 0 and 1 only: the source names the rest."""
        return GatewayAdmin(self.urls[:2], TOKEN, **options)

    def write(self, model: str, body: ModelRouting) -> int:
        """Write straight to the source, as a second controller would; the new revision."""
        answer = call(f"{self.source.url}/v1/routing/{model}", "PUT", body.model_dump())
        return answer["table_revision"]

    def status(self, index: int) -> dict[str, Any]:
        return call(f"{self.urls[index]}/admin/routing/status")

    def wait_applied(self, index: int, revision: int) -> None:
        wait_until(lambda: self.status(index)["revision"] >= revision,
                   f"replica {index} to apply routing revision {revision}",
                   APPLIED_TIMEOUT_S)  # fmt: skip

    def restart(self, index: int) -> None:
        """SIGKILL the replica, then start it again on the same ports."""
        replica = self.replicas[index]
        replica.kill()
        replica.__exit__(None, None, None)
        replica.start()


def call(url: str, method: str = "GET", body: Any = None) -> Any:
    return admin_call(url, TOKEN, method, body)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, serving_model: ServingModel) -> Iterator[Fleet]:
    """The source and replicas 0 and 1 running; replica 2 (behind the relay) not started."""
    work = tmp_path_factory.mktemp("fleet")
    root = work / "models"
    for model in (DIGITS, OTHER):
        for version in (1, 2):
            serving_model.publish(root, version, name=model)
    env = {**os.environ, "SLIPWAY_ADMIN_TOKEN": TOKEN}
    source = RoutingSourceProcess(work / "routing-state.json", TOKEN).start()
    relay = Relay(source.rest_port)
    relay.mend()
    urls = [source.url, source.url, relay.url]
    # Replica 2 watches for as long as the source allows, so once cut off it stays on the
    # source's list of live replicas (with its old revision) for over a minute.
    watches = [30.0, 30.0, 60.0]
    replicas = [
        GatewayProcess(
            root, config=write_replica_config(work / f"replica{i}", url, watch_s=watch), env=env
        )
        for i, (url, watch) in enumerate(zip(urls, watches, strict=True))
    ]
    try:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda replica: replica.start(), replicas[:2]))
        yield Fleet(source, relay, replicas)
    finally:
        for replica in replicas:
            if replica.process is not None:
                replica.__exit__(None, None, None)
        relay.cut()
        source.__exit__(None, None, None)


def test_a_replica_started_later_gets_the_current_routing(fleet: Fleet) -> None:
    fleet.admin().set_routing(DIGITS, routing(0.05))  # returns once 0 and 1 applied it
    assert [call(f"{url}/admin/routing/{DIGITS}")["canary_weight"] for url in fleet.urls[:2]] == [
        0.05,
        0.05,
    ]
    fleet.replicas[2].start()
    assert call(f"{fleet.urls[2]}/admin/routing/{DIGITS}")["canary_weight"] == 0.05
    status = fleet.status(2)
    assert status["connected"] is True and status["source"] == fleet.relay.url
    assert status["revision"] == call(f"{fleet.source.url}/v1/routing")["revision"]
    metrics = urllib.request.urlopen(f"{fleet.urls[2]}/metrics", timeout=10).read().decode()
    assert f"slipway_gateway_routing_revision {float(status['revision'])}" in metrics
    assert "slipway_gateway_routing_source_up 1.0" in metrics
    assert fleet.admin().checked(DIGITS, [1, 2]) == routing(0.05)


def test_two_rollouts_at_once_lose_nothing(fleet: Fleet) -> None:
    """One controller per model, and an operator's PUTs through replica 1's admin API
    (a compare-and-swap on the revision that replica had), all at the same time."""
    weights = [round(0.01 * step, 2) for step in range(1, 21)]

    def controller() -> None:
        admin = fleet.admin()
        for weight in weights:
            admin.set_routing(DIGITS, routing(weight))

    def operator() -> None:
        for weight in weights:
            path = f"{fleet.urls[1]}/admin/routing/{OTHER}"
            while True:  # a conflict means the replica had not seen a change yet: re-read
                try:
                    call(path, "PUT", routing(weight).model_dump())
                    break
                except urllib.error.HTTPError as exc:
                    assert exc.code == 409, exc.read()

    with ThreadPoolExecutor(2) as pool:
        for future in [pool.submit(controller), pool.submit(operator)]:
            future.result(timeout=300)
    table = call(f"{fleet.source.url}/v1/routing")
    assert table["models"][DIGITS]["routing"]["canary_weight"] == weights[-1]
    assert table["models"][OTHER]["routing"]["canary_weight"] == weights[-1]
    for index, url in enumerate(fleet.urls):
        fleet.wait_applied(index, table["revision"])
        for model in (DIGITS, OTHER):
            assert call(f"{url}/admin/routing/{model}")["canary_weight"] == weights[-1]


def test_checked_names_a_replica_that_lags(fleet: Fleet) -> None:
    fleet.relay.cut()
    revision = fleet.write(DIGITS, routing(0.3))
    fleet.wait_applied(0, revision)
    with pytest.raises(GatewayAdminError, match=f"{fleet.urls[2]}: at routing revision") as lag:
        fleet.admin().checked(DIGITS, [1, 2])
    assert fleet.urls[0] not in str(lag.value)
    wait_until(lambda: fleet.status(2)["connected"] is False,
               "replica 2 to report its source unreachable", APPLIED_TIMEOUT_S)  # fmt: skip
    with pytest.raises(GatewayAdminError, match="not applied within 1s by: .*" + fleet.urls[2]):
        fleet.admin(apply_timeout=1.0).set_routing(DIGITS, routing(0.35))
    fleet.relay.mend()
    fleet.wait_applied(2, revision + 1)
    assert fleet.admin().checked(DIGITS, [1, 2]) == routing(0.35)


def test_a_replica_restarted_mid_rollout_comes_back_with_the_latest_routing(
    fleet: Fleet,
) -> None:
    fleet.replicas[0].kill()
    revision = fleet.write(DIGITS, routing(0.5))  # while replica 0 is down
    fleet.restart(0)
    assert fleet.status(0)["revision"] >= revision
    assert call(f"{fleet.urls[0]}/admin/routing/{DIGITS}")["canary_weight"] == 0.5

    # The source goes away; a replica restarted meanwhile serves its cached routing.
    fleet.wait_applied(1, revision)
    assert fleet.source.stop() == 0  # SIGTERM: watchers answered, a clean exit
    with pytest.raises(GatewayAdminError, match=fleet.source.url):
        fleet.admin().set_routing(DIGITS, routing(0.6))  # reported, not silently dropped
    fleet.restart(1)
    status = fleet.status(1)
    assert status["revision"] == revision and status["connected"] is False
    assert fleet.source.url in status["error"]
    assert call(f"{fleet.urls[1]}/admin/routing/{DIGITS}")["canary_weight"] == 0.5
    fleet.source.start()
    wait_until(lambda: fleet.status(1)["connected"] is True,
               "replica 1 to reconnect to the restarted source", APPLIED_TIMEOUT_S)  # fmt: skip
    fleet.admin().set_routing(DIGITS, routing(0.7))
    assert fleet.admin().checked(DIGITS, [1, 2]) == routing(0.7)


def test_the_rollout_controller_reaches_every_replica_through_the_source(
    fleet: Fleet,
    tmp_path: Path,
    serving_model: ServingModel,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    """``slipway canary start``, unchanged, given one replica's URL: the replicas name
    their source, the source names every replica, and each step reaches all three."""
    fleet.admin().set_routing(DIGITS, ModelRouting(labels={"stable": 1}))
    analysis = tmp_path / "analysis.json"
    analysis.write_text(json.dumps(ERRORS_ONLY))
    command = [
        "canary", "start", DIGITS, "--version", "2",
        "--steps", "50,100", "--bake", "2s", "--interval", "1s", "--analysis", str(analysis),
        "--gateway", fleet.urls[0], "--state-dir", str(tmp_path / "state"),
    ]  # fmt: skip
    for url in fleet.urls:
        command += ["--metrics-from", url]
    monkeypatch.setenv("SLIPWAY_ADMIN_TOKEN", TOKEN)
    pool = request_pool(serving_model.signature_json())
    with ClientLoad(fleet.urls, DIGITS, pool, rate=60):
        code = main(command)
    output = capsys.readouterr()
    assert code == 0, output.out + output.err
    for url in fleet.urls:
        assert call(f"{url}/admin/routing/{DIGITS}")["labels"] == {"stable": 2, "previous": 1}, (
            output.out + json.dumps(call(f"{fleet.source.url}/v1/routing"))
        )
