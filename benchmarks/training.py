"""Trainer benchmarks: ``python -m benchmarks.training [--quick]``.

Two workloads from the model zoo, as the example experiments configure them: the
Transformer encoder on the generated text corpus (``text_transformer.yaml``) and the
ResNet-style CNN on the 8x8 digits (``digits_cnn.yaml``), each on a dataset built by
``build_dataset`` from the demo's raw data. Everything is compared side by side in one
run, so the figures that matter are ratios, not absolute times on a shared machine:

1. the trainer against a plain ``model.fit`` of the same model, on the same
   ``tf.data`` pipeline, in the same precision and with the same
   ``steps_per_execution`` (goal: at least as fast), and, reported next to it, against
   ``fit`` compiled with ``jit_compile=True`` (XLA, which the trainer uses by default and
   Keras 2's ``fit`` does not);
2. ``precision: auto`` (the fastest candidate by the trainer's probe, cached per
   machine and model) against float32 (goal: never slower), next to a large bfloat16
   matmul that shows what the CPU itself can gain;
3. a checkpoint every 100 steps against none (goal: at least 0.95 of the speed);
4. losing a worker: seconds from a SIGKILL of one of two local workers to the first
   step the restarted group completes under the ``Supervisor``;
5. the input pipeline iterated alone against what the trainer consumes (goal: at
   least 3x, i.e. training is never input-bound);
6. activation recomputation: the peak memory of a GPT step at sequence length 512 with
   ``recompute: true`` against without, each in a fresh process, and its step time
   (goal: at most 0.70x the memory; ``benchmarks.activation_memory``);
7. DTensor meshes (1x2, 2x2 logical CPU devices) against one device: update time and
   sharded checkpoint save and restore time (reported; ``benchmarks.tensor_parallel``).

Throughput is steady state only: everything first trains ``warmup_steps`` (tracing, the
shuffle buffer, the first epoch into the cache). Comparisons 1 to 3 build their set-ups
(the trainer, the trainer in float32, the trainer with the controller's checkpoint every
100 steps, ``fit``'s own train function with and without XLA) in one process and time them in alternating
blocks of 100 steps, so a change in the machine's load falls on all of them alike and
every block of the checkpointing set-up holds exactly one save; a ratio is the median of
the ratios of blocks run next to each other (the CNN, whose blocks are a tenth as long,
runs three times as many). The input pipeline (5) is iterated alone,
its best of several rounds. Rates are given per second and per CPU second of this
process: the second moves much less when the machine's load does, and a goal counts as
met or missed only when both agree.

Results are printed as a table and written to ``benchmarks/results/training.json``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import activation_memory, tensor_parallel
from benchmarks.common import TRAINER_COLUMNS, benchmark_parser, machine_info

REPO_ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = REPO_ROOT / "examples"
RESULTS_FILE = REPO_ROOT / "benchmarks" / "results" / "training.json"
FIT_GOAL = 1.0
AUTO_GOAL = 1.0  # auto picks the fastest candidate here; float32 is one
CHECKPOINT_GOAL = 0.95
PIPELINE_GOAL = 3.0
CHECKPOINT_EVERY = 100
# Under the supervisor: checkpoint often and kill after the first one, so the restarted
# group really restores a checkpoint before its first step.
RESTART_CHECKPOINT_EVERY = 20
KILL_AFTER_STEP = 24
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16", "amx_tile", "avx512_fp16", "avx512f")
MATMUL_SIZE = 1024


@dataclass(frozen=True)
class Workload:
    """One zoo model on one dataset, as an example experiment trains it."""

    name: str
    experiment: str  # file under examples/experiments
    dataset: str  # name the dataset is built under
    spec: str  # file under examples/data
    # Side-by-side blocks per ``Sizes.blocks``: a short step leaves a save's few
    # milliseconds a larger share of a block, so its medians need more blocks to settle.
    block_factor: int = 1


WORKLOADS = (
    Workload("transformer", "text_transformer.yaml", "corpus", "corpus.yaml"),
    Workload("cnn", "digits_cnn.yaml", "digits", "digits.yaml", block_factor=3),
)


@dataclass(frozen=True)
class Sizes:
    rounds: int  # of the input pipeline alone
    warmup_steps: int  # a multiple of every experiment's steps_per_execution
    blocks: int  # side by side: blocks of CHECKPOINT_EVERY steps per set-up
    pipeline_seconds: float
    restart_workloads: tuple[str, ...]


FULL = Sizes(
    rounds=3,
    warmup_steps=52,
    blocks=16,
    pipeline_seconds=5.0,
    restart_workloads=("cnn", "transformer"),
)
QUICK = Sizes(
    rounds=1,
    warmup_steps=20,
    blocks=5,
    pipeline_seconds=2.0,
    restart_workloads=("cnn",),
)


# --- datasets and experiments ---------------------------------------------------------


def build_datasets(workdir: Path) -> dict[str, Path]:
    """The demo's raw digits and corpus, built with the example dataset specs."""
    from research.data.pipeline import build_dataset
    from research.data.spec import load_spec
    from slipway.demo import write_raw_data

    raw = workdir / "raw"
    write_raw_data(raw)
    built = {}
    for workload in WORKLOADS:
        output = workdir / "datasets" / workload.dataset
        build_dataset(load_spec(raw / workload.spec), output, overwrite=True)
        built[workload.name] = output
    return built


