"""``slipway compress`` end to end, in this process: methods, report, gate and publishing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from contracts.model_manifest import MANIFEST_FILE, verify_model_dir
from slipway.cli import main
from tests.compression.models import SourceModel, publish_source

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> SourceModel:
    return publish_source("mlp", tmp_path_factory.mktemp("mlp"))


def compress_args(source: SourceModel, tmp_path: Path, *extra: str) -> list[str]:
    return [
        "compress",
        str(source.version_dir),
        "--data",
        str(source.dataset_dir),
        "--out",
        str(tmp_path / "repo"),
        "--report-dir",
        str(tmp_path / "report"),
        "--latency-runs",
        "20",
        *extra,
    ]


def test_two_methods_are_reported_and_the_integer_one_published(
    source: SourceModel, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        compress_args(
            source,
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
    source: SourceModel, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(compress_args(source, tmp_path, "--method", "int8,binarize", "--publish"))
    err = capsys.readouterr().err
    assert code == 2
    assert "unsupported compression method 'binarize'" in err
    assert not (tmp_path / "repo").exists() and not (tmp_path / "report").exists()


def test_publishing_a_method_that_was_not_run_is_refused_up_front(
    source: SourceModel, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(compress_args(source, tmp_path, "--method", "int8", "--publish", "prune"))
    assert code == 2
    assert "--publish prune: that method is not among those run" in capsys.readouterr().err
    assert not (tmp_path / "repo").exists()


def test_a_missing_dataset_is_a_usage_error(
    source: SourceModel, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = compress_args(source, tmp_path, "--method", "int8")
    args[args.index("--data") + 1] = str(tmp_path / "nowhere")
    assert main(args) == 2
    assert "nowhere" in capsys.readouterr().err


def test_piped_output_has_the_full_table(source: SourceModel, tmp_path: Path) -> None:
    """A log or CI artifact gets every column whole, not rich's 80-column default."""
    command = "import sys; from slipway.cli import main; sys.exit(main(sys.argv[1:]))"
    args = compress_args(source, tmp_path, "--method", "int8")
    done = subprocess.run(
        [sys.executable, "-c", command, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "COLUMNS": "80"},
        check=False,
        text=True,
    )
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    header = next(line for line in lines if "method" in line and "artifact" in line)
    for column in ("max abs diff", "gz ratio", "speed-up", "throughput (ex/s)"):
        assert column in header
    assert len(header) > 120
    int8 = next(line for line in lines if "│ int8 " in line)
    assert "passed" in int8
