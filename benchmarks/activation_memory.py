"""Activation recomputation: peak memory and time of a GPT training step with and without.

``python -m benchmarks.activation_memory [--quick]`` (also section 6 of
``benchmarks.training``). Each measurement is a fresh process, so neither set-up
inherits the other's allocations: it builds the zoo's GPT at sequence length 512 with
``recompute`` off or on, and runs the trainer's kind of step (forward and backward
compiled with XLA, then an Adam update) on random token ids. TensorFlow's CPU allocator
is switched to its BFC allocator (``TF_CPU_ALLOCATOR_USE_BFC``), whose statistics give
the peak bytes in use; the peak is reset after the warm-up steps, so it is a step's
peak, not compilation's. Processes alternate (plain, recomputed, plain, ...) and each
figure is the median over rounds; the goal is a peak at most 0.70x the plain one.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import benchmark_parser, machine_info, print_rows, write_results

RESULTS_FILE = Path(__file__).resolve().parent / "results" / "activation_memory.json"
MEMORY_GOAL = 0.70
PROBE_TIMEOUT_SECONDS = 900


@dataclass(frozen=True)
class Shape:
    """The GPT and batch measured."""

    sequence_length: int = 512
    batch_size: int = 8
    num_layers: int = 4
    d_model: int = 128
    num_heads: int = 4
    ff_dim: int = 512
    vocab_size: int = 2000
    dropout: float = 0.1
    warmup_steps: int = 2
    steps: int = 5


FULL = Shape()
QUICK = Shape(steps=3)


def probe(shape: Shape, recompute: bool) -> dict[str, Any]:
    """One process's measurement (run with the BFC allocator already chosen)."""
    import numpy as np
    import tensorflow as tf
    import tf_keras as keras

    from research.models.registry import build_model

    keras.utils.set_random_seed(0)
    keras.backend.experimental.enable_tf_random_generator()
    config = {
        "type": "gpt",
        "num_layers": shape.num_layers,
        "d_model": shape.d_model,
        "num_heads": shape.num_heads,
        "ff_dim": shape.ff_dim,
        "dropout": shape.dropout,
        "recompute": recompute,
    }
    inputs = {
        "tokens": {
            "kind": "tokens",
            "shape": [shape.sequence_length],
            "vocab_size": shape.vocab_size,
        }
    }
    model = build_model(config, inputs, {"next_token": {"kind": "language_model"}})
    optimizer = keras.optimizers.Adam(1e-3)
    optimizer.build(model.trainable_variables)
    rng = np.random.default_rng(0)
    ids = tf.constant(
        rng.integers(1, shape.vocab_size, size=(shape.batch_size, shape.sequence_length + 1))
    )

    @tf.function(jit_compile=True)
    def gradients(ids: tf.Tensor) -> tuple[tf.Tensor, list[tf.Tensor]]:
        with tf.GradientTape() as tape:
            logits = model({"tokens": ids[:, :-1]}, training=True)["next_token"]
            loss = tf.reduce_mean(
                keras.losses.sparse_categorical_crossentropy(ids[:, 1:], logits, from_logits=True)
            )
        return loss, tape.gradient(loss, model.trainable_variables)

    @tf.function
    def step(ids: tf.Tensor) -> tf.Tensor:
        loss, grads = gradients(ids)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    for _ in range(shape.warmup_steps):
        step(ids).numpy()
    tf.config.experimental.reset_memory_stats("CPU:0")
    times = []
    for _ in range(shape.steps):
        started = time.perf_counter()
        step(ids).numpy()
        times.append(time.perf_counter() - started)
    memory = tf.config.experimental.get_memory_info("CPU:0")
    return {
        "recompute": recompute,
        "peak_bytes": memory["peak"],
        "step_seconds": statistics.median(times),
        "parameters": int(sum(np.prod(v.shape) for v in model.trainable_variables)),
    }