def experiment(
    workload: Workload,
    dataset: Path,
    run_dir: Path,
    *,
    steps: int,
    precision: str = "auto",
    checkpoint_every: int | None = None,
) -> Any:
    """The example experiment, pointed at ``dataset`` and trained for ``steps`` updates.

    No evaluation split: the figures are about training, and evaluating at the end
    would only add to the time every run takes.
    """
    from research.experiments import load_experiment
    from research.experiments.config import ExperimentConfig

    config = load_experiment(EXAMPLES / "experiments" / workload.experiment).model_dump(mode="json")
    config["run_dir"] = str(run_dir)
    config["data"].update(dataset=str(dataset), eval_split=None, test_split=None)
    config["training"].update(steps=steps, epochs=None, precision=precision, eval_every_steps=None)
    config["checkpoint"].update(every_steps=checkpoint_every, every_seconds=None)
    return ExperimentConfig.model_validate(config)


# --- set-ups timed side by side ------------------------------------------------------


def run_records(run_dir: Path) -> list[dict[str, Any]]:
    """Every record of a run's ``metrics.jsonl`` (none when it has not written one)."""
    try:
        text = (run_dir / "metrics.jsonl").read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def fit_train_function(config: Any, *, jit_compile: bool = False) -> tuple[Callable[[], Any], str]:
    """One execution of ``model.fit`` as a Keras user would write it, and its precision.

    The model, the ``tf.data`` pipeline, the precision policy, the losses and their
    weights, AdamW with the same schedule and clipping, and ``steps_per_execution`` all
    come from the experiment; dropout draws from Keras' default RNG and no training
    metric is compiled (the trainer computes none during its updates either). What is
    returned is the function ``fit`` calls once per execution, on the iterator it would
    use: ``fit``'s callbacks and progress bookkeeping are left out, which can only make
    it look faster.
    """
    import tf_keras as keras

    from research.experiments.task import ExperimentTask
    from research.models.endpoints import compile_args
    from training.optimization import WarmupDecay
    from training.precision import apply_precision, needs_loss_scaling
    from training.precision_probe import choose_for_task

    training = config.training
    task = ExperimentTask(config)
    precision = choose_for_task(task).precision  # what the trainer runs in (cached)
    keras.utils.set_random_seed(config.seed)
    keras.backend.experimental.disable_tf_random_generator()
    apply_precision(precision)
    dataset = task.build_inputs(
        config.data.train_split, batch_size=config.data.batch_size, training=True
    )
    model = task.build_model()
    schedule = training.schedule
    optimizer = keras.optimizers.AdamW(
        learning_rate=WarmupDecay(
            training.optimizer.learning_rate,
            training.steps,
            schedule.warmup_steps,
            schedule.decay,
            schedule.final_learning_rate_ratio,
        ),
        weight_decay=training.optimizer.weight_decay,
        beta_1=training.optimizer.beta_1,
        beta_2=training.optimizer.beta_2,
        epsilon=training.optimizer.epsilon,
        global_clipnorm=training.optimizer.clip_global_norm,
    )
    if needs_loss_scaling(precision):
        optimizer = keras.mixed_precision.LossScaleOptimizer(optimizer)
    compiled = compile_args(task.heads)
    model.compile(
        optimizer=optimizer,
        loss=compiled["loss"],
        loss_weights=compiled["loss_weights"],
        steps_per_execution=training.steps_per_execution,
        jit_compile=jit_compile,
    )
    train_function = model.make_train_function()
    iterator = iter(dataset.repeat())
    return lambda: float(train_function(iterator)["loss"]), precision


