"""The rollout controller: measure, judge, decide, and move the canary's weight.

Each interval the controller measures the canary against stable, asks the analysis for a
verdict and decides:

- fail, ``failure_limit`` analyses in a row: roll back (canary weight 0 and its label
  removed on every replica); a failure short of the limit holds like an inconclusive one;
- no data or inconclusive: hold the current weight (and halt, as ``inconclusive``, after
  ``max_held`` non-passing results in a row when configured: someone should look);
- pass: stay until the step has baked, i.e. passed without a break for ``bake_seconds``
  (any other outcome restarts the bake), then take the next step, or promote after the
  last.

At a 100 % step stable gets no traffic, yet a user expects a canary that got slower or
less accurate there to be caught as at any other step. So there stable's side of the last
analysis below 100 % (kept in the state, so it survives a restart: normally the end of
the previous step) is the baseline the relative bounds compare with. That baseline
carried a share of the load rather than all of it, so the latency ratio is a little
stricter there than at lower steps; the absolute bounds apply as everywhere. A rollout
straight to 100 % has no baseline and is judged on what stable still shows in the window.

Paused and inconclusive rollouts keep their weight and keep being analysed: a canary that
fails while halted is still rolled back. Operator commands (pause, resume, promote, abort,
rollback) arrive as request files and are applied between intervals.

Every decision is written to the state file before the gateways are told, and the routing
a state stands for is re-sent whenever it has not been confirmed by every replica (after
a restart, or when a replica was unreachable), so a crash or a partial failure at any
point converges on what the state file says.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge

from ops.analysis import AnalysisConfig, Verdict, judge, no_data
from ops.events import (
    Decision,
    Event,
    EventLog,
    Kind,
    measurement_numbers,
    verdict_checks,
)
from ops.gateway_admin import GatewayAdminError, UnknownModelError
from ops.measurement import Measurement, MetricsProvider, MetricsUnavailable, SideMeasurement
from ops.state import (
    ANALYSED,
    HALTED,
    TERMINAL,
    Phase,
    RolloutSpec,
    RolloutState,
    StateError,
    StateStore,
    new_rollout,
    routing_for,
)
from serving.routing import ModelRouting

logger = logging.getLogger(__name__)

# How often a running controller looks for operator commands between intervals.
REQUEST_POLL_S = 0.2


class RoutingAdmin(Protocol):
    """What the controller needs from the gateways (``ops.gateway_admin.GatewayAdmin``)."""

    def set_routing(self, model: str, routing: ModelRouting) -> None: ...

    def checked(self, model: str, versions: list[int]) -> ModelRouting: ...


# ---------------------------------------------------------------------------------------
# Metrics


# The values of slipway_rollout_state's `state` label (ops/deploy/prometheus/rules/alerts.yml).
STATE_LABELS = ("idle", "progressing", "paused", "promoted", "rolled_back")


def state_label(phase: Phase | None) -> str:
    if phase is None:
        return "idle"
    if phase in HALTED:
        return "paused"
    if phase is Phase.SUCCEEDED:
        return "promoted"
    if phase is Phase.ROLLED_BACK:
        return "rolled_back"
    return "progressing"


class ControllerMetrics:
    """``slipway_rollout_rollbacks_total{model}`` and ``slipway_rollout_state{model,state}``."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.rollbacks = Counter(
            "slipway_rollout_rollbacks",
            "Rollbacks the controller performed (canary weight 0, canary label dropped).",
            ("model",),
            registry=self.registry,
        )
        self.state = Gauge(
            "slipway_rollout_state",
            "1 for the rollout's current state, 0 for the others.",
            ("model", "state"),
            registry=self.registry,
        )

    def set_phase(self, model: str, phase: Phase | None) -> None:
        self.rollbacks.labels(model)  # exported from 0 for every model managed
        current = state_label(phase)
        for label in STATE_LABELS:
            self.state.labels(model, label).set(1 if label == current else 0)

    def rolled_back(self, model: str) -> None:
        self.rollbacks.labels(model).inc()


# ---------------------------------------------------------------------------------------
# Starting a rollout


