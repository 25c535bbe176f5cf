"""The rollout state machine and controller, with a scripted metrics provider, a recording
gateway admin and a clock the test moves: every transition, persistence and resume, one
rollout per model, operator commands, holds and halts."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from ops.analysis import AnalysisConfig
from ops.controller import STATE_LABELS, Controller, ControllerMetrics, start_rollout
from ops.events import Event, EventLog
from ops.gateway_admin import GatewayAdminError
from ops.measurement import Measurement, MetricsUnavailable, SideMeasurement
from ops.state import (
    PREVIOUS,
    TRANSITIONS,
    Phase,
    RolloutLocked,
    RolloutSpec,
    RolloutState,
    StateError,
    StateStore,
    Targets,
    new_rollout,
    routing_for,
)
from ops.timeline import draw_timeline, render_timeline
from serving.routing import ModelRouting

MODEL = "digits"
STABLE, CANARY = 1, 2
BASE = ModelRouting(
    labels={"stable": STABLE, "gold": 0}, sticky_header="x-user", timeout_ms=500, failover=True
)


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


class RecordingAdmin:
    """Remembers every routing it was asked to set; can be told to fail."""

    def __init__(self, base: ModelRouting = BASE) -> None:
        self.base = base
        self.calls: list[ModelRouting] = []
        self.failing = False

    def set_routing(self, model: str, routing: ModelRouting) -> None:
        assert model == MODEL
        if self.failing:
            raise GatewayAdminError("http://replica-2:8501: connection refused")
        self.calls.append(routing)

    def checked(self, model: str, versions: list[int]) -> ModelRouting:
        assert sorted(versions) == [STABLE, CANARY]
        return self.base

    @property
    def weights(self) -> list[float]:
        return [routing.canary_weight for routing in self.calls]


def side(version: int, requests: float, errors: float = 0.0) -> SideMeasurement:
    fast = 0.9 * requests
    return SideMeasurement(
        version=version,
        requests=requests,
        errors=errors,
        latency_buckets=((0.005, fast), (0.01, requests), (float("inf"), requests)),
        failovers=0.0,
    )


def measurement(
    canary_requests: float = 200,
    canary_errors: float = 0,
    *,
    shadow: tuple[float, float] | None = None,
) -> Measurement:
    agreement, compared = shadow if shadow else (None, 0.0)
    return Measurement(
        model=MODEL,
        window_seconds=30,
        stable=side(STABLE, 2000),
        canary=side(CANARY, canary_requests, canary_errors),
        shadow_agreement=agreement,
        shadow_requests=compared,
        custom={},
        taken_at=0.0,
    )


GOOD = measurement()
GOOD_P99_MS = 9.5  # 90 % within 5 ms, the rest within 10 ms: 5 + 5 × (0.99 - 0.9) / 0.1
BAD = measurement(200, 40)
FEW = measurement(10)  # under min_requests: inconclusive
NONE = measurement(0)  # no canary traffic: no_data


class ScriptedProvider:
    """Answers each measure() with the next item: a Measurement, or an exception to raise."""

    def __init__(self, *script: Measurement | Exception, then: Measurement | None = GOOD) -> None:
        self.script = list(script)
        self.then = then
        self.calls = 0

    def measure(self, model: str, stable: int, canary: int, window: float) -> Measurement:
        assert (model, stable, canary) == (MODEL, STABLE, CANARY)
        self.calls += 1
        item = self.script.pop(0) if self.script else self.then
        if isinstance(item, Exception):
            raise item
        assert item is not None
        return item

    def close(self) -> None:
        pass


def make_spec(**changes: object) -> RolloutSpec:
    values: dict[str, object] = {
        "model": MODEL,
        "stable_version": STABLE,
        "canary_version": CANARY,
        "steps": [10, 50, 100],
        "bake_seconds": 3,
        "interval_seconds": 1,
        # One failing analysis rolls back here; the failure limit has its own tests.
        "analysis": AnalysisConfig(failure_limit=1).model_dump(mode="json"),
        "targets": Targets(gateways=["http://replica-1:8501"]),
    }
    values.update(changes)
    return RolloutSpec.model_validate(values)


@pytest.fixture
def store(tmp_path: Path) -> StateStore:
    return StateStore(tmp_path / "rollouts")


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def admin() -> RecordingAdmin:
    return RecordingAdmin()


def controller_for(
    store: StateStore,
    admin: RecordingAdmin,
    clock: Clock,
    metrics: ControllerMetrics | None = None,
    **spec: object,
) -> Controller:
    state = start_rollout(store, make_spec(**spec), admin, clock=clock)
    return Controller(state, store, admin, clock=clock, metrics=metrics)


def run_ticks(controller: Controller, provider: ScriptedProvider, clock: Clock, count: int) -> None:
    for _ in range(count):
        if controller.state.terminal:
            return
        controller.tick(provider)
        clock.now += controller.state.spec.interval_seconds


def analyses(store: StateStore) -> list[Event]:
    return [e for e in EventLog(store.events_path(MODEL)).read() if e.kind == "analysis"]


# -- the transition table ----------------------------------------------------------------


@pytest.mark.parametrize("source", list(Phase))
def test_every_transition_is_allowed_or_refused_by_the_table(source: Phase) -> None:
    state = new_rollout(make_spec(), BASE, 0.0).model_copy(update={"phase": source, "step": 0})
    for target in Phase:
        if target in TRANSITIONS[source]:
            moved = state.moved(target, 5.0, reason="because")
            assert (moved.phase, moved.since, moved.reason) == (target, 5.0, "because")
            assert moved.finished_at == (
                5.0 if target in (Phase.SUCCEEDED, Phase.ROLLED_BACK) else None
            )
        else:
            with pytest.raises(StateError, match=f"cannot move to {target.value}"):
                state.moved(target, 5.0)


def test_finished_rollouts_only_leave_through_a_rollback_after_promotion() -> None:
    assert TRANSITIONS[Phase.ROLLED_BACK] == frozenset()
    assert TRANSITIONS[Phase.SUCCEEDED] == {Phase.ROLLING_BACK}


def test_spec_refuses_bad_steps_and_same_versions() -> None:
    with pytest.raises(ValueError, match="steps must increase"):
        make_spec(steps=[50, 10])
    with pytest.raises(ValueError, match=r"in \(0, 100\]"):
        make_spec(steps=[0, 10])
    with pytest.raises(ValueError, match="already the stable version"):
        make_spec(canary_version=STABLE)
    with pytest.raises(ValueError, match="model name"):
        make_spec(model="../etc")


# -- routing per state ---------------------------------------------------------------------


def test_routing_keeps_the_base_settings_through_the_rollout() -> None:
    state = new_rollout(make_spec(), BASE, 0.0)
    assert routing_for(state) is None  # pending: nothing changed yet
    progressing = state.moved(Phase.PROGRESSING, 1.0, step=1)
    routing = routing_for(progressing)
    assert routing is not None
    assert routing.labels == {"stable": STABLE, "canary": CANARY, "gold": 0}
    assert (routing.canary_weight, routing.sticky_header, routing.timeout_ms) == (
        0.5,
        "x-user",
        500,
    )
    assert routing.failover is True
    paused = progressing.moved(Phase.PAUSED, 2.0)
    assert routing_for(paused) == routing  # a halt keeps the weight
    promoted = progressing.moved(Phase.PROMOTING, 3.0).moved(Phase.SUCCEEDED, 3.0)
    after = routing_for(promoted)
    assert after is not None
    assert after.labels == {"stable": CANARY, PREVIOUS: STABLE, "gold": 0}
    assert after.canary_weight == 0
    back = routing_for(promoted.moved(Phase.ROLLING_BACK, 4.0))
    assert back is not None
    assert back.labels == {"stable": STABLE, "gold": 0}


def test_failover_setting_of_the_spec_overrides_the_base() -> None:
    state = new_rollout(make_spec(failover=False), BASE, 0.0).moved(Phase.PROGRESSING, 1.0, step=0)
    routing = routing_for(state)
    assert routing is not None and routing.failover is False


# -- analysis decisions ----------------------------------------------------------------------


def test_a_good_canary_is_promoted_through_every_step(
    store: StateStore, admin: RecordingAdmin, clock: Clock
) -> None:
    metrics = ControllerMetrics()
    controller = controller_for(store, admin, clock, metrics)
    run_ticks(controller, ScriptedProvider(), clock, 30)
    state = controller.state
    assert state.phase is Phase.SUCCEEDED
    assert admin.weights == [0.1, 0.5, 1.0, 0.0]
    final = admin.calls[-1]
    assert final.labels == {"stable": CANARY, PREVIOUS: STABLE, "gold": 0}
    # Each step bakes 3 s of passing, counted from its first pass: three passing
    # analyses bake, the fourth (3 s after the first) moves on.
    assert [event.decision for event in analyses(store)] == [
        *("bake", "bake", "bake", "advance"),
        *("bake", "bake", "bake", "advance"),
        *("bake", "bake", "bake", "promote"),
    ]
    assert metrics.state.labels(MODEL, "promoted")._value.get() == 1
    assert metrics.rollbacks.labels(MODEL)._value.get() == 0


def test_a_failing_canary_is_rolled_back_at_once(
    store: StateStore, admin: RecordingAdmin, clock: Clock
) -> None:
    metrics = ControllerMetrics()
    controller = controller_for(store, admin, clock, metrics)
    provider = ScriptedProvider(GOOD, BAD)
    run_ticks(controller, provider, clock, 10)
    state = controller.state
    assert state.phase is Phase.ROLLED_BACK
    assert provider.calls == 2
    assert admin.weights == [0.1, 0.0]
    assert admin.calls[-1].labels == {"stable": STABLE, "gold": 0}
    assert "error_rate" in (state.reason or "")
    event = analyses(store)[-1]
    assert (event.outcome, event.decision) == ("fail", "rollback")
    assert event.numbers is not None and event.numbers["canary"]["errors"] == 40
    assert any(check["name"] == "error_rate" and check["passed"] is False for check in event.checks)
    assert metrics.rollbacks.labels(MODEL)._value.get() == 1
    assert metrics.state.labels(MODEL, "rolled_back")._value.get() == 1


@pytest.mark.parametrize(
    "blip",
    [NONE, FEW, MetricsUnavailable("prometheus: connection refused")],
    ids=["no-traffic", "too-few-requests", "metrics-unavailable"],
)
def test_no_verdict_holds_the_weight_and_then_continues(
    store: StateStore, admin: RecordingAdmin, clock: Clock, blip: object
) -> None:
    controller = controller_for(store, admin, clock)
    provider = ScriptedProvider(GOOD, GOOD, GOOD, GOOD, *[blip] * 6)
    run_ticks(controller, provider, clock, 11)  # start, one step advanced, six holds
    assert controller.state.phase is Phase.PROGRESSING
    assert controller.state.step == 1
    assert controller.state.held == 6
    assert admin.weights == [0.1, 0.5]
    assert [e.decision for e in analyses(store)][-6:] == ["hold"] * 6
    run_ticks(controller, provider, clock, 30)
    assert controller.state.phase is Phase.SUCCEEDED


def slow_canary(p99_seconds: float, stable_requests: float = 400) -> Measurement:
    """Stable answers in under 5 ms; the canary takes ``p99_seconds`` for most requests."""
    canary = SideMeasurement(
        version=CANARY, requests=400, errors=0,
        latency_buckets=((0.005, 0.0), (p99_seconds, 400), (float("inf"), 400)), failovers=0,
    )  # fmt: skip
    stable = SideMeasurement(
        version=STABLE, requests=stable_requests, errors=0,
        latency_buckets=(
            (0.005, stable_requests), (p99_seconds, stable_requests),
            (float("inf"), stable_requests),
        ),
        failovers=0,
    )  # fmt: skip
    return Measurement(MODEL, 30, stable, canary, None, 0.0, {}, 0.0)


def test_below_full_traffic_a_canary_slower_than_stable_is_rolled_back(
    store: StateStore, admin: RecordingAdmin, clock: Clock
) -> None:
    controller = controller_for(store, admin, clock, steps=[50, 100])
    run_ticks(controller, ScriptedProvider(slow_canary(0.05)), clock, 2)
    assert controller.state.phase is Phase.ROLLED_BACK
    assert "latency_p99" in (controller.state.reason or "")


def test_at_full_traffic_the_previous_steps_stable_is_the_baseline(
    store: StateStore, admin: RecordingAdmin, clock: Clock
) -> None:
    controller = controller_for(store, admin, clock, steps=[50, 100])
    run_ticks(controller, ScriptedProvider(GOOD, GOOD, GOOD), clock, 4)  # start, 3 passes
    assert controller.state.baseline is not None
    run_ticks(controller, ScriptedProvider(GOOD), clock, 1)
    assert controller.state.weight == 1.0
    # The baseline is in the state file: a restarted controller compares with it too.
    restarted = Controller(store.load(MODEL), store, admin, clock=clock)
    run_ticks(restarted, ScriptedProvider(then=slow_canary(0.05, stable_requests=0)), clock, 1)
    assert restarted.state.phase is Phase.ROLLED_BACK
    assert "latency_p99" in (restarted.state.reason or "")
    last = analyses(store)[-1]
    assert last.numbers["stable"]["baseline"] is True
    assert last.numbers["stable"]["requests"] == 2000  # GOOD's stable side, not the empty one


@pytest.mark.parametrize(("max_ms", "outcome"), [(None, Phase.SUCCEEDED), (20, Phase.ROLLED_BACK)])
def test_without_any_stable_baseline_only_absolute_bounds_apply(
    store: StateStore, admin: RecordingAdmin, clock: Clock, max_ms: float | None, outcome: Phase
) -> None:
    analysis = {"failure_limit": 1, "checks": {"latency_p99": {"max_ms": max_ms}}}
    controller = controller_for(
        store, admin, clock, steps=[100],
        analysis=AnalysisConfig.model_validate(analysis).model_dump(mode="json"),
    )  # fmt: skip
    run_ticks(controller, ScriptedProvider(then=slow_canary(0.05, stable_requests=0)), clock, 10)
    assert controller.state.phase is outcome


def test_a_step_bakes_only_on_continuous_passing_time(
    store: StateStore, admin: RecordingAdmin, clock: Clock
) -> None:
    controller = controller_for(store, admin, clock)
    # Seven inconclusive analyses, then one pass: the step began 8 s ago, but it has
    # passed for 0 s of its 3 s bake.
    run_ticks(controller, ScriptedProvider(*[FEW] * 7, GOOD), clock, 9)
    assert controller.state.step == 0
    assert controller.state.passing_since == clock.now - 1
    # Pass, pass, one hold, pass, pass: the hold restarts the bake, no advance yet.
    run_ticks(controller, ScriptedProvider(GOOD, FEW, GOOD, GOOD), clock, 4)
    assert controller.state.step == 0
    assert [e.decision for e in analyses(store)][-5:] == ["bake", "bake", "hold", "bake", "bake"]
    run_ticks(controller, ScriptedProvider(GOOD, GOOD), clock, 2)
    assert controller.state.step == 1


def test_the_passing_streak_survives_a_controller_restart(
    store: StateStore, admin: RecordingAdmin, clock: Clock
) -> None:
    controller = controller_for(store, admin, clock)
    run_ticks(controller, ScriptedProvider(GOOD, GOOD), clock, 3)  # start, two passes
    started = controller.state.passing_since
    restarted = Controller(store.load(MODEL), store, admin, clock=clock)
    assert restarted.state.passing_since == started
    run_ticks(restarted, ScriptedProvider(GOOD, GOOD), clock, 2)
    assert restarted.state.step == 1  # 3 s of passing across the restart


def limited(failure_limit: int) -> dict[str, object]:
    return AnalysisConfig(failure_limit=failure_limit).model_dump(mode="json")


def test_failing_analyses_roll_back_only_at_the_failure_limit_in_a_row(
    store: StateStore, admin: RecordingAdmin, clock: Clock
) -> None:
    controller = controller_for(store, admin, clock, analysis=limited(2))
    run_ticks(controller, ScriptedProvider(BAD, GOOD, BAD, FEW, BAD), clock, 6)
    assert controller.state.phase is Phase.PROGRESSING  # never two failures in a row
    decisions = [(e.outcome, e.decision) for e in analyses(store)]
    assert decisions[0] == ("fail", "hold")
    assert "failing analysis 1 of 2 in a row" in analyses(store)[0].message
    assert controller.state.failures == 1
    # The count is in the state file: the second failure after a restart rolls back.
    restarted = Controller(store.load(MODEL), store, admin, clock=clock)
    run_ticks(restarted, ScriptedProvider(BAD), clock, 1)
    assert restarted.state.phase is Phase.ROLLED_BACK
    assert "2 failing analyses in a row" in analyses(store)[-1].message


def test_a_blip_of_bad_luck_under_min_requests_never_rolls_back(
    store: StateStore, admin: RecordingAdmin, clock: Clock
) -> None:
    controller = controller_for(store, admin, clock)
    run_ticks(controller, ScriptedProvider(measurement(10, 10), then=None), clock, 2)
    assert controller.state.phase is Phase.PROGRESSING
    assert analyses(store)[-1].outcome == "inconclusive"


def test_n_verdictless_analyses_in_a_row_halt_until_resumed(
    store: StateStore, admin: RecordingAdmin, clock: Clock
) -> None:
    metrics = ControllerMetrics()
    controller = controller_for(store, admin, clock, metrics, max_held=3)
    provider = ScriptedProvider(NONE, FEW, GOOD, NONE, NONE, NONE, then=GOOD)
    run_ticks(controller, provider, clock, 4)  # start, then none, few, good
    assert controller.state.phase is Phase.PROGRESSING  # a pass in between resets the count
    run_ticks(controller, provider, clock, 2)
    assert controller.state.held == 2
    run_ticks(controller, provider, clock, 1)
    state = controller.state
    assert state.phase is Phase.INCONCLUSIVE
    assert "3 times in a row" in (state.reason or "")
    assert metrics.state.labels(MODEL, "paused")._value.get() == 1
    run_ticks(controller, provider, clock, 10)  # passing analyses do not un-halt
    assert controller.state.phase is Phase.INCONCLUSIVE
    assert admin.weights == [0.1]  # one pass between non-passes never baked the step
    assert controller.command("resume").accepted
    assert controller.state.phase is Phase.PROGRESSING and controller.state.step == 0
    assert admin.weights == [0.1]
    run_ticks(controller, provider, clock, 30)
    assert controller.state.phase is Phase.SUCCEEDED


def test_shadow_phase_mirrors_first_then_progresses(
    store: StateStore, admin: RecordingAdmin, clock: Clock
) -> None:
    controller = controller_for(store, admin, clock, shadow_percent=5)
    shadow_only = measurement(0, shadow=(0.99, 400))
    provider = ScriptedProvider(*[shadow_only] * 4)
    run_ticks(controller, provider, clock, 1)
    assert controller.state.phase is Phase.SHADOW
    mirror = admin.calls[0]
    assert mirror.canary_weight == 0
    assert mirror.shadow is not None and (mirror.shadow.label, mirror.shadow.percent) == (
        "canary",
        5,
    )
    run_ticks(controller, provider, clock, 4)
    assert controller.state.phase is Phase.PROGRESSING
    assert admin.calls[-1].shadow is None and admin.calls[-1].canary_weight == 0.1


def test_a_shadow_that_disagrees_is_rolled_back(
    store: StateStore, admin: RecordingAdmin, clock: Clock
) -> None:
    controller = controller_for(store, admin, clock, shadow_percent=5)
    run_ticks(controller, ScriptedProvider(measurement(0, shadow=(0.5, 400))), clock, 3)
    assert controller.state.phase is Phase.ROLLED_BACK
    assert "shadow_agreement" in (controller.state.reason or "")


# -- operator commands -------------------------------------------------------------------


def test_pause_stops_advancing_but_a_failure_still_rolls_back(
    store: StateStore, admin: RecordingAdmin, clock: Clock
) -> None:
    controller = controller_for(store, admin, clock)
    provider = ScriptedProvider(*[GOOD] * 10, BAD)
    run_ticks(controller, provider, clock, 1)  # started at 10 %
    assert controller.command("pause", reason="checking dashboards").accepted
    assert controller.state.phase is Phase.PAUSED
    assert controller.state.reason == "paused by operator (checking dashboards)"
    run_ticks(controller, provider, clock, 10)
    assert controller.state.phase is Phase.PAUSED
    assert {e.decision for e in analyses(store)} == {"watch"}
    assert admin.weights == [0.1]
    run_ticks(controller, provider, clock, 1)
    assert controller.state.phase is Phase.ROLLED_BACK


def test_resume_restarts_the_bake_of_the_current_step(
    store: StateStore, admin: RecordingAdmin, clock: Clock
) -> None:
    controller = controller_for(store, admin, clock)
    provider = ScriptedProvider()
    run_ticks(controller, provider, clock, 2)
    controller.command("pause")
    clock.now += 100
    assert controller.command("resume").accepted
    assert controller.state.since == clock.now
    run_ticks(controller, provider, clock, 3)
    assert controller.state.step == 0  # baking again from the resume
    run_ticks(controller, provider, clock, 1)
    assert controller.state.step == 1


def test_promote_skips_the_remaining_steps(
    store: StateStore, admin: RecordingAdmin, clock: Clock
) -> None:
    controller = controller_for(store, admin, clock)
    run_ticks(controller, ScriptedProvider(), clock, 1)
    event = controller.command("promote")
    assert event.accepted and controller.state.phase is Phase.SUCCEEDED
    assert admin.calls[-1].labels["stable"] == CANARY


def test_abort_takes_the_canary_out(store: StateStore, admin: RecordingAdmin, clock: Clock) -> None:
    controller = controller_for(store, admin, clock)
    run_ticks(controller, ScriptedProvider(), clock, 5)
    assert controller.command("abort", reason="wrong build").accepted
    state = controller.state
    assert state.phase is Phase.ROLLED_BACK
    assert state.reason == "aborted by operator (wrong build)"
    assert admin.calls[-1].canary_weight == 0 and "canary" not in admin.calls[-1].labels


def test_rollback_after_promotion_restores_stable_within_the_window(
    store: StateStore, admin: RecordingAdmin, clock: Clock
) -> None:
    controller = controller_for(store, admin, clock, rollback_window_seconds=600)
    run_ticks(controller, ScriptedProvider(), clock, 1)
    controller.command("promote")
    clock.now += 599
    assert controller.command("rollback").accepted
    assert controller.state.phase is Phase.ROLLED_BACK
    assert admin.calls[-1].labels == {"stable": STABLE, "gold": 0}


def test_rollback_after_the_window_is_refused(
    store: StateStore, admin: RecordingAdmin, clock: Clock
) -> None:
    controller = controller_for(store, admin, clock, rollback_window_seconds=600)
    run_ticks(controller, ScriptedProvider(), clock, 1)
    controller.command("promote")
    calls = len(admin.calls)
    clock.now += 601
    event = controller.command("rollback")
    assert not event.accepted and "rollback window" in event.message
    assert controller.state.phase is Phase.SUCCEEDED and len(admin.calls) == calls


@pytest.mark.parametrize(
    ("phase", "action"),
    [
        (Phase.ROLLED_BACK, "pause"),
        (Phase.ROLLED_BACK, "abort"),
        (Phase.ROLLED_BACK, "rollback"),
        (Phase.SUCCEEDED, "promote"),
        (Phase.SUCCEEDED, "abort"),
        (Phase.PROGRESSING, "resume"),
        (Phase.PENDING, "pause"),
        (Phase.PENDING, "promote"),
    ],
)
def test_commands_that_do_not_apply_are_refused_without_change(
    store: StateStore, admin: RecordingAdmin, clock: Clock, phase: Phase, action: str
) -> None:
    state = start_rollout(store, make_spec(), admin, clock=clock)
    state = state.model_copy(update={"phase": phase, "step": 0})
    store.save(state)
    controller = Controller(state, store, admin, clock=clock)
    event = controller.command(action)
    assert not event.accepted
    assert f"cannot {action}" in event.message
    assert store.load(MODEL) == state and admin.calls == []


def test_requests_posted_to_the_store_are_applied_in_order(
    store: StateStore, admin: RecordingAdmin, clock: Clock
) -> None:
    controller = controller_for(store, admin, clock)
    run_ticks(controller, ScriptedProvider(), clock, 1)
    pause = store.post(MODEL, "pause", "look")
    resume = store.post(MODEL, "resume")
    (store.model_dir(MODEL) / "requests" / "99999999999999999999-junk.json").write_text("{")
    controller.handle_requests()
    answers = {
        e.request: e for e in EventLog(store.events_path(MODEL)).read() if e.kind == "command"
    }
    assert answers[pause.id].accepted and answers[resume.id].accepted
    assert controller.state.phase is Phase.PROGRESSING
    rejected = [e for e in EventLog(store.events_path(MODEL)).read() if e.accepted is False]
    assert len(rejected) == 1 and "unreadable request" in rejected[0].message
    assert store.pending_requests(MODEL) == []


# -- persistence, resume, one rollout per model ------------------------------------------


def test_state_survives_a_restart_and_the_rollout_resumes_where_it_was(
    store: StateStore, admin: RecordingAdmin, clock: Clock
) -> None:
    controller = controller_for(store, admin, clock)
    provider = ScriptedProvider()
    run_ticks(controller, provider, clock, 6)
    before = controller.state
    assert before.step == 1
    restored = store.load(MODEL)
    assert restored == before
    fresh_admin = RecordingAdmin()
    resumed = Controller(restored, store, fresh_admin, clock=clock)
    assert resumed.reconcile()
    assert fresh_admin.weights == [0.5]  # the restarted controller re-asserts its step
    run_ticks(resumed, provider, clock, 30)
    assert resumed.state.phase is Phase.SUCCEEDED
    assert fresh_admin.weights == [0.5, 1.0, 0.0]


def test_a_replica_that_cannot_be_told_is_retried_until_the_rollback_is_done(
    store: StateStore, admin: RecordingAdmin, clock: Clock
) -> None:
    controller = controller_for(store, admin, clock)
    provider = ScriptedProvider(BAD)
    run_ticks(controller, provider, clock, 1)
    admin.failing = True
    run_ticks(controller, provider, clock, 1)
    assert controller.state.phase is Phase.ROLLING_BACK  # decided and recorded, not yet done
    assert store.load(MODEL).phase is Phase.ROLLING_BACK
    errors = [e for e in EventLog(store.events_path(MODEL)).read() if e.kind == "routing_error"]
    assert errors and "replica-2" in errors[-1].message
    admin.failing = False
    run_ticks(controller, provider, clock, 1)
    assert controller.state.phase is Phase.ROLLED_BACK
    assert admin.weights == [0.1, 0.0]


def test_state_file_is_replaced_atomically_and_bad_files_are_named(store: StateStore) -> None:
    state = new_rollout(make_spec(), BASE, 0.0)
    store.save(state)
    path = store.state_path(MODEL)
    assert json.loads(path.read_text())["phase"] == "pending"
    assert [p.name for p in path.parent.iterdir()] == ["state.json"]  # no temporary left
    path.write_text('{"format": 1, "id": "x"}')
    with pytest.raises(StateError, match=r"state\.json: not a rollout state"):
        store.load(MODEL)


def test_one_rollout_per_model(store: StateStore, admin: RecordingAdmin, clock: Clock) -> None:
    with store.lock(MODEL):
        with pytest.raises(RolloutLocked, match=f"pid .* rollout of {MODEL}"):
            store.lock(MODEL).acquire()
        assert store.is_locked(MODEL)
        with store.lock("other-model"):
            pass
    assert not store.is_locked(MODEL)
    start_rollout(store, make_spec(), admin, clock=clock)
    with pytest.raises(StateError, match="resume or abort it first"):
        start_rollout(store, make_spec(), admin, clock=clock)


def test_a_new_rollout_moves_the_finished_one_to_history(
    store: StateStore, admin: RecordingAdmin, clock: Clock
) -> None:
    controller = controller_for(store, admin, clock)
    controller.command("abort")
    first = controller.state
    clock.now += 10
    second = start_rollout(store, make_spec(), admin, clock=clock)
    history = store.history(MODEL)
    assert [state.id for state in history] == [first.id, second.id]
    archived = EventLog(store.history_events_path(MODEL, first.id)).read()
    assert any(e.kind == "transition" and e.phase == "rolled_back" for e in archived)
    current = EventLog(store.events_path(MODEL)).read()
    assert [e.kind for e in current] == ["start"]


def test_run_applies_requests_between_ticks_and_stops_when_finished(
    store: StateStore, admin: RecordingAdmin
) -> None:
    state = start_rollout(store, make_spec(interval_seconds=600), admin)
    Controller(state, store, admin).tick(ScriptedProvider())
    store.post(MODEL, "promote")
    seen: list[Event] = []
    controller = Controller(store.load(MODEL), store, admin, on_event=seen.append)
    stop = threading.Event()
    guard = threading.Timer(30, stop.set)  # a broken loop fails the test instead of hanging it
    guard.start()
    try:
        final = controller.run(ScriptedProvider(), stop=stop)
    finally:
        guard.cancel()
    assert not stop.is_set()
    assert final.phase is Phase.SUCCEEDED
    assert [e.kind for e in seen] == ["controller", "transition", "command", "transition"]
    assert seen[2].accepted


# -- events and the timeline -------------------------------------------------------------


def test_event_log_skips_a_torn_last_line(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "events.jsonl")
    event = Event(at=1.0, rollout="r", kind="analysis", phase="progressing", step=0,
                  weight=0.1, message="m", numbers={"canary": {"p99_ms": float("nan")}})  # fmt: skip
    log.append(event)
    with log.path.open("a") as out:
        out.write('{"at": 2.0, "rollo')
    (read,) = log.read()
    assert read.numbers == {"canary": {"p99_ms": None}}  # NaN is not JSON: stored as null


@pytest.fixture
def finished_rollout(
    store: StateStore, admin: RecordingAdmin, clock: Clock
) -> Iterator[StateStore]:
    controller = controller_for(store, admin, clock)
    run_ticks(controller, ScriptedProvider(GOOD, NONE, FEW, *[GOOD] * 5, BAD), clock, 30)
    yield store


def test_timeline_is_drawn_from_the_event_log(finished_rollout: StateStore, tmp_path: Path) -> None:
    events = EventLog(finished_rollout.events_path(MODEL)).read()
    path = render_timeline(events, tmp_path / "out" / "timeline.png", title="digits 1 -> 2")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 10_000


def test_a_promoted_rollout_ends_at_full_traffic_and_a_rolled_back_one_at_zero(
    store: StateStore, admin: RecordingAdmin, clock: Clock, tmp_path: Path
) -> None:
    controller = controller_for(store, admin, clock, steps=[50, 100])
    run_ticks(controller, ScriptedProvider(), clock, 30)
    assert controller.state.phase is Phase.SUCCEEDED
    figure = draw_timeline(EventLog(store.events_path(MODEL)).read())
    weights, errors, latency = figure.axes
    assert list(weights.lines[0].get_ydata())[-2:] == [100.0, 100.0]  # promoting, succeeded
    # the checks' limits are drawn: stable's 0 % errors + 0.5 points, 1.2 × p99 + 5 ms
    (error_limit,) = [line for line in errors.lines if line.get_label() == "error_rate limit"]
    assert list(error_limit.get_ydata()) == pytest.approx([0.5] * len(error_limit.get_ydata()))
    (latency_limit,) = [line for line in latency.lines if line.get_label() == "latency_p99 limit"]
    limits = list(latency_limit.get_ydata())
    assert limits == pytest.approx([GOOD_P99_MS * 1.2 + 5] * len(limits))

    rolled_back = controller_for(StateStore(tmp_path / "other"), admin, clock)
    run_ticks(rolled_back, ScriptedProvider(GOOD, BAD), clock, 5)
    assert rolled_back.state.phase is Phase.ROLLED_BACK
    events = EventLog(StateStore(tmp_path / "other").events_path(MODEL)).read()
    assert list(draw_timeline(events).axes[0].lines[0].get_ydata())[-1] == 0.0


def test_a_rollout_with_labels_draws_live_accuracy_and_its_limit(
    store: StateStore, admin: RecordingAdmin, clock: Clock
) -> None:
    labelled = dataclasses.replace(
        GOOD,
        stable=dataclasses.replace(GOOD.stable, labelled=1000, correct=980),
        canary=dataclasses.replace(GOOD.canary, labelled=200, correct=120),
    )
    controller = controller_for(store, admin, clock)
    run_ticks(controller, ScriptedProvider(then=labelled), clock, 5)
    assert controller.state.phase is Phase.ROLLED_BACK
    figure = draw_timeline(EventLog(store.events_path(MODEL)).read())
    weights, errors, latency, accuracy = figure.axes
    lines = {line.get_label(): list(line.get_ydata()) for line in accuracy.lines}
    assert lines["stable"][0] == pytest.approx(98.0) and lines["canary"][0] == pytest.approx(60.0)
    # the floor the canary was judged against: stable's accuracy less the 2-point margin
    assert lines["accuracy limit"][0] == pytest.approx(96.0)


def test_controller_metrics_export_one_state_at_a_time() -> None:
    metrics = ControllerMetrics()
    metrics.set_phase(MODEL, Phase.PROGRESSING)
    metrics.set_phase(MODEL, Phase.PAUSED)
    values = {label: metrics.state.labels(MODEL, label)._value.get() for label in STATE_LABELS}
    assert values == {"idle": 0, "progressing": 0, "paused": 1, "promoted": 0, "rolled_back": 0}
    assert metrics.rollbacks.labels(MODEL)._value.get() == 0


def test_state_round_trips_through_json() -> None:
    state = new_rollout(make_spec(shadow_percent=2.5, max_held=4), BASE, 0.0)
    assert RolloutState.model_validate_json(state.model_dump_json()) == state