def trainer_execution(config: Any, stack: contextlib.ExitStack) -> tuple[Callable[[], Any], str]:
    """One execution of the trainer, built as ``slipway train`` builds it, and its
    precision; with ``checkpoint.every_steps`` set, followed by the controller's save
    when one is due (the checks and the write it makes in a run)."""
    from research.experiments.task import ExperimentTask
    from training.controller import Controller
    from training.distribution import WorkerRole, choose_strategy
    from training.precision_probe import choose_for_task
    from training.trainer import Trainer

    task = ExperimentTask(config)
    precision = choose_for_task(task).precision
    role = WorkerRole(index=0, count=1)
    trainer = Trainer(task, choose_strategy(role), role, precision=precision)
    updates = config.training.steps_per_execution
    if config.checkpoint.every_steps is None:
        return lambda: trainer.train(updates, stop_requested=False), precision
    controller = stack.enter_context(Controller(trainer, eval_every_steps=None, progress=False))
    # A run pays once for tracing its checkpoint write: here, with the warm-up, not in a
    # block.
    trainer.train(updates, stop_requested=False)
    controller.save(force=True)

    def execute_and_checkpoint() -> None:
        trainer.train(updates, stop_requested=False)
        controller.save()

    return execute_and_checkpoint, precision


def run_side_by_side(
    sides: Mapping[str, tuple[Callable[[], Any], str]],
    *,
    updates: int,
    batch_size: int,
    warmup_steps: int,
    blocks: int,
) -> dict[str, dict[str, Any]]:
    """Executions of several set-ups in one process, timed in alternating blocks.

    Run one after the other, two identical configurations differ by as much as a goal
    (the machine's load moves between runs); alternating blocks exposes every set-up to
    the same moments. A block is ``CHECKPOINT_EVERY`` steps, so a set-up that
    checkpoints saves exactly once in each. Blocks of the same index ran next to each
    other, so their ratio is one paired measurement; the comparisons take the median of
    those ratios, which a burst of other work in one block cannot move.
    """
    if CHECKPOINT_EVERY % updates:
        raise ValueError(f"steps_per_execution {updates} does not divide {CHECKPOINT_EVERY}")
    block = CHECKPOINT_EVERY // updates
    for run, _ in sides.values():  # tracing, the shuffle buffer, the cache
        for _ in range(max(1, warmup_steps // updates)):
            run()
    timings: dict[str, list[tuple[float, float]]] = {name: [] for name in sides}
    for index in range(blocks):
        order = list(sides) if index % 2 == 0 else list(sides)[::-1]
        for name in order:
            run = sides[name][0]
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(block):
                run()
            timings[name].append((time.perf_counter() - wall, time.process_time() - cpu))
    examples = CHECKPOINT_EVERY * batch_size
    results: dict[str, dict[str, Any]] = {}
    for name, blocks_timed in timings.items():
        rates = {
            "examples_per_second": [round(examples / wall, 1) for wall, _ in blocks_timed],
            "examples_per_cpu_second": [round(examples / cpu, 1) for _, cpu in blocks_timed],
        }
        best = {rate: max(values) for rate, values in rates.items()}
        results[name] = {**rates, "precision": sides[name][1], "best": best, "paired": True}
    return results


def bench_side_by_side(
    workload: Workload, dataset: Path, workdir: Path, sizes: Sizes
) -> dict[str, dict[str, Any]]:
    """The trainer in ``precision: auto``, the same in float32, the same checkpointing
    every ``CHECKPOINT_EVERY`` steps, and ``fit`` (in auto's precision, with and without
    XLA), side by side."""
    import tf_keras as keras

    keras.backend.clear_session()
    steps = 1_000_000  # never reached: only the learning-rate schedule depends on it

    def config(name: str, **settings: Any) -> Any:
        return experiment(
            workload, dataset, workdir / f"{workload.name}-{name}", steps=steps, **settings
        )

    auto = config("auto")
    with contextlib.ExitStack() as stack:
        sides = {
            "trainer": trainer_execution(auto, stack),
            "float32": trainer_execution(config("float32", precision="float32"), stack),
            "checkpoint": trainer_execution(
                config("checkpoint", checkpoint_every=CHECKPOINT_EVERY), stack
            ),
            "fit": fit_train_function(auto),
            "fit_xla": fit_train_function(auto, jit_compile=True),
        }
        return run_side_by_side(
            sides,
            updates=auto.training.steps_per_execution,
            batch_size=auto.data.batch_size,
            warmup_steps=sizes.warmup_steps,
            blocks=sizes.blocks * workload.block_factor,
        )


def run_pipeline(config: Any, seconds: float) -> dict[str, Any]:
    """The trainer's own input pipeline iterated alone, with nothing training.

    Timed from the second pass over the data on (the first fills the shuffle buffer
    and, where the experiment caches, the cache) for about ``seconds``.
    """
    import tf_keras as keras

    from research.experiments.task import ExperimentTask

    keras.backend.clear_session()
    task = ExperimentTask(config)
    batch = config.data.batch_size
    dataset = task.build_inputs(config.data.train_split, batch_size=batch, training=True)
    batches = iter(dataset)
    for _ in range(task.steps_per_epoch + 1):
        next(batches)
    count, started, cpu_started = 0, time.perf_counter(), time.process_time()
    while (elapsed := time.perf_counter() - started) < seconds:
        next(batches)
        count += 1
    return {
        "examples_per_second": count * batch / elapsed,
        "examples_per_cpu_second": count * batch / (time.process_time() - cpu_started),
        "precision": "",
    }


# --- the side-by-side rounds -----------------------------------------------------------

RATES = ("examples_per_second", "examples_per_cpu_second")


@dataclass(frozen=True)
class Comparison:
    key: str
    title: str
    measured: str  # variant
    baseline: str  # variant
    goal: float | None  # None: reported, with no goal


COMPARISONS = (
    Comparison("trainer_vs_fit", "1. trainer vs model.fit", "trainer", "fit", FIT_GOAL),
    Comparison(
        "trainer_vs_fit_xla", "   trainer vs fit(jit_compile=True)", "trainer", "fit_xla", None
    ),
    Comparison("auto_vs_float32", "2. precision auto vs float32", "trainer", "float32", AUTO_GOAL),
    Comparison(
        "checkpoint_vs_none",
        "3. checkpoint /100 steps vs none",
        "checkpoint",
        "trainer",
        CHECKPOINT_GOAL,
    ),
    Comparison(
        "pipeline_vs_trainer",
        "5. input pipeline alone vs trainer",
        "pipeline",
        "trainer",
        PIPELINE_GOAL,
    ),
)


def bench_pipeline(workload: Workload, dataset: Path, workdir: Path, sizes: Sizes) -> dict:
    """The input pipeline alone, ``sizes.rounds`` times; its best round."""
    config = experiment(workload, dataset, workdir / f"{workload.name}-pipeline", steps=1)
    figures: dict[str, Any] = {rate: [] for rate in RATES}
    for round_index in range(sizes.rounds):
        result = run_pipeline(config, sizes.pipeline_seconds)
        for rate in RATES:
            figures[rate].append(round(result[rate], 1))
        print(
            f"  {workload.name:<11} round {round_index + 1}/{sizes.rounds} input pipeline"
            f" {result['examples_per_second']:>9,.0f} examples/s",
            flush=True,
        )
    figures["precision"] = ""
    figures["best"] = {rate: max(figures[rate]) for rate in RATES}
    return figures


def bench_workload(
    workload: Workload, dataset: Path, workdir: Path, sizes: Sizes
) -> dict[str, Any]:
    """The set-ups side by side, then the input pipeline alone."""
    print(f"  {workload.name:<11} trainer, float32, checkpointing and fit side by side ...")
    variants = bench_side_by_side(workload, dataset, workdir, sizes)
    variants["pipeline"] = bench_pipeline(workload, dataset, workdir, sizes)
    comparisons = {}
    for comparison in COMPARISONS:
        measured, baseline = variants[comparison.measured], variants[comparison.baseline]
        outcome: dict[str, Any] = {"goal": comparison.goal}
        paired = measured.get("paired", False) and baseline.get("paired", False)
        for key, rate in zip(("ratio", "cpu_ratio"), RATES, strict=True):
            if paired:  # each pair of blocks' own ratio; the spread shows the noise
                by_block = [
                    _ratio(top, bottom)
                    for top, bottom in zip(measured[rate], baseline[rate], strict=True)
                ]
                outcome[f"{key}_by_block"] = by_block
                outcome[key] = round(statistics.median(by_block), 3)
            else:
                outcome[key] = _ratio(measured["best"][rate], baseline["best"][rate])
        outcome["verdict"] = verdict(outcome)
        comparisons[comparison.key] = outcome
    config = experiment(workload, dataset, workdir, steps=1)  # for its settings
    return {
        "experiment": workload.experiment,
        "batch_size": config.data.batch_size,
        "steps_per_execution": config.training.steps_per_execution,
        "warmup_steps": sizes.warmup_steps,
        "blocks": sizes.blocks * workload.block_factor,
        "block_steps": CHECKPOINT_EVERY,
        "variants": variants,
        "comparisons": comparisons,
    }


def verdict(outcome: Mapping[str, float]) -> str:
    """``met`` or ``missed`` when the wall-clock and the CPU-time ratios agree on it;
    ``unclear`` when they do not, which on a shared machine means the load moved."""
    if outcome["goal"] is None:
        return "reported"
    met = [outcome[key] >= outcome["goal"] for key in ("ratio", "cpu_ratio")]
    return "met" if all(met) else "missed" if not any(met) else "unclear"


def _ratio(numerator: float, denominator: float) -> float:
    return round(numerator / denominator, 3)


# --- bfloat16 on this CPU --------------------------------------------------------------


def bench_matmul(repeats: int = 20) -> dict[str, Any]:
    """A large square matmul in bfloat16 and float32: the most the CPU can gain.

    The small zoo models spend much of a step outside matrix multiplies (and in casts
    that bfloat16 adds), so their ratio is below this ceiling.
    """
    import tensorflow as tf

    rates = {}
    for dtype in (tf.float32, tf.bfloat16):
        a = tf.random.stateless_normal([MATMUL_SIZE, MATMUL_SIZE], seed=[1, 2], dtype=dtype)
        b = tf.random.stateless_normal([MATMUL_SIZE, MATMUL_SIZE], seed=[3, 4], dtype=dtype)
        multiply = tf.function(lambda x, y: tf.reduce_sum(tf.cast(tf.matmul(x, y), tf.float32)))
        multiply(a, b).numpy()
        best = float("inf")
        for _ in range(repeats):
            started = time.perf_counter()
            multiply(a, b).numpy()
            best = min(best, time.perf_counter() - started)
        rates[dtype.name] = 2 * MATMUL_SIZE**3 / best / 1e9
    return {
        "size": MATMUL_SIZE,
        "float32_gflops": round(rates["float32"], 1),
        "bfloat16_gflops": round(rates["bfloat16"], 1),
        "bfloat16_vs_float32": _ratio(rates["bfloat16"], rates["float32"]),
    }


# --- 4. losing a worker under the supervisor -------------------------------------------


def _wait_for(
    condition: Callable[[], bool], alive: Callable[[], bool], timeout: float, what: str
) -> None:
    """Poll ``condition`` until it holds; fail when the supervisor ends or time runs out."""
    deadline = time.monotonic() + timeout
    while not condition():
        if not alive():
            raise RuntimeError(f"the supervisor stopped before {what}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.05)


def resumed_at(run_dir: Path, *, after: float) -> float | None:
    """When the chief logged resuming from a checkpoint (after ``after``), if it did.

    Splits a restarted worker's start-up into what comes before the restore (starting
    Python, importing TensorFlow, joining the cluster, building the model) and what
    comes after it (tracing the update and running the first execution).
    """
    times = [
        float(record["time"])
        for record in run_records(run_dir)
        if record.get("kind") == "event"
        and str(record.get("message", "")).startswith("resumed from checkpoint")
        and float(record["time"]) >= after
    ]
    return min(times, default=None)


def bench_restart(
    workload: Workload, dataset: Path, workdir: Path, *, timeout: float = 600.0
) -> dict[str, Any]:
    """SIGKILL worker 1 of 2 mid-run and time the supervisor's recovery.

    The workers are ``slipway train --worker`` processes under a ``Supervisor`` with the
    settings ``slipway train --workers 2`` uses. Once the restarted group has completed
    a step the run is stopped as on preemption; the timings come from the supervisor's
    ``RestartEvent`` and from this process's clock at the kill (both wall-clock).
    """
    import yaml
    from rich.console import Console

    from training.errors import EXIT_DIVERGED, EXIT_INVALID
    from training.launcher import read_heartbeat
    from training.supervisor import Supervisor

    config = experiment(
        workload,
        dataset,
        workdir / "run",
        steps=100_000,
        checkpoint_every=RESTART_CHECKPOINT_EVERY,
    )
    path = workdir / "experiment.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")), encoding="utf-8")
    command = [sys.executable, "-m", "slipway", "train", str(path), "--worker"]
    command += ["--no-export", "--quiet"]
    # What the supervisor says and worker 0's output, which it copies to stdout.
    said = io.StringIO()
    supervisor = Supervisor(
        command,
        2,
        log_dir=config.run_path / "workers",
        permanent_exit_codes=(EXIT_INVALID, EXIT_DIVERGED),
        env={"TF_CPP_MIN_LOG_LEVEL": "2"},
        console=Console(file=said, soft_wrap=True),
    )
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(supervisor.run()), daemon=True)

    def step_reached() -> bool:
        beat = read_heartbeat(supervisor.heartbeat_file(1))
        return beat is not None and beat.step >= KILL_AFTER_STEP

    def recovered() -> bool:
        return bool(supervisor.restarts) and supervisor.restarts[0].first_step_at is not None

    with contextlib.redirect_stdout(said):
        thread.start()
        try:
            _wait_for(step_reached, thread.is_alive, timeout, f"step {KILL_AFTER_STEP}")
            killed_at = time.time()
            os.kill(supervisor.pids[1], signal.SIGKILL)
            _wait_for(recovered, thread.is_alive, timeout, "the restarted group's first step")
        except RuntimeError as exc:
            tail = " | ".join(said.getvalue().strip().splitlines()[-6:])
            raise RuntimeError(f"{exc}; last output: {tail}") from None
        finally:
            supervisor.request_stop("benchmark finished")
            thread.join(timeout)
    event = supervisor.restarts[0]
    restored_at = resumed_at(config.run_path, after=event.relaunched_at)
    return {
        "experiment": workload.experiment,
        "workers": 2,
        "killed_after_step": KILL_AFTER_STEP,
        "restart_reason": f"worker {event.worker} {event.reason}",
        "backoff_seconds": supervisor.policy.delay(1),
        "kill_to_detected_seconds": round(event.detected_at - killed_at, 3),
        "seconds_to_relaunch": round(event.seconds_to_relaunch, 3),
        "seconds_to_first_step": round(event.seconds_to_first_step, 3),
        "startup_to_first_step_seconds": round(event.first_step_at - event.relaunched_at, 3),
        "startup_to_restored_seconds": (
            None if restored_at is None else round(restored_at - event.relaunched_at, 3)
        ),
        "kill_to_first_step_seconds": round(event.first_step_at - killed_at, 3),
        "supervisor_exit_code": codes[0] if codes else None,
    }


