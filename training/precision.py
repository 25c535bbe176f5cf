"""Choosing and applying a numeric precision policy.

``auto`` picks what is fastest without hurting accuracy on the hardware at hand:
bfloat16 where the CPU multiplies it natively (AVX512-BF16 or AMX), float16 with
dynamic loss scaling on GPUs, float32 otherwise. Model outputs stay float32 either way
(the zoo ends every head in a float32 activation), so losses and metrics are computed
at full precision.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

Precision = Literal["auto", "float32", "mixed_bfloat16", "mixed_float16"]
_BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def resolve_precision(
    requested: Precision, *, gpus: int | None = None, flags: frozenset[str] | None = None
) -> str:
    """The concrete policy name ``requested`` means on this machine."""
    if requested != "auto":
        return requested
    if gpus is None:
        import tensorflow as tf

        gpus = len(tf.config.list_physical_devices("GPU"))
    if gpus > 0:
        return "mixed_float16"
    if _BF16_CPU_FLAGS & (cpu_flags() if flags is None else flags):
        return "mixed_bfloat16"
    return "float32"


def apply_precision(policy: str) -> None:
    """Set the global Keras policy; layers built afterwards compute in it."""
    import tf_keras as keras

    keras.mixed_precision.set_global_policy(policy)


def needs_loss_scaling(policy: str) -> bool:
    """float16 underflows small gradients; bfloat16 has float32's range and does not."""
    return policy == "mixed_float16"
