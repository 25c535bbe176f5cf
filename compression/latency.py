"""Batch-1 latency of several artifacts, measured so their figures can be divided.

A speed-up is the ratio of two latencies, so both must be taken under the same
conditions: the same runner, the same thread count, the same inputs, and the same
moment. Timing one model for a few seconds and then the next lets a neighbour's load
or a CPU frequency change land on one of them only; here the repetitions are
interleaved (one timed invoke of every artifact per round, the order rotating each
round so none is always first after another's cache traffic) and the median is what
ratios are taken of.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # evaluate.py times its artifacts with this module
    from compression.evaluate import EvalSettings, Runner


def interleaved_latencies_ms(
    runners: Mapping[str, Runner],
    examples: Sequence[Mapping[str, np.ndarray]],
    settings: EvalSettings,
) -> dict[str, np.ndarray]:
    """``settings.latency_runs`` batch-1 timings (ms) per runner, taken in alternation.

    ``examples`` are single-example batches; each runner prepares its own inputs before
    the clock starts (quantizing a float input for an int8 model is the client's work).
    """
    names = list(runners)
    fed: dict[str, list[Any]] = {
        name: [runners[name].feed(example) for example in examples] for name in names
    }
    count = len(examples)
    for run in range(settings.warmup_runs):
        for name in names:
            runners[name].invoke(fed[name][run % count])
    times = {name: np.empty(settings.latency_runs) for name in names}
    for run in range(settings.latency_runs):
        shift = run % len(names)
        for name in names[shift:] + names[:shift]:
            runner, batch = runners[name], fed[name][run % count]
            started = time.perf_counter_ns()
            runner.invoke(batch)
            times[name][run] = (time.perf_counter_ns() - started) / 1e6
    return times
