"""Metric values as files and screens can hold them, non-finite ones included.

A held-out loss can be infinite (one absurd label squared overflows float32) or NaN
while the model itself is fine. JSON has no such numbers, so a metric that is not
finite is written as ``null`` and named, with what it was, under ``non_finite``: a
reader can tell "not measured" from "measured, and not a number".
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any

NON_FINITE = "non_finite"


def non_finite(value: Any) -> str | None:
    """``"inf"``, ``"-inf"`` or ``"nan"`` for a float that is not finite; else None."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return None


def json_metrics(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """``metrics`` (nested by split) with non-finite numbers as ``null`` and listed, by
    dotted name, under ``non_finite``."""
    found: dict[str, str] = dict(metrics.get(NON_FINITE) or {})

    def clean(values: Mapping[str, Any], prefix: str) -> dict[str, Any]:
        cleaned: dict[str, Any] = {}
        for key, value in values.items():
            if prefix == "" and key == NON_FINITE:
                continue
            if isinstance(value, Mapping):
                cleaned[key] = clean(value, f"{prefix}{key}.")
            elif (name := non_finite(value)) is not None:
                found[f"{prefix}{key}"] = name
                cleaned[key] = None
            else:
                cleaned[key] = value
        return cleaned

    result = clean(metrics, "")
    if found:
        result[NON_FINITE] = found
    return result


def from_json_metrics(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """``json_metrics`` undone: each listed ``null`` is its non-finite number again."""
    restored = copy.deepcopy({key: value for key, value in metrics.items() if key != NON_FINITE})
    for dotted, name in (metrics.get(NON_FINITE) or {}).items():
        *parents, key = dotted.split(".")
        values = restored
        for parent in parents:
            values = values.setdefault(parent, {})
        values[key] = float(name)
    return restored


def shown(value: Any) -> str:
    """A metric for a person: four significant digits, or what a non-finite one is."""
    name = non_finite(value)
    if name is not None:
        return f"{name} (not finite)"
    return f"{value:.4g}" if isinstance(value, int | float) else str(value)
