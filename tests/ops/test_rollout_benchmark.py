"""The simulated rollouts of ``benchmarks/rollout.py``, shortened: the real controller and
judge at the default analysis must keep rolling back good canaries rarely, bad ones
almost always, and a failing one within 10 s. Seeded, in simulated time: the same code
gives the same figures, whatever the machine's load."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from benchmarks import rollout

# Fewer rollouts than the benchmark, so the bounds allow for the sampling error of 40-60.
ROLLOUTS = {
    "A/A: canary identical to stable": 60,
    "errors +2 points over 1 %": 25,
    "latency 1.5x": 25,
    "accuracy -5 points": 25,
    "20 % errors at 10 % of 100 rps": 20,
}


@pytest.mark.slow
def test_default_analysis_rolls_back_bad_canaries_and_spares_good_ones() -> None:
    assert set(ROLLOUTS) <= {scenario.name for scenario in rollout.SCENARIOS}
    # Many small state and event files: in memory when the machine has a tmpfs.
    memory = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    with tempfile.TemporaryDirectory(dir=memory) as tmp:
        results = rollout.simulate(ROLLOUTS, Path(tmp))
    good = results["A/A: canary identical to stable"]
    assert good["outcomes"].get("rolled_back", 0) <= 1, good
    assert good["outcomes"].get("succeeded", 0) >= 58, good  # and they do get promoted
    for name in ("errors +2 points over 1 %", "latency 1.5x", "accuracy -5 points"):
        assert results[name]["rollback_rate"] == 1.0, (name, results[name])
    fast = results["20 % errors at 10 % of 100 rps"]
    assert fast["rollback_rate"] == 1.0 and fast["max_seconds_to_rollback"] <= 10.0, fast
