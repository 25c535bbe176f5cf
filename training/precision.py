"""Choosing and applying a numeric precision policy.

``auto`` picks what is fastest here for the model at hand. The hardware only says which
policies are worth trying: float32 always; bfloat16 on CPUs with AVX512-BF16 or AMX and
on GPUs of compute capability 8 or more; float16 with dynamic loss scaling on GPUs with
tensor cores (7 or more). Whether one of them is actually faster depends on the model
and the chip (bfloat16 on an AVX512-BF16 CPU without AMX runs a small model at 0.9x
float32), so when there is more than one candidate a short timed probe of the model's
own update in each decides, and the timings are cached per machine and model shape
(``$XDG_CACHE_HOME/slipway/precision.json``) so that only the first run pays for it.

A run keeps the precision it started in: the choice is recorded in its run directory
(``<run_dir>/precision.json``) and a resumed run, or any worker of it, reads it back
instead of probing again; a probe on a machine whose cache was cleared could choose
differently, and the resumed run would no longer be the one that was interrupted.

Without a probe (a worker started by another launcher, whose peers could time
differently) ``auto`` takes the safe default: float32 on CPUs unless they have AMX,
and on GPUs with tensor cores their first reduced precision.

Model outputs stay float32 whichever policy runs (the zoo ends every head in a float32
activation), so losses and metrics are computed at full precision.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from contracts.atomic_files import write_json_atomically
from training.errors import TrainingSetupError

Precision = Literal["auto", "float32", "mixed_bfloat16", "mixed_float16"]
POLICIES = ("float32", "mixed_bfloat16", "mixed_float16")
_BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
# Matrix units that make bfloat16 pay on a CPU without a probe: AVX512-BF16 alone ran a
# small model at 0.88x float32.
_AMX_CPU_FLAGS = frozenset({"amx_bf16"})
CACHE_DIR_ENV = "SLIPWAY_CACHE_DIR"
CACHE_FORMAT = "slipway.precision/1"
RUN_RECORD = "precision.json"
RUN_RECORD_FORMAT = "slipway.run-precision/1"


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def candidates(*, gpu_capabilities: Sequence[tuple[int, int]], flags: frozenset[str]) -> list[str]:
    """The policies this hardware may run faster than float32, fastest-hoped first,
    float32 last. ``gpu_capabilities``: the CUDA compute capability of each GPU."""
    if gpu_capabilities:
        oldest = min(gpu_capabilities)
        found = ["mixed_float16"] if oldest >= (7, 0) else []
        found += ["mixed_bfloat16"] if oldest >= (8, 0) else []
        return [*found, "float32"]
    return ["mixed_bfloat16", "float32"] if _BF16_CPU_FLAGS & flags else ["float32"]


def gpu_capabilities() -> list[tuple[int, int]]:
    """The compute capability of every visible GPU (loads TensorFlow)."""
    import tensorflow as tf

    found = []
    for gpu in tf.config.list_physical_devices("GPU"):
        capability = tf.config.experimental.get_device_details(gpu).get("compute_capability")
        found.append(tuple(capability) if capability else (0, 0))
    return found


def resolve_precision(
    requested: Precision,
    *,
    gpus: Sequence[tuple[int, int]] | None = None,
    flags: frozenset[str] | None = None,
) -> str:
    """The concrete policy ``requested`` means without a probe: the safe default.
    float32 on CPUs unless they have AMX (AVX512-BF16 alone ran bfloat16 slower than
    float32); on GPUs the hardware's first candidate (float16 on tensor cores). What
    every worker of a group gets when no launcher chose for them and the run recorded
    no choice, since workers timing on their own could disagree."""
    if requested != "auto":
        return requested
    gpus = gpu_capabilities() if gpus is None else gpus
    flags = cpu_flags() if flags is None else flags
    if gpus:
        return candidates(gpu_capabilities=gpus, flags=flags)[0]
    return "mixed_bfloat16" if _AMX_CPU_FLAGS & flags else "float32"


@dataclass(frozen=True)
class PrecisionChoice:
    """The policy a run uses, why, and for a probed ``auto`` the seconds per update of
    every candidate."""

    precision: str
    reason: str
    seconds_per_update: dict[str, float] = field(default_factory=dict)

    def describe(self) -> str:
        """One line for the run log."""
        return f"precision {self.precision} ({self.reason})"


def cache_file() -> Path:
    """Where probe timings are kept: per user, shared by every run on this machine."""
    base = os.environ.get(CACHE_DIR_ENV)
    if base:
        return Path(base) / "precision.json"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "slipway" / "precision.json"


def machine_fingerprint(
    gpus: Sequence[tuple[int, int]], flags: frozenset[str], cpuinfo: Path = Path("/proc/cpuinfo")
) -> str:
    """What makes timings from one machine valid on another: CPU model and flags, GPUs,
    the TensorFlow build and the core count."""
    try:
        model = next(
            line.split(":", 1)[1].strip()
            for line in cpuinfo.read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        model = platform.processor()
    from importlib.metadata import PackageNotFoundError, version

    try:
        tensorflow = version("tensorflow")
    except PackageNotFoundError:
        tensorflow = "?"
    described = json.dumps(
        [model, sorted(flags), list(gpus), tensorflow, os.cpu_count()], sort_keys=True
    )
    return hashlib.sha256(described.encode()).hexdigest()[:16]


def choose_precision(
    requested: Precision,
    measure: Callable[[list[str]], dict[str, float]],
    *,
    model_key: str,
    gpus: Sequence[tuple[int, int]] | None = None,
    flags: frozenset[str] | None = None,
    cache: Path | None = None,
) -> PrecisionChoice:
    """``requested``, or for ``auto`` the candidate whose update ``measure`` finds fastest
    (it returns the seconds per update of the model's own step in each policy it gets).

    Timings are looked up in, and added to, ``cache`` (default ``cache_file()``) under
    this machine's fingerprint and ``model_key`` (the model's shape), so a model is
    probed once per machine. Ties go to the candidate listed first.
    """
    if requested != "auto":
        return PrecisionChoice(requested, "as configured")
    gpus = gpu_capabilities() if gpus is None else list(gpus)
    flags = cpu_flags() if flags is None else flags
    found = candidates(gpu_capabilities=gpus, flags=flags)
    if len(found) == 1:
        return PrecisionChoice(found[0], "auto: the only candidate on this hardware")
    path = cache if cache is not None else cache_file()
    key = f"{machine_fingerprint(gpus, flags)}/{model_key}"
    entries = _read_cache(path)
    timings = entries.get(key, {})
    cached = all(name in timings for name in found)
    if not cached:
        measured = measure(found)
        timings = {name: float(measured[name]) for name in found}
        entries[key] = timings
        _write_cache(path, entries)
    timings = {name: timings[name] for name in found}
    best = min(found, key=lambda name: (timings[name], found.index(name)))
    shown = ", ".join(f"{name} {seconds * 1000:.3g} ms" for name, seconds in timings.items())
    source = f"cached probe, {path}" if cached else "probe"
    return PrecisionChoice(best, f"auto: fastest by {source}; per update {shown}", timings)


def _read_cache(path: Path) -> dict[str, dict[str, float]]:
    """The cached timings; an unreadable or foreign file counts as empty."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT:
        return {}
    entries = data.get("timings")
    return entries if isinstance(entries, dict) else {}


