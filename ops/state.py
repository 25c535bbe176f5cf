"""A rollout's state: its phases, the legal moves between them, and how it is kept on disk.

The state file is the rollout's memory. It is replaced atomically after every transition,
so a controller that is killed at any instant restarts from the last decision it made and
never from half of one; whatever the gateways were told since is told again (the routing
a state stands for is a pure function of it, ``routing_for``). One rollout per model is
enforced with an advisory lock that the kernel releases when its holder dies, so a crash
never leaves a stale lock behind.

Layout under the state directory (default ``~/.slipway/rollouts``)::

    <model>/state.json          the latest rollout of the model (finished or not)
    <model>/events.jsonl        its decisions, one JSON object per line (ops.events)
    <model>/lock                held by the controller driving the rollout
    <model>/requests/*.json     operator commands waiting for that controller
    <model>/history/<id>/       earlier rollouts, moved here when a new one starts
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import socket
import time
import uuid
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from contracts.atomic_files import write_text_atomically
from serving.routing import CANARY, STABLE, ModelRouting, ShadowRoute

DEFAULT_STATE_DIR = Path("~/.slipway/rollouts")
PREVIOUS = "previous"
LOCK_WAIT_S = 1.0
LOCK_RETRY_S = 0.05
_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class Phase(StrEnum):
    PENDING = "pending"
    SHADOW = "shadow"
    PROGRESSING = "progressing"
    PAUSED = "paused"
    INCONCLUSIVE = "inconclusive"
    PROMOTING = "promoting"
    SUCCEEDED = "succeeded"
    ROLLING_BACK = "rolling_back"
    ROLLED_BACK = "rolled_back"


# Phases in which the canary is live and analysed.
ANALYSED = frozenset({Phase.SHADOW, Phase.PROGRESSING, Phase.PAUSED, Phase.INCONCLUSIVE})
# Phases that stop the rollout from advancing until an operator resumes it.
HALTED = frozenset({Phase.PAUSED, Phase.INCONCLUSIVE})
TERMINAL = frozenset({Phase.SUCCEEDED, Phase.ROLLED_BACK})

TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.PENDING: frozenset({Phase.SHADOW, Phase.PROGRESSING, Phase.ROLLING_BACK}),
    Phase.SHADOW: frozenset(
        {Phase.PROGRESSING, Phase.PAUSED, Phase.INCONCLUSIVE, Phase.PROMOTING, Phase.ROLLING_BACK}
    ),
    # Progressing -> progressing is the move to the next step.
    Phase.PROGRESSING: frozenset(
        {Phase.PROGRESSING, Phase.PAUSED, Phase.INCONCLUSIVE, Phase.PROMOTING, Phase.ROLLING_BACK}
    ),
    Phase.PAUSED: frozenset({Phase.SHADOW, Phase.PROGRESSING, Phase.PROMOTING, Phase.ROLLING_BACK}),
    Phase.INCONCLUSIVE: frozenset(
        {Phase.SHADOW, Phase.PROGRESSING, Phase.PROMOTING, Phase.ROLLING_BACK}
    ),
    Phase.PROMOTING: frozenset({Phase.SUCCEEDED}),
    # A promoted version can still be rolled back within the rollback window.
    Phase.SUCCEEDED: frozenset({Phase.ROLLING_BACK}),
    Phase.ROLLING_BACK: frozenset({Phase.ROLLED_BACK}),
    Phase.ROLLED_BACK: frozenset(),
}


class StateError(ValueError):
    """A state file is unreadable, or a move the state machine does not allow."""


class RolloutLocked(RuntimeError):
    """Another live controller holds the model's rollout."""


def validate_model_name(name: str) -> str:
    """Model names become directory names here, so they must be one safe path component."""
    if not _MODEL_NAME.fullmatch(name):
        raise StateError(
            f"model name {name!r}: use letters, digits, '.', '_' and '-', starting with a "
            "letter or digit"
        )
    return name


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Targets(_Record):
    """Where the gateways and their metrics are, so a restarted controller finds them.

    The admin token itself is never stored: only the environment variable it is read from.
    """

    gateways: list[str] = Field(min_length=1)
    token_env: str | None = None
    routing_file: str | None = None
    prometheus: str | None = None
    metrics_from: list[str] = []
    metrics_port: int | None = None


