"""One training process on several logical CPU devices, reporting what each replica read.

    python -m tests.training.replica_worker EXPERIMENT OUT --devices N [--record-steps K]
        [--stop-at S]

Logical devices must be configured before TensorFlow initialises its devices, so this
runs as a fresh process. With ``TF_CONFIG`` naming several workers it is one worker of a
``MultiWorkerMirroredStrategy`` group. That strategy makes a replica of every local
GPU but of only one CPU device, so here it is shown the logical CPU devices as it would
be shown GPUs: the trainer runs exactly the code it runs with several GPUs per worker.

It writes ``OUT/worker-<i>.json``: for each of the first K updates and each replica of
this worker (by its global replica id), the SHA-256 of every example the replica was
fed; and ``OUT/weights-<i>.npz``, the weights after training. With ``--stop-at S``
training stops at step S and a new Trainer, built afresh, resumes the run from its
checkpoint to the end, as a restarted process would.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import numpy as np
import tensorflow as tf


def use_logical_cpus(count: int) -> None:
    """Split the CPU into ``count`` logical devices, and make them this worker's replicas."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(count)]
    )
    from tensorflow.python.distribute import collective_all_reduce_strategy

    def local_devices(self: object, resolver: object, worker_device: str) -> tuple:
        return tuple(f"{worker_device}/device:CPU:{i}" for i in range(count)), "CPU"

    extended = collective_all_reduce_strategy.CollectiveAllReduceExtended
    extended._initialize_local_devices = local_devices


def example_digests(features: dict[str, tf.Tensor]) -> list[str]:
    """One digest per example of a batch, over every input feature's bytes."""
    names = sorted(features)
    arrays = [features[name].numpy() for name in names]
    return [
        hashlib.sha256(b"".join(array[i].tobytes() for array in arrays)).hexdigest()
        for i in range(len(arrays[0]))
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("experiment", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--devices", type=int, required=True)
    parser.add_argument("--record-steps", type=int, default=3)
    parser.add_argument("--stop-at", type=int)
    args = parser.parse_args()
    use_logical_cpus(args.devices)

    import tf_keras as keras

    from research.experiments import load_experiment
    from research.experiments.task import ExperimentTask
    from training.controller import Controller
    from training.distribution import choose_strategy, worker_role
    from training.trainer import Trainer

    role = worker_role()
    strategy = choose_strategy(role)
    task = ExperimentTask(load_experiment(args.experiment))
    trainer = Trainer(task, strategy, role)
    replicas = strategy.num_replicas_in_sync
    local = replicas // role.count
    batches = trainer.input_iterator(0)
    seen = []
    for _ in range(args.record_steps * trainer.accumulation):
        features, _labels = next(batches)
        per_replica = strategy.experimental_local_results(features)
        seen.append(
            {
                str(role.index * local + i): example_digests(batch)
                for i, batch in enumerate(per_replica)
            }
        )
    if args.stop_at is not None:
        with Controller(trainer, eval_every_steps=None, progress=False) as controller:
            assert controller.train(until_step=args.stop_at).step == args.stop_at
        keras.backend.clear_session()
        trainer = Trainer(task, strategy, role)
    with Controller(trainer, eval_every_steps=None, progress=False) as controller:
        outcome = controller.train()
        held_out = controller.evaluate(task.config.data.eval_split)
    args.out.mkdir(parents=True, exist_ok=True)
    report = {
        "replicas": replicas,
        "step": outcome.step,
        "seen": seen,
        "validation": held_out,
    }
    (args.out / f"worker-{role.index}.json").write_text(json.dumps(report))
    np.savez(args.out / f"weights-{role.index}.npz", *trainer.model.get_weights())


if __name__ == "__main__":
    main()
