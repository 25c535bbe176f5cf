"""Canary rollouts end to end: two real gateway processes behind steady client traffic, a
real Prometheus scraping them every second, and the controller run as ``slipway canary``.

The model repository holds the tiny test model as version 1 (stable), unchanged copies
(good canaries), a wrapper failing the 20 % of requests whose inputs hash low, and a
wrapper that waits about 40 ms per call (several times stable's latency).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from ops.events import Event, EventLog
from ops.gateway_admin import GatewayAdmin, GatewayAdminError, UnknownModelError
from ops.state import Phase, StateStore
from serving.process import GatewayProcess
from serving.routing import ModelRouting, load_routing
from slipway.demo_rollout import (
    TOKEN_ENV,
    ClientLoad,
    publish_copy,
    publish_faulty_version,
    request_pool,
    write_gateway_config,
)
from tests.ops.prometheus_process import PrometheusProcess, poll
from tests.serving import model_factory

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

MODEL = model_factory.MODEL_NAME
TOKEN = "rollout-test-token"
STABLE = 1
GOOD, FAILING, SLOW, GOOD_OUTAGE, GOOD_KILLED = 2, 3, 4, 5, 6
ROLLOUT_TIMEOUT_S = 60.0
# The rollouts that test the controller's control flow judge errors only: on a loaded
# machine a freshly loaded, identical canary's p99 can exceed stable's several times over.
ANALYSIS = {
    "window": "5s",
    "min_requests": 20,
    "checks": {"latency_p99": {"max_ratio": None, "max_added_ms": None}},
}
# The slow-canary rollout judges latency, with bounds SLOW_DELAY_MS always exceeds.
LATENCY_ANALYSIS = {
    "window": "5s",
    "min_requests": 20,
    "checks": {"latency_p99": {"max_ratio": 1.5, "max_added_ms": 25}},
}
SLOW_DELAY_MS = 100


@dataclass
class Fleet:
    gateways: list[GatewayProcess]
    prometheus: PrometheusProcess
    load: ClientLoad
    routing_file: Path
    analysis: Path
    env: dict[str, str]

    @property
    def urls(self) -> list[str]:
        return [gateway.rest_url for gateway in self.gateways]

    def admin(self) -> GatewayAdmin:
        return GatewayAdmin(self.urls, TOKEN)


@contextmanager
def running_fleet(
    root: Path, config: Path, analysis: Path, pool: list[dict], **load_options: Any
) -> Iterator[Fleet]:
    """Two gateway replicas serving ``root`` with ``config``, Prometheus scraping them, and
    60 requests/s over ``pool`` (``load_options`` go to ``ClientLoad``)."""
    env = {**os.environ, TOKEN_ENV: TOKEN}
    gateways = [GatewayProcess(root, config=config, env=env) for _ in range(2)]
    try:
        with ThreadPoolExecutor(len(gateways)) as starting:
            list(starting.map(lambda gateway: gateway.start(), gateways))
        with (
            PrometheusProcess([g.rest_url.removeprefix("http://") for g in gateways]) as prometheus,
            ClientLoad([g.rest_url for g in gateways], MODEL, pool, rate=60, **load_options) as load,
        ):  # fmt: skip
            prometheus.wait_for_targets()
            yield Fleet(gateways, prometheus, load, config.parent / "routing.yaml", analysis, env)
    finally:
        for gateway in gateways:
            if gateway.process is not None:
                gateway.__exit__(None, None, None)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    work = tmp_path_factory.mktemp("rollouts")
    root = work / "models"
    stable = model_factory.publish(root, STABLE)
    for version in (GOOD, GOOD_OUTAGE, GOOD_KILLED):
        publish_copy(stable, root, MODEL, version)
    publish_faulty_version(stable, root, MODEL, FAILING, error_percent=20)
    publish_faulty_version(stable, root, MODEL, SLOW, delay_ms=SLOW_DELAY_MS)
    config = write_gateway_config(work / "gateway", routing={MODEL: {"labels": {"stable": STABLE}}})
    analysis = work / "analysis.yaml"
    analysis.write_text(yaml.safe_dump(ANALYSIS))
    (work / "latency-analysis.yaml").write_text(yaml.safe_dump(LATENCY_ANALYSIS))
    pool = request_pool(model_factory.signature_json())
    with running_fleet(root, config, analysis, pool) as fleet:
        yield fleet


@pytest.fixture
def store(fleet: Fleet, tmp_path: Path) -> StateStore:
    """A fresh state directory, and the model back on version 1 alone on every replica."""
    fleet.admin().set_routing(MODEL, ModelRouting(labels={"stable": STABLE}))
    return StateStore(tmp_path / "state")


def canary_command(fleet: Fleet, store: StateStore, *args: str) -> list[str]:
    return [sys.executable, "-m", "slipway", "canary", *args, "--state-dir", str(store.root)]


def start_args(fleet: Fleet, version: int, *extra: str, prometheus: bool = True) -> list[str]:
    args = ["start", MODEL, "--version", str(version), "--steps", "10,50,100", "--bake", "2s",
            "--interval", "1s", "--analysis", str(fleet.analysis), "--token-env", TOKEN_ENV,
            "--routing-file", str(fleet.routing_file), *extra]  # fmt: skip
    for url in fleet.urls:
        args += ["--gateway", url]
    if prometheus:
        args += ["--prometheus", fleet.prometheus.url]
    return args


def spawn(fleet: Fleet, store: StateStore, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        canary_command(fleet, store, *args),
        env=fleet.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(process: subprocess.Popen[str], timeout: float = ROLLOUT_TIMEOUT_S) -> tuple[int, str]:
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
        raise AssertionError(
            f"the controller did not finish within {timeout}s:\n{output}"
        ) from None
    return process.returncode, output


def rollout(fleet: Fleet, store: StateStore, version: int, *extra: str, **options: bool) -> str:
    """Run a rollout to its end; the controller's output."""
    code, output = finish(spawn(fleet, store, *start_args(fleet, version, *extra, **options)))
    state = store.load(MODEL)
    assert state is not None, output
    assert code == (0 if state.phase is Phase.SUCCEEDED else 1), output
    return output


