"""Precision choice, the optimizer and its learning-rate schedule, and the worker's place
in a cluster."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf

from research.experiments.config import OptimizerConfig, ScheduleConfig
from training.distribution import WorkerRole, worker_role
from training.optimization import WarmupDecay, build_optimizer
from training.precision import cpu_flags, needs_loss_scaling, resolve_precision


@pytest.mark.parametrize(
    ("gpus", "flags", "expected"),
    [
        ([(7, 5)], frozenset(), "mixed_float16"),
        ([(8, 0), (8, 6)], frozenset(), "mixed_float16"),
        ([(6, 1)], frozenset({"amx_bf16"}), "float32"),
        # AVX512-BF16 without AMX ran bfloat16 at 0.88x float32: not the default.
        ([], frozenset({"avx512f", "avx512_bf16"}), "float32"),
        ([], frozenset({"amx_bf16", "avx512_bf16", "avx2"}), "mixed_bfloat16"),
        ([], frozenset({"avx2", "avx512f"}), "float32"),
    ],
)
def test_auto_precision_without_a_probe_is_the_safe_default(gpus, flags, expected):
    assert resolve_precision("auto", gpus=gpus, flags=flags) == expected


def test_explicit_precision_is_kept_and_only_float16_scales_the_loss():
    gpus = [(8, 0)] * 4
    assert resolve_precision("float32", gpus=gpus, flags=frozenset({"avx512_bf16"})) == "float32"
    assert needs_loss_scaling("mixed_float16")
    assert not needs_loss_scaling("mixed_bfloat16")


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor: 0\nflags\t\t: fpu avx512_bf16 sse\n")
    assert cpu_flags(cpuinfo) == frozenset({"fpu", "avx512_bf16", "sse"})
    assert cpu_flags(tmp_path / "missing") == frozenset()


def test_schedule_warms_up_then_decays_to_the_final_ratio():
    cosine = WarmupDecay(1.0, total_steps=110, warmup_steps=10, decay="cosine", final_ratio=0.1)
    rates = np.array([float(cosine(step)) for step in range(0, 111)])
    assert rates[0] == pytest.approx(0.1)
    assert rates[9] == pytest.approx(1.0)
    assert np.all(np.diff(rates[10:]) <= 1e-7)
    assert rates[110] == pytest.approx(0.1)
    assert float(cosine(60)) == pytest.approx(0.1 + 0.9 * 0.5, abs=1e-6)

    linear = WarmupDecay(2.0, total_steps=100, decay="linear")
    assert float(linear(50)) == pytest.approx(1.0)
    scale = tf.Variable(0.5)
    constant = WarmupDecay(2.0, total_steps=100, decay="constant", scale=scale)
    assert float(constant(70)) == pytest.approx(1.0)
    assert WarmupDecay.from_config(cosine.get_config()).get_config() == cosine.get_config()


def test_worker_role_from_tf_config():
    assert worker_role({}) == WorkerRole(0, 1)
    config = {"cluster": {"worker": ["a:1", "b:2", "c:3"]}, "task": {"type": "worker", "index": 2}}
    role = worker_role({"TF_CONFIG": json.dumps(config)})
    assert role == WorkerRole(2, 3) and not role.is_chief
    chief = {"cluster": {"chief": ["a:1"], "worker": ["b:2"]}, "task": {"type": "chief"}}
    assert worker_role({"TF_CONFIG": json.dumps(chief)}).is_chief


@pytest.mark.parametrize(
    ("config", "kind", "settings"),
    [
        ({}, "AdamW", {"beta_1": 0.9, "weight_decay": 1e-4}),
        (
            {"type": "sgd", "momentum": 0.8, "nesterov": True, "weight_decay": 0.0},
            "SGD",
            {"momentum": 0.8, "nesterov": True, "weight_decay": 0.0},
        ),
    ],
)
def test_the_optimizer_is_the_one_the_experiment_names_on_its_schedule(config, kind, settings):
    scale = tf.Variable(1.0)
    optimizer, schedule = build_optimizer(
        OptimizerConfig(learning_rate=0.5, **config),
        ScheduleConfig(decay="constant"),
        total_steps=10,
        lr_scale=scale,
        loss_scaling=False,
    )
    assert type(optimizer).__name__ == kind
    applied = optimizer.get_config()
    for name, value in settings.items():
        assert applied[name] == pytest.approx(value)
    assert float(schedule(3)) == pytest.approx(0.5)