# --- report ----------------------------------------------------------------------------


STATUS_STYLES = {"met": "green", "missed": "red", "unclear": "yellow", "reported": "dim"}


def _rate(figures: Mapping[str, Any]) -> str:
    precision = f" {figures['precision']}" if figures["precision"] else ""
    return f"{figures['best']['examples_per_second']:,.0f} ex/s{precision}"


def _restart_row(name: str, restart: Mapping[str, Any]) -> tuple[str, ...]:
    title = "4. SIGKILL 1 of 2 workers -> first new step"
    if "error" in restart:
        return (title, name, f"failed: {restart['error']}", "", "", "", "", "[red]failed")
    restored = restart["startup_to_restored_seconds"]
    startup = f"{restart['startup_to_first_step_seconds']:.1f} s"
    if restored is not None:
        startup += f" (restored at {restored:.1f} s)"
    breakdown = (
        f"detect {restart['kill_to_detected_seconds']:.1f} s + stop the survivor, back off, "
        f"relaunch {restart['seconds_to_relaunch']:.1f} s + new workers to first step {startup}"
    )
    measured = f"{restart['kill_to_first_step_seconds']:.1f} s"
    return (title, name, measured, breakdown, "", "", "", "")


def _ratio_cell(outcome: Mapping[str, Any], key: str) -> str:
    """The ratio, with the range of the paired blocks' own ratios where there are some."""
    by_block = outcome.get(f"{key}_by_block", [])
    spread = f" ({_times(min(by_block))}-{_times(max(by_block))})" if by_block else ""
    return f"{_times(outcome[key])}x{spread}"