def start_rollout(
    store: StateStore,
    spec: RolloutSpec,
    admin: RoutingAdmin,
    *,
    clock: Callable[[], float] = time.time,
) -> RolloutState:
    """Check the gateways and record a new pending rollout (the caller holds the lock).

    The model and both versions must be available on every replica; the model's current
    routing becomes the rollout's base. A finished earlier rollout moves to the history;
    an unfinished one is an error, since one model has one rollout at a time.
    """
    existing = store.load(spec.model)
    if existing is not None and not existing.terminal:
        raise StateError(
            f"the rollout {existing.id} of {spec.model} to version "
            f"{existing.spec.canary_version} is {existing.phase.value}; resume or abort it first"
        )
    base = admin.checked(spec.model, [spec.stable_version, spec.canary_version])
    if existing is not None:
        store.archive(spec.model)
    store.discard_requests(spec.model)
    now = clock()
    state = new_rollout(spec, base, now)
    store.save(state)
    EventLog(store.events_path(spec.model)).append(
        _event(
            state,
            now,
            "start",
            f"rollout of {spec.model}: version {spec.stable_version} "
            f"-> {spec.canary_version}, steps {_steps(spec)}",
        )
    )
    return state


# ---------------------------------------------------------------------------------------
# The controller


class Controller:
    """Drives one rollout; the caller holds the model's lock while it does."""

    def __init__(
        self,
        state: RolloutState,
        store: StateStore,
        admin: RoutingAdmin,
        *,
        clock: Callable[[], float] = time.time,
        metrics: ControllerMetrics | None = None,
        on_event: Callable[[Event], None] | None = None,
    ) -> None:
        self._state = state
        self._store = store
        self._admin = admin
        self._clock = clock
        self._metrics = metrics
        self._on_event = on_event
        self._events = EventLog(store.events_path(state.model))
        self._analysis = AnalysisConfig.model_validate(state.spec.analysis)
        self._applied: ModelRouting | None = None  # routing every replica confirmed
        if metrics is not None:
            metrics.set_phase(state.model, state.phase)

    @property
    def state(self) -> RolloutState:
        return self._state

    @property
    def analysis(self) -> AnalysisConfig:
        return self._analysis

    # -- the loop -------------------------------------------------------------------------

    def run(
        self, provider: MetricsProvider, *, stop: threading.Event | None = None
    ) -> RolloutState:
        """Tick every interval and apply operator commands in between, until the rollout
        finishes or ``stop`` is set (the rollout then stays where it is, to be resumed)."""
        stop = stop or threading.Event()
        now = self._clock()
        self._record(
            "controller",
            now,
            f"controller pid {os.getpid()} on {socket.gethostname()} "
            f"drives the rollout ({self._state.phase.value})",
        )
        self.reconcile()
        next_tick = time.monotonic()
        while not self._state.terminal and not stop.is_set():
            self.handle_requests()
            if self._state.terminal:
                break
            if time.monotonic() >= next_tick:
                next_tick = time.monotonic() + self._state.spec.interval_seconds
                self.tick(provider)
            stop.wait(max(0.0, min(REQUEST_POLL_S, next_tick - time.monotonic())))
        if not self._state.terminal:
            self._record(
                "controller",
                self._clock(),
                "controller stopped; the rollout stays "
                f"{self._state.phase.value} at {self._state.weight:.0%} until resumed",
            )
        return self._state

    def tick(self, provider: MetricsProvider) -> None:
        """One interval: start, analyse and decide, then make the gateways match."""
        now = self._clock()
        if self._state.phase is Phase.PENDING:
            self._begin(now)
        elif self._state.phase in ANALYSED:
            self._analyse(provider, now)
        self.reconcile()

    def reconcile(self) -> bool:
        """Send the state's routing to every replica unless they all have it, then finish a
        promotion or rollback. False when some replica could not be told (retried on the
        next call)."""
        desired = routing_for(self._state)
        if desired is not None and desired != self._applied:
            try:
                self._admin.set_routing(self._state.model, desired)
            except (GatewayAdminError, UnknownModelError) as exc:
                self._record("routing_error", self._clock(), f"routing not applied: {exc}")
                return False
            self._applied = desired
        now, spec = self._clock(), self._state.spec
        if self._state.phase is Phase.PROMOTING:
            self._move(Phase.SUCCEEDED, now, self._state.reason,
                       note=f"version {spec.canary_version} is stable on every replica "
                       f"(previous: {spec.stable_version})")  # fmt: skip
        elif self._state.phase is Phase.ROLLING_BACK:
            self._move(Phase.ROLLED_BACK, now, self._state.reason,
                       note=f"canary weight 0 and label removed on every replica; version "
                       f"{spec.stable_version} is stable")  # fmt: skip
            if self._metrics is not None:
                self._metrics.rolled_back(self._state.model)
        return True

    # -- deciding -------------------------------------------------------------------------

    def _begin(self, now: float) -> None:
        spec = self._state.spec
        if spec.shadow_percent:
            self._move(
                Phase.SHADOW,
                now,
                f"mirroring {spec.shadow_percent:g}% of traffic to version {spec.canary_version}",
            )
        else:
            self._move(Phase.PROGRESSING, now, f"canary at {spec.steps[0]:g}%", step=0)

    def _analyse(self, provider: MetricsProvider, now: float) -> None:
        spec = self._state.spec
        measured: Measurement | None = None
        judged: Measurement | None = None
        try:
            measured = provider.measure(
                spec.model, spec.stable_version, spec.canary_version, self._analysis.window
            )
            judged = self._with_baseline(measured)
            verdict = judge(judged, self._analysis)
        except MetricsUnavailable as exc:
            verdict = no_data(f"metrics unavailable: {exc}")
        counted = self._counted(verdict, measured, now)
        decision, message = self._decide(verdict, counted, now)
        numbers = None if judged is None else measurement_numbers(judged)
        if numbers is not None and judged is not measured:
            numbers["stable"]["baseline"] = True
        self._record(
            "analysis",
            now,
            message,
            decision=decision,
            outcome=verdict.outcome,
            checks=verdict_checks(verdict),
            numbers=numbers,
        )
        self._save(counted)
        self._act(decision, verdict, now)

    def _with_baseline(self, measurement: Measurement) -> Measurement:
        """The measurement to judge: at full weight, stable's side from the last analysis
        below it stands in for the stable that no longer gets traffic."""
        baseline = self._state.baseline
        if baseline is None or self._state.weight < 1:
            return measurement
        return replace(measurement, stable=SideMeasurement.from_json(baseline))

    def _counted(
        self, verdict: Verdict, measurement: Measurement | None, now: float
    ) -> RolloutState:
        """The state with this analysis counted: streaks of passes (the bake clock), of
        non-passes and of failures, and the stable baseline refreshed."""
        state = self._state
        passed = verdict.outcome == "pass"
        baseline = state.baseline
        if measurement is not None and state.weight < 1 and measurement.stable.requests > 0:
            baseline = measurement.stable.to_json()
        return state.evolve(
            now,
            held=0 if passed else state.held + 1,
            failures=state.failures + 1 if verdict.outcome == "fail" else 0,
            passing_since=(now if state.passing_since is None else state.passing_since)
            if passed
            else None,
            baseline=baseline,
        )

    def _decide(self, verdict: Verdict, counted: RolloutState, now: float) -> tuple[Decision, str]:
        """What a verdict means, given the state with this analysis counted (no side effects)."""
        spec, limit = counted.spec, self._analysis.failure_limit
        if verdict.outcome == "fail" and counted.failures >= limit:
            times = f" ({counted.failures} failing analyses in a row)" if limit > 1 else ""
            return "rollback", f"rolling back{times}: {verdict.message}"
        if counted.phase in HALTED:
            return "watch", f"{counted.phase.value}: {verdict.outcome}: {verdict.message}"
        if verdict.outcome != "pass":
            if spec.max_held is not None and counted.held >= spec.max_held:
                return "halt", (
                    f"no pass {counted.held} times in a row, halting for an operator: "
                    f"{verdict.message}"
                )
            why = verdict.outcome
            if verdict.outcome == "fail":
                why = f"failing analysis {counted.failures} of {limit} in a row"
            return "hold", f"holding at {counted.weight:.0%} ({why}): {verdict.message}"
        assert counted.passing_since is not None  # a pass starts or continues the streak
        baked = now - counted.passing_since
        if baked < spec.bake_seconds:
            return "bake", (
                f"pass; baking {baked:.0f}/{spec.bake_seconds:g}s of passing: {verdict.message}"
            )
        if counted.phase is Phase.PROGRESSING and counted.last_step:
            return "promote", f"passed {baked:.0f}s at {counted.weight:.0%}: promoting"
        next_step = 0 if counted.phase is Phase.SHADOW else counted.step + 1
        return "advance", f"passed {baked:.0f}s: canary to {spec.steps[next_step]:g}%"

    def _act(self, decision: Decision, verdict: Verdict, now: float) -> None:
        """Carry out a transition decision (holds, bakes and watches were saved as counted)."""
        state = self._state
        if decision == "rollback":
            self._move(Phase.ROLLING_BACK, now, f"canary failed analysis: {verdict.message}")
        elif decision == "halt":
            self._move(
                Phase.INCONCLUSIVE,
                now,
                f"no pass {state.held} times in a row (last: {verdict.outcome}: {verdict.message})",
            )
            logger.warning("rollout of %s halted: %s", state.model, self._state.reason)
        elif decision == "promote":
            self._move(Phase.PROMOTING, now, "every step passed")
        elif decision == "advance":
            step = 0 if state.phase is Phase.SHADOW else state.step + 1
            self._move(Phase.PROGRESSING, now, f"canary at {state.spec.steps[step]:g}%", step=step)

    # -- operator commands -------------------------------------------------------------

    def handle_requests(self) -> None:
        """Apply the operator commands waiting in the state directory, oldest first."""
        for path, request in self._store.pending_requests(self._state.model):
            if isinstance(request, str):
                self._record("command", self._clock(), request, accepted=False)
            else:
                self.command(request.action, reason=request.reason, request_id=request.id)
            self._store.done(path)

    def command(
        self, action: str, *, reason: str | None = None, request_id: str | None = None
    ) -> Event:
        """Apply ``pause``, ``resume``, ``promote``, ``abort`` or ``rollback``; the returned
        event says whether it was accepted and why not."""
        now = self._clock()
        state = self._state
        why = f" ({reason})" if reason else ""
        try:
            target, message, step = self._command_target(action, state, now)
        except StateError as exc:
            return self._record("command", now, str(exc), request=request_id, accepted=False)
        self._move(target, now, f"{message}{why}", step=step)
        event = self._record(
            "command", now, f"{action}: {message}{why}", request=request_id, accepted=True
        )
        self.reconcile()
        return event

    def _command_target(
        self, action: str, state: RolloutState, now: float
    ) -> tuple[Phase, str, int | None]:
        phase = state.phase
        refused = StateError(f"cannot {action}: the rollout of {state.model} is {phase.value}")
        if action == "pause":
            if phase not in (Phase.SHADOW, Phase.PROGRESSING):
                raise refused
            return Phase.PAUSED, "paused by operator", None
        if action == "resume":
            if phase not in HALTED or state.resume_to is None:
                raise refused
            return state.resume_to, "resumed by operator", None
        if action == "promote":
            if phase not in ANALYSED:
                raise refused
            return Phase.PROMOTING, "promoted by operator", None
        if action in ("abort", "rollback"):
            if phase is Phase.SUCCEEDED and action == "rollback":
                window = state.spec.rollback_window_seconds
                if state.finished_at is not None and now - state.finished_at > window:
                    raise StateError(
                        f"cannot rollback: version {state.spec.canary_version} was promoted "
                        f"more than {window:g}s ago (the rollback window); start a rollout "
                        f"of version {state.spec.stable_version} instead"
                    )
                return (
                    Phase.ROLLING_BACK,
                    (f"rolled back by operator to version {state.spec.stable_version}"),
                    None,
                )
            if phase in TERMINAL or phase in (Phase.PROMOTING, Phase.ROLLING_BACK):
                raise refused
            return (
                Phase.ROLLING_BACK,
                f"{'aborted' if action == 'abort' else 'rolled back'} by operator",
                None,
            )
        raise StateError(f"unknown command {action!r}")

    # -- recording ------------------------------------------------------------------------

    def _move(
        self,
        phase: Phase,
        now: float,
        reason: str | None,
        *,
        step: int | None = None,
        note: str | None = None,
    ) -> None:
        """Record a transition (``reason`` is kept in the state; the event says ``note``
        when given, else the reason)."""
        before = self._state
        self._save(before.moved(phase, now, reason=reason, step=step))
        if self._metrics is not None:
            self._metrics.set_phase(self._state.model, phase)
        self._record("transition", now, f"{before.phase.value} -> {phase.value}: {note or reason}")

    def _save(self, state: RolloutState) -> None:
        self._store.save(state)
        self._state = state

    def _record(self, kind: Kind, now: float, message: str, **details: object) -> Event:
        event = _event(self._state, now, kind, message, **details)
        self._events.append(event)
        if self._on_event is not None:
            self._on_event(event)
        return event


def _event(state: RolloutState, now: float, kind: Kind, message: str, **details: object) -> Event:
    return Event(
        at=now,
        rollout=state.id,
        kind=kind,
        phase=state.phase.value,
        step=state.step,
        weight=state.weight,
        message=message,
        **details,
    )


def _steps(spec: RolloutSpec) -> str:
    return ",".join(f"{step:g}%" for step in spec.steps)