def _write_cache(path: Path, entries: dict[str, dict[str, float]]) -> None:
    """Best effort: a read-only home directory costs a probe per run, not the run."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomically(path, {"format": CACHE_FORMAT, "timings": entries})
    except OSError:
        pass


def run_record(run_dir: Path) -> Path:
    """Where a run keeps the precision it trains in."""
    return run_dir / RUN_RECORD


def record_precision(run_dir: Path, choice: PrecisionChoice) -> None:
    """Record ``choice`` as the precision of the run in ``run_dir`` (atomically)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomically(
        run_record(run_dir),
        {
            "format": RUN_RECORD_FORMAT,
            "precision": choice.precision,
            "reason": choice.reason,
            "seconds_per_update": choice.seconds_per_update,
        },
    )


def recorded_precision(run_dir: Path) -> PrecisionChoice | None:
    """The precision the run in ``run_dir`` recorded at its start, its reason saying so;
    None before a first start. A record that cannot be read is an error naming the file:
    choosing afresh could change the precision of a run half trained."""
    path = run_record(run_dir)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise _bad_record(path, f"cannot be read: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != RUN_RECORD_FORMAT:
        raise _bad_record(path, f"is not a {RUN_RECORD_FORMAT} record")
    precision, reason = data.get("precision"), data.get("reason")
    if precision not in POLICIES:
        raise _bad_record(path, f"names precision {precision!r}, expected one of {POLICIES}")
    seconds = data.get("seconds_per_update")
    then = str(reason).removeprefix("auto: ") if reason else "recorded"
    return PrecisionChoice(
        precision,
        f"auto: as recorded for this run in {path}, {then}",
        seconds if isinstance(seconds, dict) else {},
    )


def _bad_record(path: Path, problem: str) -> TrainingSetupError:
    return TrainingSetupError(
        f"{path} {problem}; it names the precision this run trains in. Restore it, or "
        "remove it to let precision auto choose again"
    )


def apply_precision(policy: str) -> None:
    """Set the global Keras policy; layers built afterwards compute in it."""
    import tf_keras as keras

    keras.mixed_precision.set_global_policy(policy)


def needs_loss_scaling(policy: str) -> bool:
    """float16 underflows small gradients; bfloat16 has float32's range and does not."""
    return policy == "mixed_float16"
