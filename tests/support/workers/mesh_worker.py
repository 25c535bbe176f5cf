"""One training process on several logical CPU devices, for the mesh and pipeline tests.

    python -m tests.training.mesh_worker EXPERIMENT OUT --devices N --mode curve|run
        [--updates K] [--stop-at S] [--until U]

``curve`` makes K updates one at a time and writes ``OUT/report.json`` with the loss of
each, every weight's device and, for every weight on a mesh, the shape each device
holds (with
``--poison-after P`` a weight turns NaN before update P, whose weights it saves in
``OUT/poisoned.npz``); ``run`` trains under
the Controller (checkpoints, resume), stopping at step S and resuming in a new trainer
when asked, then publishes (with ``--until U`` it trains to step U and exits, as a
stopped run would). Both write ``OUT/weights.npz``, the whole weights by name.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from tests.training.replica_worker import use_logical_cpus


def host_weights(model) -> dict[str, np.ndarray]:
    from research.models.weights import host_value

    return {weight.name: host_value(weight) for weight in model.weights}


def poison(variable) -> None:
    """Make ``variable`` NaN, laid out as it is (on a mesh or not)."""
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    from research.models.weights import is_on_mesh
    from training.mesh import replicated

    nan = tf.fill(variable.shape, float("nan"))
    if is_on_mesh(variable):
        layout = dtensor.fetch_layout(variable)
        nan = dtensor.relayout(replicated(layout.mesh, nan), layout)
    variable.assign(nan)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("experiment", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--devices", type=int, required=True)
    parser.add_argument("--mode", choices=["curve", "run"], required=True)
    parser.add_argument("--updates", type=int, default=50)
    parser.add_argument("--stop-at", type=int)
    parser.add_argument("--until", type=int)
    parser.add_argument("--poison-after", type=int, help="curve: make a weight NaN after K")
    args = parser.parse_args()
    use_logical_cpus(args.devices)

    import tf_keras as keras

    from research.experiments import load_experiment
    from research.experiments.task import ExperimentTask
    from research.models.weights import is_on_mesh
    from training.controller import Controller
    from training.distribution import WorkerRole
    from training.mesh import local_shapes
    from training.run import build_trainer

    args.out.mkdir(parents=True, exist_ok=True)
    role = WorkerRole(0, 1)
    task = ExperimentTask(load_experiment(args.experiment))
    trainer = build_trainer(task, role)
    report: dict = {"trainer": type(trainer).__name__}
    if args.mode == "curve":
        report["losses"] = []
        for update in range(args.updates):
            if update == args.poison_after:
                poison(trainer.model.get_layer("decoder_final_norm").gamma)
                np.savez(args.out / "poisoned.npz", **host_weights(trainer.model))
            report["losses"].append(trainer.train(1, stop_requested=False).loss)
        report["skipped_updates"] = trainer.skipped_updates
        report["consecutive_nonfinite"] = trainer.consecutive_nonfinite
        report["devices"] = {weight.name: weight.device for weight in trainer.model.weights}
        report["local_shapes"] = {
            weight.name: local_shapes(weight)
            for weight in trainer.model.weights
            if is_on_mesh(weight)
        }
        report["evaluation"] = trainer.evaluate(task.config.data.eval_split)
    else:
        if args.stop_at is not None:
            with Controller(trainer, eval_every_steps=None, progress=False) as controller:
                assert controller.train(until_step=args.stop_at).step == args.stop_at
            keras.backend.clear_session()
            trainer = build_trainer(task, role)
        with Controller(trainer, eval_every_steps=None, progress=False) as controller:
            outcome = controller.train(until_step=args.until)
            published = None if args.until else controller.publish({})
        report["step"] = outcome.step
        report["published"] = str(published[1]) if published else None
    (args.out / "report.json").write_text(json.dumps(report))
    np.savez(args.out / "weights.npz", **host_weights(trainer.model))


if __name__ == "__main__":
    main()
