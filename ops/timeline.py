"""A rollout's timeline as a picture: weights, error rates and p99 per interval, verdicts.

Drawn from the event log alone, so any rollout on record (finished, rolled back, or still
running) can be drawn after the fact, on a machine without a display (matplotlib's Agg).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ops.events import Event

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


def render_timeline(events: Sequence[Event], path: Path, *, title: str | None = None) -> Path:
    """Write the timeline PNG of one rollout's events to ``path`` and return it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not events:
        raise ValueError("no events to draw: the rollout has not started")
    start = events[0].at
    analyses = [event for event in events if event.kind == "analysis"]
    figure, (weights, errors, latency) = plt.subplots(
        3, 1, sharex=True, figsize=(10, 7.5), constrained_layout=True
    )
    times = [event.at - start for event in events]
    weights.step(times, [event.weight * 100 for event in events], where="post", color="tab:blue")
    for outcome, (marker, colour) in VERDICT_STYLES.items():
        chosen = [event for event in analyses if event.outcome == outcome]
        weights.scatter(
            [event.at - start for event in chosen],
            [event.weight * 100 for event in chosen],
            marker=marker,
            color=colour,
            label=outcome,
            zorder=3,
        )
    weights.set_ylabel("canary weight (%)")
    weights.set_ylim(-5, 105)
    weights.legend(loc="upper left", fontsize="small", ncols=4)

    for side, colour in (("stable", "tab:blue"), ("canary", "tab:red")):
        seconds = [event.at - start for event in analyses]
        errors.plot(seconds, [_number(event, side, "error_rate", 100) for event in analyses],
                     marker=".", color=colour, label=side)  # fmt: skip
        latency.plot(seconds, [_number(event, side, "p99_ms", 1) for event in analyses],
                     marker=".", color=colour, label=side)  # fmt: skip
    errors.set_ylabel("error rate (%)")
    errors.set_ylim(bottom=0)
    errors.legend(loc="upper left", fontsize="small")
    latency.set_ylabel("p99 latency (ms)")
    latency.set_ylim(bottom=0)
    latency.set_xlabel("seconds since the rollout started")
    latency.legend(loc="upper left", fontsize="small")

    for event in events:
        colour = MILESTONES.get(event.phase) if event.kind == "transition" else None
        if colour is not None:
            for axes in (weights, errors, latency):
                axes.axvline(event.at - start, color=colour, linestyle="--", linewidth=1)
            weights.annotate(event.phase.replace("_", " "), (event.at - start, 100),
                             rotation=90, va="top", ha="right", fontsize="small", color=colour)  # fmt: skip
    figure.suptitle(title or f"rollout {events[0].rollout}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def _number(event: Event, side: str, key: str, scale: float) -> float:
    """A side's number from an analysis event (NaN leaves a gap in the line)."""
    value = ((event.numbers or {}).get(side) or {}).get(key)
    return float("nan") if value is None else value * scale
