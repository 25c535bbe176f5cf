"""How a shadow version's answer is compared with the answer the client received.

Shadow traffic exists to judge a candidate version on real requests without serving its
answers; the gateway records, per mirrored request, how often the two agree on the top
class and how far apart their numbers are.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


def compare_outputs(
    primary: Mapping[str, np.ndarray], shadow: Mapping[str, np.ndarray]
) -> tuple[float | None, float | None]:
    """(top-1 agreement, mean absolute difference) between two answers to one request.

    Agreement is the fraction of rows whose arg-max matches, over the first output
    with class scores (rank 2, more than one column); the difference averages every
    numeric output both answers share with the same shape. None when not comparable.
    """
    agreement = None
    differences = []
    for name, first in primary.items():
        second = shadow.get(name)
        if second is None or np.shape(first) != np.shape(second):
            continue
        first, second = np.asarray(first), np.asarray(second)
        if first.dtype.kind not in "fiub" or second.dtype.kind not in "fiub" or first.size == 0:
            continue
        if agreement is None and first.ndim == 2 and first.shape[1] > 1:
            agreement = float(np.mean(first.argmax(axis=1) == second.argmax(axis=1)))
        differences.append(np.abs(first.astype(np.float64) - second.astype(np.float64)).mean())
    return agreement, (float(np.mean(differences)) if differences else None)
