"""The end-to-end story, run by ``make demo``: from raw data to (eventually) live traffic.

Every step runs the real ``slipway`` commands a user would type, in this process so
TensorFlow loads once, and prints the command first so it can be repeated by hand.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
from pathlib import Path

from rich.console import Console
from rich.rule import Rule

from slipway.cli import main as slipway
from slipway.start_up_noise import quiet_start_up_noise

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
console = Console()


def run(*argv: str) -> None:
    console.print(f"[bold cyan]$ slipway {shlex.join(argv)}[/]")
    code = slipway(list(argv))
    if code != 0:
        raise SystemExit(f"demo step failed (exit {code}): slipway {shlex.join(argv)}")


def write_raw_data(raw: Path) -> None:
    """Digits (shipped with scikit-learn) and a generated text corpus, plus their specs."""
    from research.data.synthetic import write_corpus_jsonl
    from slipway.raw_data import write_digits_folder, write_digits_npz

    write_digits_npz(raw)
    write_digits_folder(raw)
    write_corpus_jsonl(raw / "corpus.jsonl", 5000, seed=7)
    for spec in (EXAMPLES / "data").glob("*.yaml"):
        shutil.copy(spec, raw / spec.name)


def data_story(workdir: Path) -> None:
    raw, datasets = workdir / "raw", workdir / "datasets"
    console.print(Rule("1. Data engineering"))
    write_raw_data(raw)
    for name, spec in (
        ("digits", "digits.yaml"),
        ("digits-images", "digits_images.yaml"),
        ("corpus", "corpus.yaml"),
    ):
        run("data", "build", str(raw / spec), "-o", str(datasets / name), "--overwrite")
    run("data", "show", str(datasets / "corpus"))
    run(
        "data", "validate", str(datasets / "digits-images"), "--reference", str(datasets / "digits")
    )
    run("data", "validate", str(datasets / "corpus"))
    show_input_pipeline(datasets / "corpus")


def show_input_pipeline(dataset: Path) -> None:
    from contracts.dataset_manifest import load_manifest
    from research.data.input_pipeline import make_dataset

    features, labels = next(iter(make_dataset(dataset, "train", batch_size=4, seed=0)))
    if not isinstance(labels, dict):
        labels = {load_manifest(dataset).labels[0]: labels}
    console.print("a training batch from the tf.data input pipeline:")
    for name, tensor in {**features, **labels}.items():
        console.print(f"  {name}: {tensor.dtype.name} {tuple(tensor.shape)}")


def training_story(workdir: Path) -> Path:
    """Train the digits CNN and publish it as a version in the demo's model repository."""
    import json

    console.print(Rule("2. Training"))
    experiments = workdir / "experiments"
    experiments.mkdir(parents=True, exist_ok=True)
    for experiment in (EXAMPLES / "experiments").glob("*.yaml"):
        shutil.copy(experiment, experiments / experiment.name)
    models = workdir / "models"
    shutil.rmtree(models / "digits", ignore_errors=True)  # the demo starts from version 1
    shutil.rmtree(workdir / "runs" / "digits-cnn", ignore_errors=True)
    run("train", str(experiments / "digits_cnn.yaml"))
    version = models / "digits" / "1"
    manifest = json.loads((version / "slipway.json").read_text())
    signature = manifest["signature"]
    console.print(
        f"model repository: {version} — inputs {list(signature['inputs'])}, "
        f"outputs {list(signature['outputs'])}, test accuracy "
        f"{manifest['metrics']['test']['label_accuracy']:.3f}"
    )
    return version


def compression_chapter(workdir: Path, version: Path) -> None:
    """Quantize the trained model, compare it with the float model, publish the int8 one."""
    console.print(Rule("3. Compression"))
    reports = workdir / "compression"
    run(
        "compress", str(version),
        "--data", str(workdir / "datasets" / "digits"),
        "--method", "dynamic_range,int8,prune",
        "--out", str(workdir / "models"),
        "--publish", "int8",
        "--report-dir", str(reports),
    )  # fmt: skip
    console.print(f"report: {reports / 'report.md'} and {reports / 'report.png'}")


def serving_chapter(workdir: Path) -> None:
    from slipway.demo_serving import serving_story

    console.print(Rule("4. Serving"))
    serving_story(workdir, workdir / "datasets" / "digits")


def rollout_chapter(workdir: Path, version: Path) -> None:
    from slipway.demo_rollout import rollout_story

    console.print(Rule("5. Canary rollouts"))
    rollout_story(workdir, version, workdir / "datasets" / "digits")


def main() -> None:
    parser = argparse.ArgumentParser(description="Run Slipway's end-to-end demo.")
    parser.add_argument("--workdir", type=Path, default=Path("out/demo"))
    parser.add_argument(
        "--verbose", action="store_true", help="show TensorFlow's and Beam's start-up messages too"
    )
    args = parser.parse_args()
    if not args.verbose:
        quiet_start_up_noise()
    data_story(args.workdir)
    version = training_story(args.workdir)
    compression_chapter(args.workdir, version)
    serving_chapter(args.workdir)
    rollout_chapter(args.workdir, version)
    console.print(Rule("done"))
    console.print(f"everything the demo made is under [bold]{args.workdir}[/]")


if __name__ == "__main__":
    main()
