"""Timing the model's own update in each candidate precision, for precision ``auto``.

The probe builds the run's Trainer in a policy, lets it compile and warm up, and times
a few updates of the real model on the real input pipeline: what a benchmark of the
policy on made-up shapes would miss (a small model dominated by casts and dispatch, an
input pipeline that hides the difference) is measured as the run will see it. The
Keras session is cleared after each probe, so the run's own model is built exactly as
it would be without one (same layer names, same seeds).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence

import tf_keras as keras

from research.experiments.task import ExperimentTask
from training.distribution import WorkerRole, choose_strategy
from training.precision import PrecisionChoice, choose_precision
from training.trainer import Trainer

# Compilation and first-touch costs land in the warm-up. The timed updates run as one
# compiled execution, as a run with steps_per_execution would, in rounds that alternate
# between the candidates; each keeps its fastest round, since other work on a shared
# machine only ever slows a round down.
WARMUP_UPDATES = 3
TIMED_UPDATES = 10
ROUNDS = 3


def model_key(task: ExperimentTask) -> str:
    """What an update's speed depends on besides the machine: the model, its inputs and
    heads, and the micro-batch."""
    config = task.config
    described = {
        "model": config.model.model_dump(mode="json") if config.model else task.model_fn_name,
        "inputs": {name: spec.model_dump(mode="json") for name, spec in task.inputs.items()},
        "heads": {name: spec.model_dump(mode="json") for name, spec in task.heads.items()},
        "micro_batch": config.data.batch_size // config.training.gradient_accumulation,
        "jit_compile": config.training.jit_compile,
    }
    canonical = json.dumps(described, sort_keys=True, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def measure_update_seconds(task: ExperimentTask, precisions: Sequence[str]) -> dict[str, float]:
    """Seconds per update of ``task``'s model in each of ``precisions``, on one worker."""
    role = WorkerRole(index=0, count=1)
    strategy = choose_strategy(role)
    trainers: dict[str, Trainer] = {}
    try:
        for precision in precisions:
            # Built and traced one after the other: each layer keeps the policy that was
            # global when it was built.
            trainers[precision] = Trainer(task, strategy, role, precision=precision)
            trainers[precision].train(WARMUP_UPDATES, stop_requested=False)
        best = dict.fromkeys(precisions, float("inf"))
        for round_index in range(ROUNDS):
            order = precisions if round_index % 2 == 0 else precisions[::-1]
            for precision in order:
                started = time.perf_counter()
                trainers[precision].train(TIMED_UPDATES, stop_requested=False)
                seconds = (time.perf_counter() - started) / TIMED_UPDATES
                best[precision] = min(best[precision], seconds)
        return best
    finally:
        trainers.clear()
        keras.backend.clear_session()


def choose_for_task(task: ExperimentTask) -> PrecisionChoice:
    """The precision ``task`` runs in here: as configured, or ``auto`` decided by probes
    (cached per machine and model shape)."""
    return choose_precision(
        task.config.training.precision,
        lambda precisions: measure_update_seconds(task, precisions),
        model_key=model_key(task),
    )