class RolloutSpec(_Record):
    """What was asked for; it never changes during the rollout."""

    model: str
    stable_version: int = Field(ge=0)
    canary_version: int = Field(ge=0)
    steps: list[float] = Field(min_length=1)
    bake_seconds: float = Field(gt=0)
    interval_seconds: float = Field(gt=0)
    shadow_percent: float | None = Field(default=None, gt=0, le=100)
    max_held: int | None = Field(default=None, ge=1)
    failover: bool | None = None
    rollback_window_seconds: float = Field(default=3600.0, ge=0)
    analysis: dict[str, Any] = {}
    targets: Targets

    @field_validator("model")
    @classmethod
    def _model_name(cls, model: str) -> str:
        return validate_model_name(model)

    @field_validator("steps")
    @classmethod
    def _increasing(cls, steps: list[float]) -> list[float]:
        if any(not 0 < step <= 100 for step in steps):
            raise ValueError(f"every step is a canary weight in percent, in (0, 100]: {steps}")
        if any(later <= earlier for earlier, later in zip(steps, steps[1:], strict=False)):
            raise ValueError(f"steps must increase: {steps}")
        return steps

    @model_validator(mode="after")
    def _two_versions(self) -> RolloutSpec:
        if self.stable_version == self.canary_version:
            raise ValueError(f"version {self.canary_version} is already the stable version")
        return self


class RolloutState(_Record):
    """Where a rollout stands. Every change goes through ``moved`` or ``evolve``.

    ``since`` is when the current phase (or step) began. ``passing_since`` is when the
    current unbroken run of passing analyses began (None after anything but a pass, and
    at every new phase or step): the bake clock, so a step bakes only on continuous
    passing time. ``held`` counts consecutive analyses that did not pass, ``failures``
    consecutive failing ones (rolled back at the analysis' ``failure_limit``).
    ``baseline`` is stable's side of the last measurement in which stable had enough
    traffic (``SideMeasurement.to_json``), the comparison for a canary taking (nearly)
    all traffic. ``resume_to`` is the phase a halted rollout returns to.
    """

    format: Literal[1] = 1
    id: str
    spec: RolloutSpec
    phase: Phase = Phase.PENDING
    step: int = -1
    since: float
    created_at: float
    updated_at: float
    finished_at: float | None = None
    held: int = 0
    passing_since: float | None = None
    failures: int = 0
    baseline: dict[str, Any] | None = None
    resume_to: Phase | None = None
    reason: str | None = None
    base_routing: dict[str, Any] = {}

    @property
    def model(self) -> str:
        return self.spec.model

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL

    @property
    def weight(self) -> float:
        """The canary's share of routed traffic (0-1) in this state."""
        phase = self.resume_to if self.phase in HALTED else self.phase
        if phase is Phase.PROGRESSING and self.step >= 0:
            return self.spec.steps[self.step] / 100
        return 0.0

    @property
    def last_step(self) -> bool:
        return self.step == len(self.spec.steps) - 1

    def moved(
        self, phase: Phase, now: float, *, reason: str | None = None, step: int | None = None
    ) -> RolloutState:
        """The state after a transition; a move the machine does not allow is a StateError."""
        if phase not in TRANSITIONS[self.phase]:
            raise StateError(
                f"rollout of {self.model} is {self.phase.value}: cannot move to {phase.value}"
            )
        changes: dict[str, Any] = {
            "phase": phase,
            "since": now,
            "updated_at": now,
            "held": 0,
            "passing_since": None,
            "reason": reason,
            # A halted rollout remembers what to return to; no other phase needs to.
            "resume_to": self.phase if phase in HALTED else None,
        }
        if step is not None:
            changes["step"] = step
        if phase in TERMINAL:
            changes["finished_at"] = now
        return self.model_copy(update=changes)

    def evolve(self, now: float, **changes: Any) -> RolloutState:
        """The same phase with some counters changed (e.g. one more held measurement)."""
        return self.model_copy(update={**changes, "updated_at": now})


