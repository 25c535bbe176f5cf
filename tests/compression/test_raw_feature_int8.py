"""int8 on models that read raw features: free text, a category and heavy-tailed numbers.

Each zoo family is trained the way a user trains it, without ``data.sequence_length``,
on a support-ticket table, published with its preprocessing in the graph, and compressed
to int8 with the accuracy gate: conversion must work, the result must keep accuracy, the
converter's chatter must stay in its log file, and the report must name what stayed float.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from compression import ptq
from compression.evaluate import EvalSettings
from compression.loading import load_version
from compression.pipeline import CONVERTER_LOG, CompressOptions, compress
from compression.quality_gate import error_increases
from compression.report import FAILED, PASSED
from compression.tflite_graph import feature_mix_tensors, layer_names
from contracts.yaml_config import ConfigError
from research.data.pipeline import build_dataset
from research.data.spec import load_spec
from research.experiments import load_experiment
from research.experiments.task import ExperimentTask
from tests.support.artefacts import shared_artefact
from tests.support.experiments import write_experiment
from tests.support.raw_data import write_ticket_table
from training.run import train

MLP = {"type": "mlp", "hidden_units": [64], "dropout": 0.0}
TRANSFORMER = {"type": "transformer", "num_layers": 1, "d_model": 16, "num_heads": 2,
               "ff_dim": 32, "dropout": 0.0}  # fmt: skip
# model, the features it reads, the label it predicts
CASES: dict[str, tuple[dict[str, Any], list[str], str]] = {
    "mlp-text-category-numbers": (MLP, ["text", "channel", "amount"], "queue"),
    "mlp-text-and-one-number": (MLP, ["text", "amount"], "queue"),
    "transformer-text": ({**TRANSFORMER, "max_length": 40}, ["text"], "queue"),
    "mlp-regression": (MLP, ["text", "channel", "amount"], "wait_hours"),
}
STEPS = 300
QUICK = EvalSettings(latency_runs=10, warmup_runs=2, throughput_seconds=0.0)


@pytest.fixture(scope="module")
def tickets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    def build(directory: Path) -> None:
        spec = write_ticket_table(directory / "raw")
        build_dataset(load_spec(spec), directory / "dataset")

    return shared_artefact(tmp_path_factory, "tickets", build) / "dataset"


@pytest.fixture(scope="module")
def versions(tickets: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Each case's published version, trained by the first test that asks for it."""
    trained: dict[str, Path] = {}

    def version(case: str) -> Path:
        if case not in trained:
            trained[case] = trained_version(tmp_path_factory.mktemp(case), tickets, case)
        return trained[case]

    return version


def trained_version(directory: Path, dataset: Path, case: str) -> Path:
    model, features, label = CASES[case]
    path = write_experiment(
        directory,
        dataset,
        model=model,
        data__features=features,
        data__labels=[label],
        training__steps=STEPS,
    )
    outcome = train(ExperimentTask(load_experiment(path)), progress=False)
    assert outcome.exit_code == 0
    if label == "queue":
        assert outcome.metrics["validation"]["queue_accuracy"] > 0.7  # a gate worth keeping
    _, version_dir = outcome.published
    return version_dir


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_int8_keeps_accuracy_on_raw_features_without_a_sequence_length(
    case: str,
    tickets: Path,
    versions: Callable[[str], Path],
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
) -> None:
    version_dir = versions(case)
    capfd.readouterr()

    run = compress(
        version_dir, tickets, CompressOptions(["int8"], settings=QUICK), tmp_path / "report"
    )

    row = run.outcomes["int8"].row
    assert row.status == PASSED, row.note
    details = row.details
    # What stayed float is named by layer, with the reason, in the report people read.
    if details["scheme"] != "full":
        assert details["float_layers"]
        choices = run.files.markdown.read_text().split("## What the methods chose")[1]
        assert "float layers: " + ", ".join(details["float_layers"]) in choices
    # The converter's own output is in the log beside the report, not on the terminal.
    printed = capfd.readouterr()
    assert "fully_quantize" in (tmp_path / "report" / CONVERTER_LOG).read_text()
    assert "fully_quantize" not in printed.out + printed.err
    assert json.loads(run.files.json.read_text())["results"][2]["status"] == "passed"


