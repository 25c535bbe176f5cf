"""Canary rollouts end to end: two real gateway processes behind steady client traffic, a
real Prometheus scraping them every second, and the controller run as ``slipway canary``.

The fleet's repository holds the tiny test model as version 1 (stable), unchanged copies
(good canaries), a wrapper failing the 20 % of requests whose inputs hash low, and a
wrapper that waits about 100 ms per call (several times stable's latency). Rollouts run
the controller in the test process; the outage and kill tests run it as a process of its
own, to signal it and to act while it runs.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest
import yaml

from ops.events import Event
from ops.gateway_admin import GatewayAdmin, GatewayAdminError, UnknownModelError
from ops.state import Phase, StateStore
from serving.routing import ModelRouting, load_routing
from slipway.demo_rollout import request_pool
from tests.support.rollouts import (
    FAILING,
    GOOD,
    GOOD_KILLED,
    GOOD_OUTAGE,
    MODEL,
    SLOW,
    STABLE,
    TOKEN,
    Fleet,
    Rollouts,
    canary,
    events,
    finish,
    replica_routing,
    rollout,
    spawn,
    start_args,
)
from tests.support.serving_models import ServingModel
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.process, pytest.mark.timeout(420)]

# The rollouts that test the controller's control flow judge errors only: on a loaded
# machine a freshly loaded, identical canary's p99 can exceed stable's several times over.
ANALYSIS = {
    "window": "5s",
    "min_requests": 20,
    "checks": {"latency_p99": {"max_ratio": None, "max_added_ms": None}},
}
# The slow-canary rollout judges latency, with bounds the slow canary's delay always exceeds.
LATENCY_ANALYSIS = {
    "window": "5s",
    "min_requests": 20,
    "checks": {"latency_p99": {"max_ratio": 1.5, "max_added_ms": 25}},
}


@pytest.fixture(scope="module")
def fleet(
    rollout_fleet: Fleet, serving_model: ServingModel, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Rollouts]:
    """The shared fleet under unlabelled client traffic, judged by ANALYSIS."""
    work = tmp_path_factory.mktemp("rollouts")
    analysis = work / "analysis.yaml"
    analysis.write_text(yaml.safe_dump(ANALYSIS))
    (work / "latency-analysis.yaml").write_text(yaml.safe_dump(LATENCY_ANALYSIS))
    with rollout_fleet.traffic(request_pool(serving_model.signature_json())) as load:
        yield Rollouts.on(rollout_fleet, load, analysis)


def weights(fleet: Fleet) -> list[float]:
    """The canary weight on each replica (they differ for an instant during a change)."""
    return [routing.canary_weight for routing in fleet.admin().get_routing(MODEL).values()]


# -- the admin client against real replicas ------------------------------------------------


def test_admin_checks_versions_and_names_the_replica_that_failed(
    fleet: Rollouts, store: StateStore
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


def test_a_good_canary_is_promoted_through_every_step(fleet: Rollouts, store: StateStore) -> None:
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

    code, output = canary(store, "status", MODEL)
    assert code == 0 and "succeeded" in output, output
    # No controller runs any more: the command applies itself, within the rollback window.
    code, output = canary(store, "rollback", MODEL, "--reason", "second thoughts")
    assert code == 0, output
    assert store.load(MODEL).phase is Phase.ROLLED_BACK
    assert replica_routing(fleet).labels == {"stable": STABLE}


def test_a_canary_answering_errors_is_rolled_back(fleet: Rollouts, store: StateStore) -> None:
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


def test_a_slow_canary_is_rolled_back(fleet: Rollouts, store: StateStore) -> None:
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
    fleet: Rollouts, store: StateStore
) -> None:
    controller = spawn(fleet, store, *start_args(fleet, GOOD_OUTAGE, "--bake", "4s"))
    try:
        wait_until(lambda: any(e.kind == "analysis" for e in events(store)), "a first analysis", 30)
        fleet.prometheus.stop()
        try:
            wait_until(lambda: len(outage_holds(store)) >= 3, "three holds without Prometheus", 30)
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


def test_a_killed_controller_resumes_from_its_state_file(
    fleet: Rollouts, store: StateStore
) -> None:
    first = spawn(fleet, store, *start_args(fleet, GOOD_KILLED, "--bake", "5s"))
    try:
        # An upper bound for a failure only: a busy machine bakes and analyses slower.
        wait_until(lambda: min(weights(fleet)) >= 0.5, "every replica at the second step", 120)
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
        wait_until(lambda: len(takeovers(store)) == 2, "the new controller to take the rollout", 60)
        code, output = canary(store, "pause", MODEL, "--reason", "look")
        assert code == 0, output
        assert store.load(MODEL).phase is Phase.PAUSED
        code, output = canary(store, "resume", MODEL)
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
    fleet: Rollouts, store: StateStore
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