def _probe_in_fresh_process(shape: Shape, recompute: bool) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks.activation_memory", "--probe", json.dumps(
        {"shape": asdict(shape), "recompute": recompute}
    )]  # fmt: skip
    environment = {**os.environ, "TF_CPU_ALLOCATOR_USE_BFC": "true", "TF_CPP_MIN_LOG_LEVEL": "2"}
    result = subprocess.run(
        command,
        env=environment,
        capture_output=True,
        text=True,
        timeout=PROBE_TIMEOUT_SECONDS,
        cwd=Path(__file__).resolve().parent.parent,
    )
    if result.returncode != 0:
        raise RuntimeError(f"the memory probe failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def measure(quick: bool) -> dict[str, Any]:
    """Plain and recomputed probes in alternation; medians and their ratios."""
    shape = QUICK if quick else FULL
    rounds = 1 if quick else 2
    probes: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    for round_index in range(rounds):
        for recompute in (False, True):
            print(
                f"  activation memory: round {round_index + 1}/{rounds}, "
                f"recompute {'on' if recompute else 'off'} ...",
                flush=True,
            )
            probes[recompute].append(_probe_in_fresh_process(shape, recompute))

    def median(recompute: bool, key: str) -> float:
        return statistics.median(probe[key] for probe in probes[recompute])

    plain_peak, recomputed_peak = median(False, "peak_bytes"), median(True, "peak_bytes")
    plain_time, recomputed_time = median(False, "step_seconds"), median(True, "step_seconds")
    memory_ratio = recomputed_peak / plain_peak
    return {
        "shape": asdict(shape),
        "parameters": probes[False][0]["parameters"],
        "plain_peak_bytes": plain_peak,
        "recompute_peak_bytes": recomputed_peak,
        "memory_ratio": memory_ratio,
        "plain_step_seconds": plain_time,
        "recompute_step_seconds": recomputed_time,
        "step_time_ratio": recomputed_time / plain_time,
        "goal": MEMORY_GOAL,
        "verdict": "met" if memory_ratio <= MEMORY_GOAL else "missed",
        "probes": {"plain": probes[False], "recompute": probes[True]},
    }


def table_rows(figures: dict[str, Any]) -> list[tuple[str, ...]]:
    """Rows for a benchmark table (columns as in ``benchmarks.training``)."""
    mib = 2**20
    shape = figures["shape"]
    model = f"GPT {shape['num_layers']}x{shape['d_model']}, seq {shape['sequence_length']}"
    style = "green" if figures["verdict"] == "met" else "red"
    return [
        (
            "6. recompute: peak memory of a step",
            model,
            f"{figures['recompute_peak_bytes'] / mib:,.0f} MiB",
            f"{figures['plain_peak_bytes'] / mib:,.0f} MiB without",
            f"{figures['memory_ratio']:.2f}x",
            "",
            f"<= {MEMORY_GOAL:.2f}x",
            f"[{style}]{figures['verdict']}",
        ),
        (
            "   its step time",
            model,
            f"{figures['recompute_step_seconds'] * 1000:,.0f} ms",
            f"{figures['plain_step_seconds'] * 1000:,.0f} ms without",
            f"{figures['step_time_ratio']:.2f}x",
            "",
            "",
            "[dim]reported",
        ),
    ]


def print_table(results: dict[str, Any]) -> None:
    quick = " (quick)" if results["quick"] else ""
    print_rows("Activation recomputation" + quick, table_rows(results["recompute"]))


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--probe"]:
        request = json.loads(argv[1])
        print(json.dumps(probe(Shape(**request["shape"]), request["recompute"])))
        return 0
    parser = benchmark_parser(
        "benchmarks.activation_memory", __doc__, "fewer steps, one round", RESULTS_FILE
    )
    args = parser.parse_args(argv)
    results = {"quick": args.quick, "machine": machine_info(), "recompute": measure(args.quick)}
    write_results(args.output, results, print_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
