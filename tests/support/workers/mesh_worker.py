"""One training process on several logical CPU devices, for the mesh and pipeline tests.

    python -m tests.support.workers.mesh_worker PLAN --devices N

Every job of the JSON list ``PLAN`` (``tests/support/workers/plans.py``) trains the
experiment ``experiment`` in one of two modes. ``curve`` makes ``updates`` updates (50 if
not given) one at a time and writes ``out/report.json`` with the loss of each, every
weight's device and, for every weight on a mesh, the shape each device holds (with
``poison_after`` P a weight turns NaN before update P, whose weights it saves in
``out/poisoned.npz``). ``run`` trains under the Controller (checkpoints, resume), stopping
at step ``stop_at`` and resuming in a new trainer when asked, then publishes (with
``until`` U it trains to step U and stops, as a stopped run would). Both write
``out/weights.npz``, the whole weights by name.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from tests.support.workers.logical_devices import use_logical_cpus
from tests.support.workers.plans import run_plan


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


def curve(trainer, task, job: dict[str, Any], out: Path) -> dict[str, Any]:
    """The loss of each update, made one at a time, and where the weights sit."""
    from research.models.weights import is_on_mesh
    from training.mesh import local_shapes

    report: dict[str, Any] = {"losses": []}
    for update in range(job.get("updates", 50)):
        if update == job.get("poison_after"):
            poison(trainer.model.get_layer("decoder_final_norm").gamma)
            np.savez(out / "poisoned.npz", **host_weights(trainer.model))
        report["losses"].append(trainer.train(1, stop_requested=False).loss)
    report["skipped_updates"] = trainer.skipped_updates
    report["consecutive_nonfinite"] = trainer.consecutive_nonfinite
    report["devices"] = {weight.name: weight.device for weight in trainer.model.weights}
    report["local_shapes"] = {
        weight.name: local_shapes(weight) for weight in trainer.model.weights if is_on_mesh(weight)
    }
    report["evaluation"] = trainer.evaluate(task.config.data.eval_split)
    return report


def run(trainer, task, role, job: dict[str, Any]):
    """Train under the Controller as ``slipway train`` does; the trainer that finished."""
    import tf_keras as keras

    from training.controller import Controller
    from training.run import build_trainer

    stop_at, until = job.get("stop_at"), job.get("until")
    if stop_at is not None:
        with Controller(trainer, eval_every_steps=None, progress=False) as controller:
            assert controller.train(until_step=stop_at).step == stop_at
        keras.backend.clear_session()
        trainer = build_trainer(task, role)
    with Controller(trainer, eval_every_steps=None, progress=False) as controller:
        outcome = controller.train(until_step=until)
        published = None if until else controller.publish({})
    report = {"step": outcome.step, "published": str(published[1]) if published else None}
    return trainer, report


def train(job: dict[str, Any]) -> None:
    """Train one job's experiment and write its report and weights."""
    from research.experiments import load_experiment
    from research.experiments.task import ExperimentTask
    from training.distribution import WorkerRole
    from training.run import build_trainer

    out = Path(job["out"])
    role = WorkerRole(0, 1)
    task = ExperimentTask(load_experiment(job["experiment"]))
    trainer = build_trainer(task, role)
    report: dict[str, Any] = {"trainer": type(trainer).__name__}
    if job["mode"] == "curve":
        report.update(curve(trainer, task, job, out))
    else:
        trainer, outcome = run(trainer, task, role, job)
        report.update(outcome)
    (out / "report.json").write_text(json.dumps(report))
    np.savez(out / "weights.npz", **host_weights(trainer.model))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("plan", type=Path)
    parser.add_argument("--devices", type=int, required=True)
    args = parser.parse_args()
    use_logical_cpus(args.devices)
    run_plan(args.plan, train)


if __name__ == "__main__":
    main()