def new_rollout(spec: RolloutSpec, base_routing: ModelRouting, now: float) -> RolloutState:
    """A pending rollout; ``base_routing`` is the model's routing before it, which every
    later routing keeps (sticky header, timeouts, other labels)."""
    return RolloutState(
        id=f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(now))}-{uuid.uuid4().hex[:8]}",
        spec=spec,
        since=now,
        created_at=now,
        updated_at=now,
        base_routing=base_routing.model_dump(mode="json", exclude_none=True),
    )


def routing_for(state: RolloutState) -> ModelRouting | None:
    """The routing every replica must have while the rollout is in ``state``.

    None while pending (nothing has been changed yet). The base routing's other settings
    are kept; a shadow route of the base that mirrored to the old canary label is dropped
    with that label.
    """
    spec = state.spec
    base = ModelRouting.model_validate(state.base_routing)
    labels = {name: v for name, v in base.labels.items() if name not in (STABLE, CANARY)}
    shadow = base.shadow if base.shadow is None or base.shadow.label in (None, STABLE) else None
    failover = base.failover if spec.failover is None else spec.failover
    phase = state.resume_to if state.phase in HALTED else state.phase
    weight = 0.0
    if phase is Phase.PENDING:
        return None
    if phase in (Phase.SHADOW, Phase.PROGRESSING):
        labels.update({STABLE: spec.stable_version, CANARY: spec.canary_version})
        weight = state.weight
        if phase is Phase.SHADOW:
            shadow = ShadowRoute(label=CANARY, percent=spec.shadow_percent or 0.0)
    elif phase in (Phase.PROMOTING, Phase.SUCCEEDED):
        labels.update({STABLE: spec.canary_version, PREVIOUS: spec.stable_version})
    else:  # rolling back or rolled back, before or after a promotion
        labels[STABLE] = spec.stable_version
        if labels.get(PREVIOUS) == spec.stable_version:
            labels.pop(PREVIOUS)
    return base.model_copy(
        update={"labels": labels, "canary_weight": weight, "shadow": shadow, "failover": failover}
    )


# ---------------------------------------------------------------------------------------
# On disk


class OperatorRequest(_Record):
    """A command (pause, resume, promote, abort, rollback) for the running controller."""

    id: str
    action: Literal["pause", "resume", "promote", "abort", "rollback"]
    at: float
    reason: str | None = None


