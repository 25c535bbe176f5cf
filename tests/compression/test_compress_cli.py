"""``slipway compress`` end to end, in this process: methods, report, gate and publishing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from compression import cli as compression_cli
from contracts.model_manifest import MANIFEST_FILE, verify_model_dir
from slipway.cli import main
from tests.support.compression_models import SourceModel


def compress_args(mlp_source: SourceModel, tmp_path: Path, *extra: str) -> list[str]:
    return [
        "compress",
        str(mlp_source.version_dir),
        "--data",
        str(mlp_source.dataset_dir),
        "--out",
        str(tmp_path / "repo"),
        "--report-dir",
        str(tmp_path / "report"),
        "--latency-runs",
        "20",
        *extra,
    ]


def test_two_methods_are_reported_and_the_integer_one_published(
    mlp_source: SourceModel, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        compress_args(
            mlp_source,
            tmp_path,
            "--method",
            "prune,int8",
            "--epochs",
            "1",
            "--max-accuracy-drop",
            "5",
            "--publish",
        )  # fmt: skip
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "compression results" in out and "published version 1" in out

    report = json.loads((tmp_path / "report" / "report.json").read_text())
    rows = [(r["method"], r["artifact"], r["status"]) for r in report["results"]]
    assert rows == [
        ("float32", "SavedModel", "baseline"),
        ("float32", "TFLite", "passed"),
        ("prune", "TFLite", "passed"),
        ("int8", "TFLite", "passed"),
    ]
    prune = report["results"][2]
    assert prune["details"]["overall_sparsity"] == pytest.approx(0.5, abs=0.02)
    assert prune["gzip_ratio"] < 0.9  # zeros compress
    assert report["published"]["method"] == "int8"
    assert (tmp_path / "report" / "report.md").read_text().count("\n| ") == 5
    assert (tmp_path / "report" / "report.png").stat().st_size > 10_000

    version_dir = tmp_path / "repo" / "mlp" / "1"
    assert verify_model_dir(version_dir) == []
    manifest = json.loads((version_dir / MANIFEST_FILE).read_text())
    assert manifest["compression"]["method"] == "int8"
    assert manifest["metrics"]["test"]["tflite_bytes"] == report["results"][3]["size_bytes"]


def test_unknown_method_is_a_usage_error_and_publishes_nothing(
    mlp_source: SourceModel, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(compress_args(mlp_source, tmp_path, "--method", "int8,binarize", "--publish"))
    err = capsys.readouterr().err
    assert code == 2
    assert "unsupported compression method 'binarize'" in err
    assert not (tmp_path / "repo").exists() and not (tmp_path / "report").exists()


def test_publishing_a_method_that_was_not_run_is_refused_up_front(
    mlp_source: SourceModel, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(compress_args(mlp_source, tmp_path, "--method", "int8", "--publish", "prune"))
    assert code == 2
    assert "--publish prune: that method is not among those run" in capsys.readouterr().err
    assert not (tmp_path / "repo").exists()


def test_a_missing_dataset_is_a_usage_error(
    mlp_source: SourceModel, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = compress_args(mlp_source, tmp_path, "--method", "int8")
    args[args.index("--data") + 1] = str(tmp_path / "nowhere")
    assert main(args) == 2
    assert "nowhere" in capsys.readouterr().err


def test_piped_output_has_the_full_table(
    mlp_source: SourceModel,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A log or CI artifact gets every column whole, not rich's 80-column default."""
    # Captured output is not a terminal, as a pipe is not; the console is made afresh the
    # way the command makes it, in an environment that names an 80-column width.
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setattr(compression_cli, "console", Console(log_path=False))
    capsys.readouterr()
    assert main(compress_args(mlp_source, tmp_path, "--method", "int8")) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if "method" in line and "artifact" in line)
    for column in ("max abs diff", "gz ratio", "speed-up", "throughput (ex/s)"):
        assert column in header
    assert len(header) > 120
    int8 = next(line for line in lines if "│ int8 " in line)
    assert "passed" in int8
