"""A rollout's timeline as a picture: traffic share, error rates and p99 per interval, the
bounds they were judged against, and the verdicts.

Drawn from the event log alone, so any rollout on record (finished, rolled back, or still
running) can be drawn after the fact, on a machine without a display (matplotlib's Agg).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ops.events import Event

if TYPE_CHECKING:
    from matplotlib.figure import Figure

VERDICT_STYLES = {
    "pass": ("o", "tab:green"),
    "fail": ("X", "tab:red"),
    "inconclusive": ("^", "tab:orange"),
    "no_data": ("s", "tab:gray"),
}
# Phase changes worth a vertical line, and its colour.
MILESTONES = {
    "paused": "tab:orange",
    "inconclusive": "tab:orange",
    "succeeded": "tab:green",
    "rolling_back": "tab:red",
}
# Phases in which the new version is stable, i.e. takes all the traffic.
PROMOTED = frozenset({"promoting", "succeeded"})


@dataclass(frozen=True)
class MetricPanel:
    """One panel of per-side numbers from the analysis events, with its check's limit."""

    key: str  # in each side's numbers
    scale: float  # to the unit shown
    check: str  # whose limit is drawn
    label: str
    always: bool  # drawn even when no analysis has the number


METRIC_PANELS = (
    MetricPanel("error_rate", 100, "error_rate", "error rate (%)", always=True),
    MetricPanel("p99_ms", 1, "latency_p99", "p99 latency (ms)", always=True),
    # Only rollouts whose clients send labels back have one.
    MetricPanel("accuracy", 100, "accuracy", "live accuracy (%)", always=False),
)


def render_timeline(events: Sequence[Event], path: Path, *, title: str | None = None) -> Path:
    """Write the timeline PNG of one rollout's events to ``path`` and return it."""
    import matplotlib.pyplot as plt

    figure = draw_timeline(events, title=title)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def draw_timeline(events: Sequence[Event], *, title: str | None = None) -> Figure:
    """The timeline figure: the new version's share of traffic (100 % once promoted, 0 %
    once rolled back), each side's error rate, p99 and (when labels came back) live
    accuracy with the checks' limits, verdicts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not events:
        raise ValueError("no events to draw: the rollout has not started")
    start = events[0].at
    analyses = [event for event in events if event.kind == "analysis"]
    panels = [
        panel
        for panel in METRIC_PANELS
        if panel.always or any(_has(event, panel.key) for event in analyses)
    ]
    figure, (weights, *metric_axes) = plt.subplots(
        1 + len(panels), 1, sharex=True, figsize=(10, 2.5 * (1 + len(panels))),
        constrained_layout=True,
    )  # fmt: skip
    times = [event.at - start for event in events]
    weights.step(times, [share(event) for event in events], where="post", color="tab:blue")
    for outcome, (marker, colour) in VERDICT_STYLES.items():
        chosen = [event for event in analyses if event.outcome == outcome]
        weights.scatter(
            [event.at - start for event in chosen],
            [share(event) for event in chosen],
            marker=marker,
            color=colour,
            label=outcome,
            zorder=3,
        )
    weights.set_ylabel("new version's traffic (%)")
    weights.set_ylim(-5, 105)
    weights.legend(loc="upper left", fontsize="small", ncols=4)

    seconds = [event.at - start for event in analyses]
    for axes, panel in zip(metric_axes, panels, strict=True):
        for side, colour in (("stable", "tab:blue"), ("canary", "tab:red")):
            values = [_number(event, side, panel.key, panel.scale) for event in analyses]
            axes.plot(seconds, values, marker=".", color=colour, label=side)
        limits = [check_limit(event, panel.check, panel.scale) for event in analyses]
        if any(not math.isnan(limit) for limit in limits):
            axes.step(seconds, limits, where="mid", color="tab:gray", linestyle=":",
                      label=f"{panel.check} limit")  # fmt: skip
        axes.set_ylabel(panel.label)
        axes.set_ylim(bottom=0)
        axes.legend(loc="upper left", fontsize="small")
    metric_axes[-1].set_xlabel("seconds since the rollout started")

    for event in events:
        colour = MILESTONES.get(event.phase) if event.kind == "transition" else None
        if colour is not None:
            for axes in (weights, *metric_axes):
                axes.axvline(event.at - start, color=colour, linestyle="--", linewidth=1)
            weights.annotate(event.phase.replace("_", " "), (event.at - start, 100),
                             rotation=90, va="top", ha="right", fontsize="small", color=colour)  # fmt: skip
    figure.suptitle(title or f"rollout {events[0].rollout}")
    return figure


def share(event: Event) -> float:
    """The new version's share of traffic in percent: its canary weight, all of it once
    promoted (the recorded canary weight is then 0, the canary label being gone)."""
    return 100.0 if event.phase in PROMOTED else event.weight * 100


def check_limit(event: Event, check: str, scale: float) -> float:
    """The limit a check of an analysis event was judged against (NaN: none, a gap)."""
    for result in event.checks:
        if result.get("name") == check and result.get("limit") is not None:
            return float(result["limit"]) * scale
    return math.nan


def _has(event: Event, key: str) -> bool:
    numbers = event.numbers or {}
    return any((numbers.get(side) or {}).get(key) is not None for side in ("stable", "canary"))


def _number(event: Event, side: str, key: str, scale: float) -> float:
    """A side's number from an analysis event (NaN leaves a gap in the line)."""
    value = ((event.numbers or {}).get(side) or {}).get(key)
    return math.nan if value is None else value * scale
