"""Process-wide state a test may change, put back after every test.

Training sets Keras' global mixed-precision policy for the layers it builds (that is what a
training process wants), and a test calling the trainer in-process leaves it set. Tests run
in any order and on any pytest-xdist worker, so the next test in the same process must not
build bfloat16 layers because of it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def keras_global_policy_restored() -> Iterator[None]:
    """The global Keras dtype policy as it was before the test (only once Keras is loaded)."""
    keras = sys.modules.get("tf_keras")
    before = keras.mixed_precision.global_policy() if keras is not None else None
    yield
    keras = sys.modules.get("tf_keras")
    if keras is None:
        return
    if before is None:
        before = keras.mixed_precision.Policy("float32")
    if keras.mixed_precision.global_policy().name != before.name:
        keras.mixed_precision.set_global_policy(before)
