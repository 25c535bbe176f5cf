"""Picking the distribution strategy from what the process can see.

Several workers named in ``TF_CONFIG`` mean ``MultiWorkerMirroredStrategy`` (the local
launcher and Kubeflow's TFJob both set it); several local GPUs mean
``MirroredStrategy``; otherwise the default single-device strategy.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import tensorflow as tf


@dataclass(frozen=True)
class WorkerRole:
    index: int
    count: int

    @property
    def is_chief(self) -> bool:
        return self.index == 0


def worker_role(environ: dict[str, str] | None = None) -> WorkerRole:
    """This process's place in the cluster ``TF_CONFIG`` describes (0 of 1 without one)."""
    environ = os.environ if environ is None else environ
    raw = environ.get("TF_CONFIG")
    if not raw:
        return WorkerRole(0, 1)
    config = json.loads(raw)
    workers = config.get("cluster", {}).get("worker", [])
    task = config.get("task", {})
    chiefs = config.get("cluster", {}).get("chief", [])
    count = len(workers) + len(chiefs)
    if task.get("type") == "chief":
        return WorkerRole(0, count)
    return WorkerRole(int(task.get("index", 0)) + len(chiefs), count)


def choose_strategy(role: WorkerRole | None = None) -> tf.distribute.Strategy:
    role = role or worker_role()
    if role.count > 1:
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING
        )
        return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    gpus = tf.config.list_logical_devices("GPU")
    if len(gpus) > 1:
        return tf.distribute.MirroredStrategy()
    return tf.distribute.get_strategy()