class StateStore:
    """The rollouts of every model under one directory."""

    def __init__(self, root: Path = DEFAULT_STATE_DIR) -> None:
        self.root = Path(root).expanduser()

    def model_dir(self, model: str) -> Path:
        return self.root / validate_model_name(model)

    def state_path(self, model: str) -> Path:
        return self.model_dir(model) / "state.json"

    def events_path(self, model: str) -> Path:
        return self.model_dir(model) / "events.jsonl"

    def models(self) -> list[str]:
        """Models with a rollout on record."""
        if not self.root.is_dir():
            return []
        return sorted(path.parent.name for path in self.root.glob("*/state.json"))

    def load(self, model: str) -> RolloutState | None:
        """The model's latest rollout, None if it never had one."""
        return _read_state(self.state_path(model))

    def save(self, state: RolloutState) -> None:
        """Replace the state file atomically: readers and a restarted controller see the
        previous state or this one, never a torn file."""
        path = self.state_path(state.model)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomically(path, state.model_dump_json(indent=2) + "\n")

    def archive(self, model: str) -> None:
        """Move the latest (finished) rollout and its events into ``history/<id>``."""
        state = self.load(model)
        if state is None:
            return
        if not state.terminal:
            raise StateError(f"the rollout {state.id} of {model} is not finished")
        target = self.model_dir(model) / "history" / state.id
        target.mkdir(parents=True, exist_ok=True)
        events = self.events_path(model)
        if events.exists():
            os.replace(events, target / events.name)
        os.replace(self.state_path(model), target / "state.json")

    def history(self, model: str) -> list[RolloutState]:
        """Every rollout of the model on record, oldest first."""
        archived = [
            _read_state(path) for path in (self.model_dir(model) / "history").glob("*/state.json")
        ]
        latest = self.load(model)
        rollouts = [state for state in archived if state is not None]
        if latest is not None:
            rollouts.append(latest)
        return sorted(rollouts, key=lambda state: state.created_at)

    def history_events_path(self, model: str, rollout_id: str) -> Path:
        latest = self.load(model)
        if latest is not None and latest.id == rollout_id:
            return self.events_path(model)
        path = self.model_dir(model) / "history" / rollout_id / "events.jsonl"
        if not path.parent.is_dir():
            raise StateError(f"no rollout {rollout_id!r} of {model} on record")
        return path

    # -- one controller per model ------------------------------------------------------

    def lock(self, model: str) -> RolloutLock:
        return RolloutLock(self.model_dir(model) / "lock", model)

    def is_locked(self, model: str) -> bool:
        """True while a live controller holds the model's rollout."""
        lock = self.lock(model)
        try:
            lock.acquire(wait=0.0)
        except RolloutLocked:
            return True
        lock.release()
        return False

    # -- operator requests -------------------------------------------------------------

    def post(self, model: str, action: str, reason: str | None = None) -> OperatorRequest:
        """Leave a command for the controller driving the model's rollout."""
        request = OperatorRequest(id=uuid.uuid4().hex, action=action, at=time.time(), reason=reason)
        folder = self.model_dir(model) / "requests"
        folder.mkdir(parents=True, exist_ok=True)
        name = f"{time.time_ns():020d}-{request.id}.json"
        write_text_atomically(folder / name, request.model_dump_json() + "\n")
        return request

    def pending_requests(self, model: str) -> list[tuple[Path, OperatorRequest | str]]:
        """Waiting commands in the order they were posted: the request, or why its file
        could not be read (such a file is dropped by ``done`` like any other)."""
        folder = self.model_dir(model) / "requests"
        found: list[tuple[Path, OperatorRequest | str]] = []
        for path in sorted(folder.glob("*.json")):
            try:
                found.append((path, OperatorRequest.model_validate_json(path.read_bytes())))
            except (OSError, pydantic.ValidationError) as exc:
                found.append((path, f"{path.name}: unreadable request: {exc}"))
        return found

    @staticmethod
    def done(path: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()

    def discard_requests(self, model: str) -> None:
        shutil.rmtree(self.model_dir(model) / "requests", ignore_errors=True)


class RolloutLock:
    """An exclusive ``flock`` on the model's lock file, released when its holder exits."""

    def __init__(self, path: Path, model: str) -> None:
        self.path = path
        self.model = model
        self._handle: int | None = None

    def acquire(self, wait: float = LOCK_WAIT_S) -> RolloutLock:
        """Take the lock, retrying for ``wait`` seconds: a ``status`` probe holds it for an
        instant, and a controller starting at that instant must not take it for a rival."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(LOCK_RETRY_S)  # flock has no timed wait; retry shortly
                    continue
            holder = os.read(handle, 200).decode("utf-8", "replace").strip() or "another process"
            os.close(handle)
            raise RolloutLocked(
                f"a controller ({holder}) is already driving the rollout of {self.model}; "
                "use pause/resume/promote/abort to steer it"
            )
        os.ftruncate(handle, 0)
        os.write(handle, f"pid {os.getpid()} on {socket.gethostname()}".encode())
        self._handle = handle
        return self

    def release(self) -> None:
        if self._handle is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._handle, 0)
            os.close(self._handle)  # closing the descriptor drops the flock
            self._handle = None

    def __enter__(self) -> RolloutLock:
        return self.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self.release()


def _read_state(path: Path) -> RolloutState | None:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StateError(f"{path}: cannot read: {exc}") from None
    try:
        return RolloutState.model_validate_json(raw)
    except pydantic.ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, error['loc'])) or '<root>'}: {error['msg']}"
            for error in exc.errors()[:5]
        )
        raise StateError(f"{path}: not a rollout state: {problems}") from None
