"""How int8's batch-1 speed-up over float32 grows with a network's channel width.

An int8 kernel does four times the multiply-adds of a float32 one per instruction
(AVX-512 VNNI), but XNNPACK's int8 convolutions also pay a cost per output pixel that
does not shrink with the channel count: at 16 output channels that cost is most of the
kernel and int8 runs barely faster than float32; at 64 the arithmetic dominates and int8
wins several times over. Fixed per-op costs (dispatch, the quantize and dequantize at the
edges) weigh the same way on a model this small.

The zoo CNN of the digits experiment (16 and 32 channels) is built untrained, since
timing does not depend on the weights, at its own width and at two and four times it on
the same 8x8 digits, converted to float32 and full int8 TFLite by the functions
compression uses, stripped alike, and timed in interleaved rounds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import yaml

DIGITS_EXPERIMENT = Path(__file__).resolve().parent.parent / "examples/experiments/digits_cnn.yaml"
IMAGE_SIDE = 8
WIDTH_FACTORS = (1, 2, 4)
CALIBRATION_SAMPLES = 16


def widened(widen: int) -> dict[str, Any]:
    """The digits experiment's model section with every channel count times ``widen``."""
    config = yaml.safe_load(DIGITS_EXPERIMENT.read_text(encoding="utf-8"))["model"]
    config["stem_filters"] *= widen
    config["stages"] = [filters * widen for filters in config["stages"]]
    return config


def _float32_and_int8(config: dict[str, Any]) -> dict[str, bytes]:
    from compression.ptq import float32, full_integer
    from compression.strip import strip_for_serving
    from research.models.registry import build_model

    model = build_model(
        config,
        {"image": {"kind": "image", "shape": [IMAGE_SIDE, IMAGE_SIDE]}},
        {"label": {"kind": "classification", "num_classes": 10}},
    )
    generator = np.random.default_rng(0)
    samples = [
        {"image": generator.random((1, IMAGE_SIDE, IMAGE_SIDE), dtype=np.float32)}
        for _ in range(CALIBRATION_SAMPLES)
    ]
    return {
        "float32": strip_for_serving(float32(model).tflite),
        "int8": strip_for_serving(full_integer(model, samples).tflite),
    }


def measure(latency_runs: int) -> list[dict[str, Any]]:
    """One row per width: both p50s (ms) and int8's speed-up, timed side by side."""
    from compression.evaluate import EvalSettings, TFLiteRunner
    from compression.latency import interleaved_latencies_ms

    settings = EvalSettings(latency_runs=latency_runs, warmup_runs=20)
    rows = []
    example = {"image": np.random.default_rng(0).random((1, IMAGE_SIDE, IMAGE_SIDE), np.float32)}
    for widen in WIDTH_FACTORS:
        config = widened(widen)
        runners = {name: TFLiteRunner(flat) for name, flat in _float32_and_int8(config).items()}
        latencies = interleaved_latencies_ms(runners, [example], settings)
        float_ms, int8_ms = (float(np.median(latencies[name])) for name in ("float32", "int8"))
        rows.append(
            {
                "channels": [config["stem_filters"], *config["stages"]],
                "float32_p50_ms": round(float_ms, 4),
                "int8_p50_ms": round(int8_ms, 4),
                "int8_speedup": round(float_ms / int8_ms, 2),
            }
        )
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="int8 speed-up by channel width (the digits CNN on 8x8 digits, batch 1)")
    for column in ("channels (stem, stages)", "float32 TFLite p50", "int8 p50", "int8 speed-up"):
        table.add_column(column)
    for row in rows:
        table.add_row(
            ", ".join(str(channels) for channels in row["channels"]),
            f"{row['float32_p50_ms']:.3f} ms",
            f"{row['int8_p50_ms']:.3f} ms",
            f"{row['int8_speedup']:.2f}x",
        )
    Console(width=120).print(table)