def _times(ratio: float) -> str:
    return f"{ratio:.2f}" if ratio < 10 else f"{ratio:.0f}"


def print_table(results: Mapping[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:
        console = Console(width=180)
    quick = " (quick)" if results["quick"] else ""
    table = Table(title=f"Slipway trainer benchmarks{quick}")
    for column in TRAINER_COLUMNS:
        table.add_column(column)
    workloads = results["workloads"]
    for comparison in COMPARISONS:
        if comparison.key == "pipeline_vs_trainer":
            for name, restart in results["restart"].items():
                table.add_row(*_restart_row(name, restart))
        for name, figures in workloads.items():
            outcome = figures["comparisons"][comparison.key]
            table.add_row(
                comparison.title,
                name,
                _rate(figures["variants"][comparison.measured]),
                _rate(figures["variants"][comparison.baseline]),
                _ratio_cell(outcome, "ratio"),
                _ratio_cell(outcome, "cpu_ratio"),
                "" if comparison.goal is None else f">= {comparison.goal:g}x",
                f"[{STATUS_STYLES[outcome['verdict']]}]{outcome['verdict']}",
            )
        if comparison.key == "auto_vs_float32":
            matmul = results["bf16_matmul"]
            table.add_row(
                "   the CPU alone: matmul",
                f"{matmul['size']}x{matmul['size']}",
                f"{matmul['bfloat16_gflops']:,.0f} GFLOP/s bfloat16",
                f"{matmul['float32_gflops']:,.0f} GFLOP/s float32",
                f"{_times(matmul['bfloat16_vs_float32'])}x",
                "",
                "",
                "",
            )
    for row in activation_memory.table_rows(results["recompute"]):
        table.add_row(*row)
    for row in tensor_parallel.table_rows(results["meshes"]):
        table.add_row(*row)
    console.print(table)
    machine = results["machine"]
    flags = ", ".join(machine["bf16_cpu_flags"]) or "none"
    blocks_per_workload = ", ".join(
        f"{name} {workload['blocks']}" for name, workload in results["workloads"].items()
    )
    console.print(
        f"CPU: {machine['cpu_model']}, {machine['cpus']} cores, bf16-related flags: {flags} "
        f"(precision auto candidates: {', '.join(machine['precision_auto_candidates'])}); "
        "load average "
        f"{machine['load_average'][0]:.1f} at the start, "
        f"{machine['load_average_end'][0]:.1f} at the end. 1 to 3 are timed side by side in "
        f"blocks of 100 steps ({blocks_per_workload}): 'ratio' is the "
        "median ratio of examples per "
        "second of blocks run next to each other, 'per CPU s' the same per CPU second of this "
        "process (steadier when other work shares the machine), in brackets their range; 5 "
        "compares the best rounds. A goal is met or missed when both ratios agree, unclear "
        "when they do not.",
        soft_wrap=True,
    )


def training_machine_info() -> dict[str, Any]:
    """The shared machine description plus what decides precision on this CPU."""
    from training.precision import candidates, cpu_flags, gpu_capabilities

    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    flags = cpu_flags()
    return {
        **machine_info(),
        "cpu_model": model,
        "bf16_cpu_flags": [flag for flag in BF16_CPU_FLAGS if flag in flags],
        "precision_auto_candidates": candidates(gpu_capabilities=gpu_capabilities(), flags=flags),
        "onednn_opts": os.environ.get("TF_ENABLE_ONEDNN_OPTS", "default (on)"),
    }


def run(quick: bool, output: Path) -> dict[str, Any]:
    sizes = QUICK if quick else FULL
    started = time.perf_counter()
    results: dict[str, Any] = {
        "quick": quick,
        "rounds": sizes.rounds,
        "machine": training_machine_info(),
    }
    with tempfile.TemporaryDirectory(prefix="slipway-bench-training-") as tmp:
        workdir = Path(tmp)
        print("building the datasets ...", flush=True)
        datasets = build_datasets(workdir)
        results["bf16_matmul"] = bench_matmul()
        results["workloads"] = {
            workload.name: bench_workload(
                workload, datasets[workload.name], workdir / "runs", sizes
            )
            for workload in WORKLOADS
        }
        results["restart"] = {}
        for workload in WORKLOADS:
            if workload.name not in sizes.restart_workloads:
                continue
            print(f"  {workload.name:<11} killing a worker under the supervisor ...", flush=True)
            try:
                results["restart"][workload.name] = bench_restart(
                    workload, datasets[workload.name], workdir / f"restart-{workload.name}"
                )
            except RuntimeError as exc:  # a failed recovery is a result, not a crash
                results["restart"][workload.name] = {"error": str(exc)}
        results["meshes"] = tensor_parallel.measure(quick, workdir, datasets["transformer"])
    results["recompute"] = activation_memory.measure(quick)
    results["machine"]["load_average_end"] = os.getloadavg()
    results["seconds"] = round(time.perf_counter() - started, 1)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print_table(results)
    print(f"results written to {output} ({results['seconds']:.0f} s)")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(
        "benchmarks.training", __doc__, "small sizes; a few minutes", RESULTS_FILE
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    run(args.quick, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
