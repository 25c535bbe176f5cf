"""Post-training int8 that keeps accuracy: try full int8, fall back per model, say why.

Full int8 is the smallest and, where LiteRT has int8 kernels for every op, the fastest
result; but one scale per activation tensor does not suit every model. A Transformer's
attention adds −1e9 to masked scores before its softmax, which leaves the real scores
a single int8 value (:mod:`compression.tflite_graph`), and layer norms computed in int8
run on reference kernels outside XNNPACK. So the int8 method tries quantization schemes
in order of how much they quantize and judges each against the float32 TFLite
conversion on the *validation* split (the test split stays for the report):

1. ``full``: every op int8;
2. ``attention_float``: selective quantization keeping the attention score paths
   (scores, mask, softmax, the value product) float;
3. ``attention_norm_float``: those and the whole layer norms float (statistics and
   scale-and-shift arithmetic, so no quantize/dequantize pair sits inside a norm);
4. ``feature_mix_float``: where a concatenation joins encodings of different inputs
   (pooled text beside standardized numbers), those encoders, the concatenation and
   the layer reading it float, since int8 would give the whole joined vector one scale;
5. ``16x8``: int16 activations with int8 weights.

Full int8 is kept when it passes the quality gate and is not slower than float32.
Otherwise every scheme is measured and the fastest one passing the gate wins (none
passing: the most accurate, which the report's gate then marks failed).

Weights are quantized per output channel by default, at a scale and an int64 zero
point per channel. The chosen scheme is then converted once more with one scale per
weight tensor, and that conversion is kept when it passes the gate too: it runs the
same ops and, in a small model, the per-channel parameters are a tenth of the file.
The trials, their figures and the reason for the choice are recorded in the result's
details.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tensorflow as tf
import tf_keras as keras

from compression.convert import to_tflite
from compression.errors import CompressionError
from compression.evaluate import EvalData, EvalSettings, evaluate_tflite_models
from compression.ptq import check_samples, io_types
from compression.quality_gate import QualityGate, accuracy_drops, error_increases
from compression.result import CompressedModel
from compression.tflite_graph import (
    attention_score_tensors,
    feature_mix_tensors,
    layer_names,
    layer_norm_tensors,
    op_counts,
)

FLOAT32 = "float32"


@dataclass(frozen=True)
class Scheme:
    """One way of quantizing: a name, what stays float, and the converter arguments."""

    name: str
    description: str
    arguments: Mapping[str, Any] = field(default_factory=dict)
    why: str = ""  # why what it keeps float cannot be int8

    def float_layers(self) -> list[str]:
        """The Keras layers this scheme keeps (partly) float."""
        return layer_names(self.arguments.get("float_tensors", ()))


@dataclass(frozen=True)
class Judge:
    """What candidates are judged on: held-out data, the float32 file, the gate."""

    data: EvalData
    float_tflite: bytes
    gate: QualityGate
    settings: EvalSettings = field(
        default_factory=lambda: EvalSettings(
            latency_runs=100, warmup_runs=10, throughput_seconds=0.0
        )
    )


@dataclass
class Trial:
    """A scheme's conversion and how it fared against float32 on the judge's data."""

    scheme: Scheme
    per_tensor: bool = False  # one weight scale per tensor rather than per output channel
    tflite: bytes | None = None
    accuracy_drop: float | None = None  # worst head, points; None: no classification head
    error_increase: float | None = None  # worst head's MAE, percent; None: no regression head
    latency_p50_ms: float | None = None
    speedup: float | None = None  # float32 p50 over this p50
    error: str | None = None  # why the scheme could not be converted

    def passes(self, gate: QualityGate) -> bool:
        return self.tflite is not None and gate.passes(self.accuracy_drop, self.error_increase)

    def loss(self) -> tuple[float, float]:
        """What the scheme lost, for choosing among failures: accuracy, then error."""
        return self.accuracy_drop or 0.0, self.error_increase or 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "scheme": self.scheme.name,
            "float": self.scheme.description,
            "weight_scales": _weight_scales(self.per_tensor),
            "validation_accuracy_drop": self.accuracy_drop,
            "validation_mae_increase_percent": self.error_increase,
            "latency_p50_ms": self.latency_p50_ms,
            "speedup_vs_float32": self.speedup,
            # As converted: the pipeline strips only the result it keeps.
            "converter_bytes": None if self.tflite is None else len(self.tflite),
            "error": self.error,
        }


def schemes(float_tflite: bytes) -> list[Scheme]:
    """The schemes worth trying for this model, most quantized first."""
    attention = attention_score_tensors(float_tflite)
    found = [Scheme("full", "nothing", {"integer_only": True})]
    masked_scores = (
        "masked attention scores span the −1e9 of the mask and the real scores, which one "
        "int8 scale would make a single value"
    )
    if attention:
        norms = layer_norm_tensors(float_tflite)
        found += [
            Scheme(
                "attention_float",
                f"the attention score paths ({len(attention)} tensors)",
                {"float_tensors": attention},
                masked_scores,
            ),
            Scheme(
                "attention_norm_float",
                f"the attention score paths ({len(attention)} tensors) and layer norms "
                f"({len(norms)} tensors)",
                {"float_tensors": attention + norms},
                f"{masked_scores}; layer norms run on reference kernels in int8",
            ),
        ]
    mixed = feature_mix_tensors(float_tflite)
    if mixed:
        found.append(
            Scheme(
                "feature_mix_float",
                f"the input encoders, their concatenation and its reader ({len(mixed)} tensors)",
                {"float_tensors": mixed},
                "a concatenation gives every input joined in it one int8 scale, set by the "
                "widest range, which leaves narrow encodings few levels",
            )
        )
    found.append(Scheme("16x8", "nothing; activations int16, weights int8",
                        {"int16_activations": True}))  # fmt: skip
    return found


def _worst(values: dict[str, float]) -> float | None:
    return max(values.values()) if values else None


def _weight_scales(per_tensor: bool) -> str:
    return "per tensor" if per_tensor else "per channel"


def _convert(
    model: keras.Model,
    samples: Sequence[dict[str, np.ndarray]],
    scheme: Scheme,
    per_tensor: bool = False,
) -> Trial:
    try:
        flatbuffer = to_tflite(
            model,
            optimizations=[tf.lite.Optimize.DEFAULT],
            representative_dataset=lambda: iter(samples),
            per_tensor=per_tensor,
            **scheme.arguments,
        )
    except CompressionError as exc:  # e.g. 16x8 has no kernel for integer token inputs
        return Trial(scheme, per_tensor, error=str(exc).splitlines()[-1])
    return Trial(scheme, per_tensor, flatbuffer)


def _measure(trials: Sequence[Trial], judge: Judge) -> None:
    """Accuracy and latency of the converted trials, side by side with float32."""
    converted = {trial.scheme.name: trial for trial in trials if trial.tflite is not None}
    if not converted:
        return
    evaluations = evaluate_tflite_models(
        {FLOAT32: judge.float_tflite, **{n: t.tflite for n, t in converted.items()}},
        judge.data,
        reference=FLOAT32,
        settings=judge.settings,
    )
    reference = evaluations[FLOAT32]
    for name, trial in converted.items():
        evaluation = evaluations[name]
        trial.accuracy_drop = _worst(accuracy_drops(reference, evaluation))
        trial.error_increase = _worst(error_increases(reference, evaluation))
        trial.latency_p50_ms = evaluation.latency_p50_ms
        trial.speedup = reference.latency_p50_ms / evaluation.latency_p50_ms


def _pick(trials: Sequence[Trial], gate: QualityGate) -> tuple[Trial, str]:
    passing = [trial for trial in trials if trial.passes(gate)]
    if passing:
        best = min(passing, key=lambda trial: trial.latency_p50_ms or 0.0)
        return best, (
            f"{best.scheme.name}: the fastest scheme within the quality gate of float32 "
            f"on the validation split ({_figures(best)})"
        )
    converted = [trial for trial in trials if trial.tflite is not None]
    if not converted:
        raise CompressionError(
            "no int8 scheme could be converted: "
            + "; ".join(f"{t.scheme.name}: {t.error}" for t in trials)
        )
    best = min(converted, key=Trial.loss)
    return best, (
        f"{best.scheme.name}: no scheme kept within the quality gate of float32; "
        f"this one lost least ({_figures(best)})"
    )


def _figures(trial: Trial) -> str:
    figures = []
    if trial.accuracy_drop is not None:
        figures.append(f"{round(-trial.accuracy_drop, 2) + 0.0:+.2f} pts")
    if trial.error_increase is not None:
        figures.append(f"MAE {round(trial.error_increase, 2) + 0.0:+.2f} %")
    if trial.speedup is not None:
        figures.append(f"{trial.speedup:.2f}× float32's speed")
    return ", ".join(figures) or "no figures"


def _per_tensor_if_it_passes(
    model: keras.Model,
    samples: Sequence[dict[str, np.ndarray]],
    judge: Judge,
    chosen: Trial,
    trials: list[Trial],
) -> tuple[Trial, str]:
    """The chosen scheme with one scale per weight tensor if that keeps the gate, and why.

    The same ops run either way, so only the gate's figures tell them apart; the per-tensor
    file is the smaller one. The extra trial is appended to ``trials``.
    """
    if not chosen.passes(judge.gate):
        return chosen, "per-channel weight scales (the scheme fails the gate already)"
    candidate = _convert(model, samples, chosen.scheme, per_tensor=True)
    _measure([candidate], judge)
    trials.append(candidate)
    if candidate.passes(judge.gate):
        return candidate, f"per-tensor weight scales also pass ({_figures(candidate)})"
    why = candidate.error or _figures(candidate)
    return chosen, f"per-channel weight scales (per tensor fails: {why})"


def choose_int8(
    model: keras.Model, samples: Sequence[dict[str, np.ndarray]], judge: Judge
) -> CompressedModel:
    """The int8 result that keeps accuracy, with the trials behind the choice."""
    check_samples(model, samples)
    candidates = schemes(judge.float_tflite)
    trials = [_convert(model, samples, candidates[0])]
    _measure(trials, judge)
    full = trials[0]
    if full.passes(judge.gate) and (full.speedup or 0.0) >= 1.0:
        chosen, reason = (
            full,
            (
                f"full: passes the gate on the validation split and is not slower than float32 "
                f"({_figures(full)})"
            ),
        )
    else:
        trials += [_convert(model, samples, scheme) for scheme in candidates[1:]]
        _measure(trials, judge)
        chosen, reason = _pick(trials, judge.gate)
    chosen, granularity = _per_tensor_if_it_passes(model, samples, judge, chosen, trials)
    assert chosen.tflite is not None
    float_layers = chosen.scheme.float_layers()
    kept_float = (
        f"; float layers: {', '.join(float_layers)} ({chosen.scheme.why})" if float_layers else ""
    )
    details: dict[str, Any] = {
        "weights": "int8",
        "activations": "int16" if chosen.scheme.name == "16x8" else "int8",
        "scheme": chosen.scheme.name,
        "float": chosen.scheme.description,
        "float_layers": float_layers,
        "weight_scales": _weight_scales(chosen.per_tensor),
        "reason": f"{reason}; {granularity}{kept_float}",
        "trials": [trial.to_json() for trial in trials],
        "validation_split": judge.data.split,
        "calibration_samples": len(samples),
        "ops": op_counts(chosen.tflite),
        **io_types(chosen.tflite),
    }
    return CompressedModel("int8", chosen.tflite, None, details)