def events(store: StateStore) -> list[Event]:
    return EventLog(store.events_path(MODEL)).read()


def weights(fleet: Fleet) -> list[float]:
    """The canary weight on each replica (they differ for an instant during a change)."""
    return [routing.canary_weight for routing in fleet.admin().get_routing(MODEL).values()]


def replica_routing(fleet: Fleet) -> ModelRouting:
    """The routing every replica agrees on (the admin client refuses a disagreement)."""
    return fleet.admin().routing(MODEL)


# -- the admin client against real replicas ------------------------------------------------


def test_admin_checks_versions_and_names_the_replica_that_failed(
    fleet: Fleet, store: StateStore
) -> None:
    admin = fleet.admin()
    assert admin.checked(MODEL, [STABLE, GOOD]).labels == {"stable": STABLE}
    with pytest.raises(UnknownModelError, match="version.s. 99 of 'digits' not available"):
        admin.checked(MODEL, [STABLE, 99])
    with pytest.raises(UnknownModelError, match="model 'nope' is not served"):
        admin.checked("nope", [1])
    with pytest.raises(GatewayAdminError, match=f"{fleet.urls[0]}.*admin token refused"):
        GatewayAdmin(fleet.urls[:1], "wrong").routing(MODEL)
    dead = "http://127.0.0.1:9"  # the discard port: nothing listens on loopback
    partial = GatewayAdmin([*fleet.urls, dead], TOKEN)
    canary = ModelRouting(labels={"stable": STABLE, "canary": GOOD}, canary_weight=0.25)
    with pytest.raises(GatewayAdminError) as failure:
        partial.set_routing(MODEL, canary)
    assert dead in str(failure.value) and fleet.urls[0] not in str(failure.value)
    assert replica_routing(fleet) == canary  # the healthy replicas took the change
    shared = GatewayAdmin(fleet.urls, TOKEN, routing_file=fleet.routing_file)
    shared.set_routing(MODEL, ModelRouting(labels={"stable": STABLE}))
    assert load_routing(fleet.routing_file).for_model(MODEL).labels == {"stable": STABLE}


# -- rollouts ----------------------------------------------------------------------------


def test_a_good_canary_is_promoted_through_every_step(fleet: Fleet, store: StateStore) -> None:
    output = rollout(fleet, store, GOOD)
    state = store.load(MODEL)
    assert state.phase is Phase.SUCCEEDED, output
    steps = [e.step for e in events(store) if e.kind == "transition" and e.phase == "progressing"]
    assert steps == [0, 1, 2]
    routing = replica_routing(fleet)
    assert routing.labels == {"stable": GOOD, "previous": STABLE}
    assert routing.canary_weight == 0
    assert load_routing(fleet.routing_file).for_model(MODEL) == routing
    passes = [e for e in events(store) if e.kind == "analysis" and e.outcome == "pass"]
    assert passes and all(e.numbers["canary"]["requests"] >= 20 for e in passes)
    assert (store.model_dir(MODEL) / "timeline.png").stat().st_size > 10_000

    code, output = finish(spawn(fleet, store, "status", MODEL))
    assert code == 0 and "succeeded" in output, output
    # No controller runs any more: the command applies itself, within the rollback window.
    code, output = finish(spawn(fleet, store, "rollback", MODEL, "--reason", "second thoughts"))
    assert code == 0, output
    assert store.load(MODEL).phase is Phase.ROLLED_BACK
    assert replica_routing(fleet).labels == {"stable": STABLE}