@pytest.mark.slow
def test_the_feature_mix_scheme_keeps_exactly_the_encoders_their_join_and_its_reader_float(
    versions: Callable[[str], Path],
) -> None:
    version_dir = versions("mlp-text-and-one-number")
    float_tflite = ptq.float32(load_version(version_dir).model).tflite

    layers = layer_names(feature_mix_tensors(float_tflite))

    assert set(layers) == {
        "text_embedding", "text_pooling", "amount_flatten",  # the inputs' encoders
        "mlp_features",  # their concatenation
        "mlp_dense_0", "mlp_activation_0",  # the Dense reading it, its activation fused in
    }  # fmt: skip
    # The heads stay int8; so does everything of a model that joins nothing.
    assert "queue_logits" not in layers
    text_only = versions("transformer-text")
    assert feature_mix_tensors(ptq.float32(load_version(text_only).model).tflite) == []


def test_a_transformer_without_any_sequence_length_is_a_located_config_error(
    tickets: Path, tmp_path: Path
) -> None:
    path = write_experiment(tmp_path, tickets, model=TRANSFORMER, data__features=["text"])
    with pytest.raises(ConfigError, match=rf"^{path}:\d+: model\.max_length: input 'text'"):
        ExperimentTask(load_experiment(path)).build_model()

    path = write_experiment(tmp_path, tickets, model=TRANSFORMER, data__features=["text", "amount"])
    with pytest.raises(ConfigError, match=rf"^{path}:\d+: model\.type: transformer models read"):
        ExperimentTask(load_experiment(path)).build_model()


@pytest.mark.slow
@pytest.mark.parametrize("limit", [2.0, 0.0])
def test_a_regression_head_is_gated_on_its_mean_absolute_error(
    tickets: Path, versions: Callable[[str], Path], tmp_path: Path, limit: float
) -> None:
    """int8 on a model whose only head is a number: its trials and its row are judged on
    the growth of the mean absolute error, as the documented gate says."""
    options = CompressOptions(["int8"], max_error_increase=limit, settings=QUICK)

    run = compress(versions("mlp-regression"), tickets, options, tmp_path / "report")

    trials = run.outcomes["int8"].row.details["trials"]
    converted = [trial for trial in trials if trial["error"] is None]
    assert converted and all(t["validation_mae_increase_percent"] is not None for t in converted)
    reference = run.report.reference_row().evaluation
    row = run.outcomes["int8"].row
    (increase,) = error_increases(reference, row.evaluation).values()
    assert row.accuracy_drop is None and row.evaluation.mae["wait_hours"] > 0
    assert row.status == (PASSED if increase <= limit + 1e-9 else FAILED)
    if row.status == FAILED:
        assert f"mean absolute error grows {increase:.2f} %" in row.note
    markdown = run.files.markdown.read_text()
    assert f"mean absolute error may grow at most {limit:g} %" in markdown


def test_an_own_model_raising_keeps_its_own_located_message(tickets: Path, tmp_path: Path) -> None:
    """Only the zoo's refusals are pinned on model keys; a researcher's function that
    raises is reported as itself, with its file and line."""
    (tmp_path / "own.py").write_text("def broken(inputs, heads):\n    raise ValueError('odd')\n")
    model = {"type": "python", "build": "own.py:broken"}
    path = write_experiment(tmp_path, tickets, model=model, data__labels=["queue"])
    with pytest.raises(ConfigError) as refused:
        ExperimentTask(load_experiment(path)).build_model()
    assert "model.build: own.py:broken raised ValueError at own.py:2: odd" in str(refused.value)
    assert "model.type" not in str(refused.value)
