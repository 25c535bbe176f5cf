"""Which strategy and all-reduce a process picks for the devices it has (devices faked:
this machine has no GPU, and the strategies are recorded, not started)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import tensorflow as tf

import training.distribution as distribution
from training.distribution import WorkerRole, choose_strategy

IMPLEMENTATIONS = tf.distribute.experimental.CommunicationImplementation


@pytest.fixture
def devices(monkeypatch):
    """Set the GPUs this process sees and whether the build has NCCL; strategies record
    their arguments instead of starting."""
    made = []

    def record(kind):
        def strategy(*args, **kwargs):
            made.append((kind, args, kwargs))
            return kind

        return strategy

    monkeypatch.setattr(tf.distribute, "MultiWorkerMirroredStrategy", record("multi-worker"))
    monkeypatch.setattr(tf.distribute, "MirroredStrategy", record("mirrored"))

    def configure(gpus: int, nccl: bool):
        listed = [SimpleNamespace(name=f"/device:GPU:{i}") for i in range(gpus)]
        monkeypatch.setattr(
            tf.config, "list_physical_devices", lambda kind=None: listed if kind == "GPU" else []
        )
        monkeypatch.setattr(
            tf.config,
            "list_logical_devices",
            lambda kind=None: listed if kind == "GPU" else [SimpleNamespace(name="/cpu:0")],
        )
        monkeypatch.setattr(distribution, "nccl_available", lambda: nccl)
        return made

    return configure


@pytest.mark.parametrize(
    ("gpus", "nccl", "expected"),
    [
        (2, True, IMPLEMENTATIONS.NCCL),
        (2, False, IMPLEMENTATIONS.RING),  # a GPU build without NCCL
        (0, True, IMPLEMENTATIONS.RING),  # no GPU: collectives on the CPU
    ],
)
def test_workers_all_reduce_with_nccl_on_gpus_and_ring_elsewhere(devices, gpus, nccl, expected):
    made = devices(gpus, nccl)
    assert choose_strategy(WorkerRole(index=0, count=2)) == "multi-worker"
    ((_, _, kwargs),) = made
    assert kwargs["communication_options"].implementation == expected


@pytest.mark.parametrize(
    ("nccl", "expected"),
    [(True, tf.distribute.NcclAllReduce), (False, tf.distribute.HierarchicalCopyAllReduce)],
)
def test_one_process_on_several_gpus_mirrors_them(devices, nccl, expected):
    made = devices(2, nccl)
    assert choose_strategy(WorkerRole(index=0, count=1)) == "mirrored"
    ((_, args, kwargs),) = made
    assert args == (["/device:GPU:0", "/device:GPU:1"],)
    assert isinstance(kwargs["cross_device_ops"], expected)


def test_one_process_on_one_device_uses_the_default_strategy(devices):
    made = devices(0, False)
    assert choose_strategy(WorkerRole(index=0, count=1)) is tf.distribute.get_strategy()
    assert made == []
