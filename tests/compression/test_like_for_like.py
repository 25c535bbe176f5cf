"""Every result is compared with the float32 TFLite conversion, never the SavedModel.

A SavedModel runs in TensorFlow and is stored as a directory; a ratio against it credits
a compression method with what LiteRT and a single file win by themselves. These tests
build reports whose SavedModel row differs wildly from the float32 TFLite row, so any
ratio taken against the SavedModel would give a different number.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pytest

from compression.evaluate import EvalSettings, Evaluation
from compression.latency import interleaved_latencies_ms
from compression.report import BASELINE, PASSED, Report, Row, render_markdown, table_cells


def evaluation(size: int, gzipped: int, p50: float, accuracy: float = 0.9) -> Evaluation:
    return Evaluation(
        examples=10,
        accuracy={"label": accuracy},
        mae={},
        agreement=None,
        max_abs_diff=None,
        size_bytes=size,
        gzip_bytes=gzipped,
        latency_p50_ms=p50,
        latency_p99_ms=p50,
        latency_mean_ms=p50,
        throughput=1.0,
        outputs={},
    )


def report() -> Report:
    return Report(
        model={"name": "m", "version": 1},
        dataset="d",
        split="test",
        max_accuracy_drop=1.0,
        settings=EvalSettings(),
        rows=[
            Row("float32", "SavedModel", evaluation(10_000, 9_000, 50.0), BASELINE),
            Row("float32", "TFLite", evaluation(4_000, 3_600, 0.4), PASSED, 0.0),
            Row("int8", "TFLite", evaluation(1_000, 800, 0.2), PASSED, 0.0),
            Row("prune", "TFLite", evaluation(4_000, 1_800, 0.4), PASSED, 0.0),
        ],
    )


def test_ratios_are_taken_against_the_float32_tflite_not_the_saved_model() -> None:
    built = report()
    _, _, int8, pruned = built.rows
    assert built.size_ratio(int8) == pytest.approx(1_000 / 4_000)  # not 1_000 / 10_000
    assert built.speedup(int8) == pytest.approx(0.4 / 0.2)  # not 50 / 0.2
    assert built.gzip_ratio(pruned) == pytest.approx(1_800 / 3_600)  # gzip over gzip
    assert built.size_ratio(pruned) == pytest.approx(1.0)  # zeros cost raw bytes


def test_the_saved_model_row_has_no_ratios_in_json_and_table() -> None:
    built = report()
    saved_model = built.to_json()["results"][0]
    assert (saved_model["size_ratio"], saved_model["gzip_ratio"], saved_model["speedup"]) == (
        None, None, None,
    )  # fmt: skip
    assert built.to_json()["reference"] == {"method": "float32", "artifact": "TFLite"}
    cells = table_cells(built, built.rows[0])
    assert cells["size ratio"] == cells["gz ratio"] == cells["speed-up"] == "—"
    int8 = table_cells(built, built.rows[2])
    assert (int8["size ratio"], int8["gz ratio"], int8["speed-up"]) == ("0.25×", "0.22×", "2.00×")
    assert "against the float32 TFLite" in render_markdown(built)


def test_a_report_without_the_float32_tflite_row_is_refused() -> None:
    built = report()
    rows = [row for row in built.rows if not (row.method == "float32" and row.artifact == "TFLite")]
    without = Report(built.model, built.dataset, built.split, 1.0, built.settings, rows)
    with pytest.raises(ValueError, match="no float32 TFLite row"):
        without.size_ratio(rows[1])


class Recorder:
    """A runner that records the order it is invoked in."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    def feed(self, batch: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        return batch

    def invoke(self, fed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.log.append(self.name)
        return {}


def test_latencies_are_timed_in_interleaved_rounds_of_rotating_order() -> None:
    log: list[str] = []
    runners = {name: Recorder(name, log) for name in ("a", "b", "c")}
    settings = EvalSettings(latency_runs=6, warmup_runs=2)
    examples = [{"x": np.zeros((1, 2))}] * 4
    times = interleaved_latencies_ms(runners, examples, settings)
    assert {name: len(values) for name, values in times.items()} == {"a": 6, "b": 6, "c": 6}
    timed = log[2 * 3 :]  # after two warm-up rounds of each
    rounds = [timed[index : index + 3] for index in range(0, len(timed), 3)]
    assert rounds == [list("abc"), list("bca"), list("cab")] * 2


def test_the_markdown_says_what_int8_chose_and_why() -> None:
    built = report()
    rows = list(built.rows)
    rows[2] = Row("int8", "TFLite", rows[2].evaluation, PASSED, 0.0, {"reason": "full: kept"})
    rows.append(
        Row("distill+int8", "TFLite", rows[2].evaluation, PASSED, 0.0,
            {"distill": {}, "int8": {"reason": "attention_float: fastest"}})
    )  # fmt: skip
    markdown = render_markdown(Report(built.model, "d", "test", 1.0, built.settings, rows))
    assert "- **int8**: full: kept" in markdown
    assert "- **distill+int8**: attention_float: fastest" in markdown
