"""One training process on several logical CPU devices, reporting what each replica read.

    python -m tests.support.workers.replica_worker PLAN --devices N

Every job of the JSON list ``PLAN`` (``tests/support/workers/plans.py``) trains the
experiment ``experiment`` with the same strategy, built once for the process. With
``TF_CONFIG`` naming several workers it is one worker of a ``MultiWorkerMirroredStrategy``
group, and every worker of the group runs the same plan.

A job writes ``out/worker-<i>.json``: for each of the first ``record_steps`` updates (3 if
not given) and each replica of this worker (by its global replica id), the SHA-256 of every
example the replica was fed; and ``out/weights-<i>.npz``, the weights after training. With
``stop_at`` S training stops at step S and a new Trainer, built afresh, resumes the run from
its checkpoint to the end, as a restarted process would.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from tests.support.workers.logical_devices import use_logical_cpus
from tests.support.workers.plans import run_plan


def example_digests(features: dict[str, tf.Tensor]) -> list[str]:
    """One digest per example of a batch, over every input feature's bytes."""
    names = sorted(features)
    arrays = [features[name].numpy() for name in names]
    return [
        hashlib.sha256(b"".join(array[i].tobytes() for array in arrays)).hexdigest()
        for i in range(len(arrays[0]))
    ]


def train(job: dict[str, Any], strategy: tf.distribute.Strategy) -> None:
    """Train one job's experiment and write what its replicas read and its weights."""
    import tf_keras as keras

    from research.experiments import load_experiment
    from research.experiments.task import ExperimentTask
    from training.controller import Controller
    from training.distribution import worker_role
    from training.trainer import Trainer

    role = worker_role()
    task = ExperimentTask(load_experiment(job["experiment"]))
    trainer = Trainer(task, strategy, role)
    replicas = strategy.num_replicas_in_sync
    local = replicas // role.count
    batches = trainer.input_iterator(0)
    seen = []
    for _ in range(job.get("record_steps", 3) * trainer.accumulation):
        features, _labels = next(batches)
        per_replica = strategy.experimental_local_results(features)
        seen.append(
            {
                str(role.index * local + i): example_digests(batch)
                for i, batch in enumerate(per_replica)
            }
        )
    stop_at = job.get("stop_at")
    if stop_at is not None:
        with Controller(trainer, eval_every_steps=None, progress=False) as controller:
            assert controller.train(until_step=stop_at).step == stop_at
        keras.backend.clear_session()
        trainer = Trainer(task, strategy, role)
    with Controller(trainer, eval_every_steps=None, progress=False) as controller:
        outcome = controller.train()
        held_out = controller.evaluate(task.config.data.eval_split)
    out = Path(job["out"])
    report = {"replicas": replicas, "step": outcome.step, "seen": seen, "validation": held_out}
    (out / f"worker-{role.index}.json").write_text(json.dumps(report))
    np.savez(out / f"weights-{role.index}.npz", *trainer.model.get_weights())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("plan", type=Path)
    parser.add_argument("--devices", type=int, required=True)
    args = parser.parse_args()
    use_logical_cpus(args.devices)

    from training.distribution import choose_strategy, worker_role

    strategy = choose_strategy(worker_role())
    run_plan(args.plan, lambda job: train(job, strategy))


if __name__ == "__main__":
    main()