def test_a_canary_answering_errors_is_rolled_back(fleet: Fleet, store: StateStore) -> None:
    output = rollout(fleet, store, FAILING)
    state = store.load(MODEL)
    assert state.phase is Phase.ROLLED_BACK, output
    assert "error_rate" in state.reason
    assert state.step == 0  # never left the first step
    routing = replica_routing(fleet)
    assert routing.labels == {"stable": STABLE} and routing.canary_weight == 0
    failed = [e for e in events(store) if e.outcome == "fail"]
    assert failed[0].numbers["canary"]["errors"] > 0
    assert failed[0].numbers["stable"]["errors"] == 0


def test_a_slow_canary_is_rolled_back(fleet: Fleet, store: StateStore) -> None:
    latency_analysis = fleet.analysis.with_name("latency-analysis.yaml")
    output = rollout(fleet, store, SLOW, "--analysis", str(latency_analysis))
    state = store.load(MODEL)
    assert state.phase is Phase.ROLLED_BACK, output
    assert "latency_p99" in state.reason
    failed = next(e for e in events(store) if e.outcome == "fail")
    assert failed.numbers["canary"]["errors"] == 0
    latency = next(check for check in failed.checks if check["name"] == "latency_p99")
    assert latency["passed"] is False and latency["canary"] > latency["limit"]
    assert replica_routing(fleet).canary_weight == 0


def test_prometheus_outage_holds_the_rollout_until_it_is_back(
    fleet: Fleet, store: StateStore
) -> None:
    controller = spawn(fleet, store, *start_args(fleet, GOOD_OUTAGE, "--bake", "4s"))
    try:
        poll(lambda: any(e.kind == "analysis" for e in events(store)), 30, "a first analysis")
        fleet.prometheus.stop()
        try:
            poll(lambda: len(outage_holds(store)) >= 3, 30, "three holds without Prometheus")
            held_at = store.load(MODEL)
            assert held_at.phase is Phase.PROGRESSING
        finally:
            fleet.prometheus.start()
        code, output = finish(controller)
    finally:
        if controller.poll() is None:
            controller.kill()
    assert code == 0, output
    holds = outage_holds(store)
    assert {e.step for e in holds} == {held_at.step}  # no step was taken blind
    assert all(e.outcome == "no_data" for e in holds)
    after = [e for e in events(store) if e.at > holds[-1].at and e.kind == "transition"]
    assert after[-1].phase == "succeeded"


def outage_holds(store: StateStore) -> list[Event]:
    return [
        e for e in events(store)
        if e.kind == "analysis" and e.decision == "hold" and "metrics unavailable" in e.message
    ]  # fmt: skip


def test_a_killed_controller_resumes_from_its_state_file(fleet: Fleet, store: StateStore) -> None:
    first = spawn(fleet, store, *start_args(fleet, GOOD_KILLED, "--bake", "5s"))
    try:
        poll(lambda: min(weights(fleet)) >= 0.5, 40, "every replica at the second step")
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
    killed_at = store.load(MODEL)
    assert killed_at.phase is Phase.PROGRESSING and killed_at.step >= 1
    assert not store.is_locked(MODEL)  # the kernel dropped the dead controller's lock
    # The canary stays live where it was (the replicas lag by one step at most: a step is
    # recorded before the gateways are told).
    assert all(0 < weight <= killed_at.weight for weight in weights(fleet))

    second = spawn(fleet, store, "resume", MODEL)
    try:
        poll(lambda: len(takeovers(store)) == 2, 20, "the new controller to take the rollout")
        code, output = finish(spawn(fleet, store, "pause", MODEL, "--reason", "look"))
        assert code == 0, output
        assert store.load(MODEL).phase is Phase.PAUSED
        code, output = finish(spawn(fleet, store, "resume", MODEL))
        assert code == 0, output
        code, output = finish(second)
    finally:
        if second.poll() is None:
            second.kill()
    assert code == 0, output
    assert store.load(MODEL).phase is Phase.SUCCEEDED
    resumed_at = takeovers(store)[1].at
    later_steps = [
        e.step for e in events(store)
        if e.at >= resumed_at and e.kind == "transition" and e.phase == "progressing"
    ]  # fmt: skip
    assert later_steps and min(later_steps) >= killed_at.step  # never started over


def takeovers(store: StateStore) -> list[Event]:
    return [
        e for e in events(store) if e.kind == "controller" and "drives the rollout" in e.message
    ]


def test_with_failover_clients_see_no_errors_from_a_bad_canary(
    fleet: Fleet, store: StateStore
) -> None:
    before = fleet.load.counts()
    output = rollout(fleet, store, FAILING, "--failover", prometheus=False)
    during = fleet.load.counts()
    state = store.load(MODEL)
    assert state.phase is Phase.ROLLED_BACK, output  # judged on the gateways' own /metrics
    failed = next(e for e in events(store) if e.outcome == "fail")
    assert failed.numbers["canary"]["errors"] > 0  # the canary did fail, behind failover
    assert during.sent - before.sent > 100
    assert during.errors == before.errors
