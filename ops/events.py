"""The rollout's event log: every decision, with the numbers that led to it.

One JSON object per line, appended and synced as each decision is made, so the log
explains a rollback after the fact (which check failed, on how many requests, with what
p-value) and a verdict can be recomputed from it. The timeline is drawn from it too. A
crash can tear only the line being written; readers skip a torn last line.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ops import stats
from ops.analysis import LATENCY_QUANTILE, Verdict
from ops.measurement import Measurement, SideMeasurement

# start: the rollout was created; analysis: one measurement, its verdict and the decision;
# transition: the phase (or step) changed; command: an operator request was handled;
# routing_error: the gateways could not all be told (retried next interval);
# controller: a controller took over or let go of the rollout.
Kind = Literal["start", "analysis", "transition", "command", "routing_error", "controller"]
# What an analysis led to.
Decision = Literal["hold", "bake", "advance", "promote", "rollback", "halt", "watch"]


@dataclass(frozen=True)
class Event:
    at: float
    rollout: str
    kind: Kind
    phase: str
    step: int
    weight: float
    message: str
    decision: Decision | None = None
    outcome: str | None = None
    checks: tuple[dict[str, Any], ...] = ()
    numbers: dict[str, Any] | None = None
    request: str | None = None
    accepted: bool | None = None

    def to_json(self) -> str:
        # _finite copies as it goes; dataclasses.asdict's deep copy would be a second one.
        data = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        return json.dumps(_finite(data), sort_keys=True, allow_nan=False)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Event:
        known = {field.name for field in dataclasses.fields(cls)}
        values = {key: value for key, value in data.items() if key in known}
        values["checks"] = tuple(values.get("checks") or ())
        return cls(**values)


class EventLog:
    """Appends events to a JSON-lines file and reads them back."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def append(self, event: Event) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as log:
            log.write(event.to_json() + "\n")
            log.flush()
            os.fsync(log.fileno())

    def read(self) -> list[Event]:
        return [Event.from_dict(item) for item in read_json_lines(self.path)]


def read_json_lines(path: Path) -> list[dict[str, Any]]:
    """Objects of a JSON-lines file; a torn last line (a crash mid-write) is skipped."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    objects = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            objects.append(json.loads(line))
        except ValueError:
            if number == len(lines):
                break
            raise ValueError(f"{path}:{number}: not a JSON object") from None
    return objects


def measurement_numbers(measurement: Measurement) -> dict[str, Any]:
    """What the event log keeps of a measurement: counts, rates and p99 per side."""
    return {
        "window_seconds": measurement.window_seconds,
        "taken_at": measurement.taken_at,
        "stable": _side(measurement.stable),
        "canary": _side(measurement.canary),
        "shadow_agreement": measurement.shadow_agreement,
        "shadow_requests": measurement.shadow_requests,
        "custom": dict(measurement.custom),
    }


def _side(side: SideMeasurement) -> dict[str, Any]:
    p99 = stats.histogram_quantile(LATENCY_QUANTILE, side.latency_buckets)
    return {
        "version": side.version,
        "requests": side.requests,
        "errors": side.errors,
        "error_rate": side.error_rate,
        "p99_ms": None if math.isnan(p99) else p99 * 1000,
        "failovers": side.failovers,
        "labelled": side.labelled,
        "correct": side.correct,
        "accuracy": side.accuracy,
    }


def verdict_checks(verdict: Verdict) -> tuple[dict[str, Any], ...]:
    return tuple(dataclasses.asdict(check) for check in verdict.checks)


def _finite(value: Any) -> Any:
    """JSON has no NaN or infinity: they become null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value
