"""Picking the distribution strategy from what the process can see.

Several workers named in ``TF_CONFIG`` mean ``MultiWorkerMirroredStrategy`` (the local
launcher and Kubeflow's TFJob both set it), with every local GPU of each worker as a
replica; several local GPUs mean ``MirroredStrategy``; several logical CPU devices
(configured with ``tf.config.set_logical_device_configuration`` before TensorFlow
starts) mean ``MirroredStrategy`` over them; otherwise the default single-device
strategy. Gradients are all-reduced with NCCL on GPUs, and with TensorFlow's ring
collectives only where there is no GPU or the build has no NCCL.
"""

from __future__ import annotations

import json
import os
import sys
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


def nccl_available() -> bool:
    """Whether this TensorFlow build can all-reduce with NCCL (Linux CUDA/ROCm builds)."""
    info = tf.sysconfig.get_build_info()
    gpu_build = info.get("is_cuda_build", False) or info.get("is_rocm_build", False)
    return sys.platform == "linux" and bool(gpu_build)


def choose_strategy(role: WorkerRole | None = None) -> tf.distribute.Strategy:
    role = role or worker_role()
    if role.count > 1:
        # Physical devices: listing logical ones would start the runtime, and collectives
        # must be configured before it starts.
        nccl = bool(tf.config.list_physical_devices("GPU")) and nccl_available()
        implementations = tf.distribute.experimental.CommunicationImplementation
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=implementations.NCCL if nccl else implementations.RING
        )
        return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    gpus = tf.config.list_logical_devices("GPU")
    if len(gpus) > 1:
        reduce = (
            tf.distribute.NcclAllReduce()
            if nccl_available()
            else tf.distribute.HierarchicalCopyAllReduce()
        )
        return tf.distribute.MirroredStrategy([gpu.name for gpu in gpus], cross_device_ops=reduce)
    cpus = tf.config.list_logical_devices("CPU")
    if len(cpus) > 1:
        return tf.distribute.MirroredStrategy([cpu.name for cpu in cpus])
    return tf.distribute.get_strategy()
