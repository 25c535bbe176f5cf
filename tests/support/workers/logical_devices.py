"""Splitting one CPU into logical devices that a worker trains on as it would on GPUs.

Logical devices must be configured before TensorFlow initialises its devices, which is
why the tests that need them start a fresh worker process.
"""

from __future__ import annotations

import tensorflow as tf


def use_logical_cpus(count: int) -> None:
    """Split the CPU into ``count`` logical devices, and make them this worker's replicas.

    ``MultiWorkerMirroredStrategy`` makes a replica of every local GPU but of only one CPU
    device, so it is shown the logical CPU devices as it would be shown GPUs: the trainer
    runs exactly the code it runs with several GPUs per worker.
    """
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(count)]
    )
    from tensorflow.python.distribute import collective_all_reduce_strategy

    def local_devices(self: object, resolver: object, worker_device: str) -> tuple:
        return tuple(f"{worker_device}/device:CPU:{i}" for i in range(count)), "CPU"

    extended = collective_all_reduce_strategy.CollectiveAllReduceExtended
    extended._initialize_local_devices = local_devices
