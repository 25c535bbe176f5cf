"""DTensor meshes against one device: update time and checkpoint save/restore time.

``python -m benchmarks.tensor_parallel [--quick]`` (also section 7 of
``benchmarks.training``). The example GPT (``examples/experiments/tiny_lm.yaml``) is
trained by the trainer on the demo's corpus, on one device and on 1x2 and 2x2 meshes of
logical CPU devices, each in a fresh process (a process splits its CPU before
TensorFlow starts). Each process times updates after a warm-up, then writes and reads
the run's whole checkpoint (model, optimizer, input position) a few times. Processes
alternate set-ups and each figure is the median over rounds.

Logical CPU devices share this machine's cores, so a mesh here shows the cost of
splitting the model (collectives, smaller kernels), not a speed-up: reported, no goal.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import benchmark_parser, machine_info, print_rows, write_results

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_FILE = REPO_ROOT / "benchmarks" / "results" / "tensor_parallel.json"
EXPERIMENT = REPO_ROOT / "examples" / "experiments" / "tiny_lm.yaml"
MESHES = (None, "1x2", "2x2")
PROBE_TIMEOUT_SECONDS = 900


def _label(mesh: str | None) -> str:
    return f"mesh {mesh}" if mesh else "one device"


def build_corpus(workdir: Path) -> Path:
    """The demo's corpus, built with its example spec."""
    from research.data.pipeline import build_dataset
    from research.data.spec import load_spec
    from slipway.demo import write_raw_data

    raw = workdir / "raw"
    write_raw_data(raw)
    build_dataset(load_spec(raw / "corpus.yaml"), workdir / "corpus", overwrite=True)
    return workdir / "corpus"


def probe(mesh: str | None, dataset: str, workdir: str, updates: int, saves: int) -> dict:
    """One process's figures (its CPU is split by the trainer when ``mesh`` asks)."""
    import tensorflow as tf
    import yaml

    from research.experiments import load_experiment
    from research.experiments.task import ExperimentTask
    from training.distribution import WorkerRole
    from training.run import build_trainer

    config = yaml.safe_load(EXPERIMENT.read_text(encoding="utf-8"))
    config["data"]["dataset"] = dataset
    config["run_dir"] = str(Path(workdir) / "run")
    config["training"].update(steps=10 * updates, precision="float32")
    if mesh:
        batch, model = (int(size) for size in mesh.split("x"))
        config["distribution"] = {"mesh": {"batch": batch, "model": model}}
    path = Path(workdir) / "experiment.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    trainer = build_trainer(ExperimentTask(load_experiment(path)), WorkerRole(0, 1))
    trainer.train(3, stop_requested=False)  # tracing, the shuffle buffer
    started = time.perf_counter()
    trainer.train(updates, stop_requested=False)
    update_seconds = (time.perf_counter() - started) / updates
    checkpoint = tf.train.Checkpoint(**trainer.checkpointed)
    prefix = str(Path(workdir) / "ckpt")
    checkpoint.write(prefix)  # the first write builds the saver
    writes, reads = [], []
    for _ in range(saves):
        started = time.perf_counter()
        checkpoint.write(prefix)
        writes.append(time.perf_counter() - started)
        started = time.perf_counter()
        checkpoint.read(prefix).assert_consumed()
        reads.append(time.perf_counter() - started)
    return {
        "mesh": mesh,
        "update_seconds": update_seconds,
        "save_seconds": statistics.median(writes),
        "restore_seconds": statistics.median(reads),
        "parameters": int(sum(v.shape.num_elements() for v in trainer.model.trainable_variables)),
    }


def _probe_in_fresh_process(request: dict[str, Any]) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks.tensor_parallel", "--probe", json.dumps(request)]
    result = subprocess.run(
        command,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
        capture_output=True,
        text=True,
        timeout=PROBE_TIMEOUT_SECONDS,
        cwd=REPO_ROOT,
    )
    if result.returncode != 0:
        raise RuntimeError(f"the mesh probe failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def measure(quick: bool, workdir: Path, dataset: Path | None = None) -> dict[str, Any]:
    """Every set-up in alternation; medians, and ratios against one device."""
    dataset = dataset or build_corpus(workdir)
    rounds, updates, saves = (1, 20, 3) if quick else (2, 60, 5)
    probes: dict[str, list[dict]] = {_label(mesh): [] for mesh in MESHES}
    for round_index in range(rounds):
        for mesh in MESHES:
            print(f"  {_label(mesh)}: round {round_index + 1}/{rounds} ...", flush=True)
            scratch = tempfile.mkdtemp(prefix="mesh-", dir=workdir)
            request = {
                "mesh": mesh,
                "dataset": str(dataset),
                "workdir": scratch,
                "updates": updates,
                "saves": saves,
            }
            probes[_label(mesh)].append(_probe_in_fresh_process(request))
    figures: dict[str, Any] = {}
    for label, runs in probes.items():
        figures[label] = {
            key: statistics.median(run[key] for run in runs)
            for key in ("update_seconds", "save_seconds", "restore_seconds")
        }
    base = figures[_label(None)]
    for values in figures.values():
        for key in ("update_seconds", "save_seconds", "restore_seconds"):
            values[key.replace("seconds", "ratio")] = values[key] / base[key]
    return {
        "experiment": EXPERIMENT.name,
        "parameters": probes[_label(None)][0]["parameters"],
        "setups": figures,
        "probes": probes,
    }


def table_rows(figures: dict[str, Any]) -> list[tuple[str, ...]]:
    """Rows for a benchmark table (columns as in ``benchmarks.training``)."""
    rows = []
    base = figures["setups"][_label(None)]
    titles = {
        "update": "7. DTensor mesh: one update",
        "save": "   sharded checkpoint save",
        "restore": "   sharded checkpoint restore",
    }
    for measure, title in titles.items():
        for mesh in MESHES[1:]:
            values = figures["setups"][_label(mesh)]
            rows.append(
                (
                    title if mesh == MESHES[1] else "",
                    f"GPT ({EXPERIMENT.name}), {_label(mesh)}",
                    f"{values[f'{measure}_seconds'] * 1000:,.1f} ms",
                    f"{base[f'{measure}_seconds'] * 1000:,.1f} ms one device",
                    f"{values[f'{measure}_ratio']:.2f}x",
                    "",
                    "",
                    "[dim]reported",
                )
            )
    return rows


def print_table(results: dict[str, Any]) -> None:
    quick = " (quick)" if results["quick"] else ""
    print_rows("DTensor meshes" + quick, table_rows(results["meshes"]))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--probe"]:
        print(json.dumps(probe(**json.loads(argv[1]))))
        return 0
    parser = benchmark_parser(
        "benchmarks.tensor_parallel", __doc__, "fewer updates, one round", RESULTS_FILE
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="slipway-bench-mesh-") as tmp:
        results = {
            "quick": args.quick,
            "machine": machine_info(),
            "meshes": measure(args.quick, Path(tmp)),
        }
    write_results(args.output, results, print_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
