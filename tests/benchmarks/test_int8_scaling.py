"""``benchmarks/int8_scaling.py``: the widened networks are the digits network scaled, and
each row is a real float32 and int8 pair timed side by side."""

from __future__ import annotations

import pytest
import yaml

from benchmarks import int8_scaling


def test_widening_scales_every_channel_count_and_nothing_else() -> None:
    own = yaml.safe_load(int8_scaling.DIGITS_EXPERIMENT.read_text(encoding="utf-8"))["model"]
    assert int8_scaling.widened(1) == own
    doubled = int8_scaling.widened(2)
    assert doubled["stem_filters"] == 2 * own["stem_filters"]
    assert doubled["stages"] == [2 * filters for filters in own["stages"]]
    assert {k: v for k, v in doubled.items() if k not in ("stem_filters", "stages")} == {
        k: v for k, v in own.items() if k not in ("stem_filters", "stages")
    }


def test_a_row_times_an_int8_model_beside_its_float32_twin(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(int8_scaling, "WIDTH_FACTORS", (1,))
    flatbuffers = int8_scaling._float32_and_int8(int8_scaling.widened(1))
    assert len(flatbuffers["int8"]) < 0.5 * len(flatbuffers["float32"])
    [row] = int8_scaling.measure(latency_runs=5)
    assert row["channels"] == [16, 16, 32]
    assert row["float32_p50_ms"] > 0 and row["int8_p50_ms"] > 0
    assert row["int8_speedup"] == pytest.approx(
        row["float32_p50_ms"] / row["int8_p50_ms"], rel=0.02
    )
