"""Short garbage-collector pauses in a long-running server.

A gateway holds hundreds of thousands of long-lived objects (TensorFlow, the loaded
models). CPython's full (generation 2) collection scans all of them whenever enough new
objects have survived: 100-600 ms here, during which the event loop answers nothing,
so every request in flight waits, and that pause is the 99th percentile latency.
``gc.freeze()`` moves the objects that exist into a permanent generation that later
collections skip, so they scan only what came since. Frozen objects are never
collected, so after a version is unloaded the heap is collected in full once and frozen
again (``reclaim``), freeing the unloaded model's reference cycles.
"""

from __future__ import annotations

import gc


def freeze_loaded() -> None:
    """After a version loaded: collect the young generations (the loading's own
    garbage), then freeze everything that is left, the new model included."""
    gc.collect(1)
    gc.freeze()


def reclaim() -> None:
    """After a version unloaded (and at start-up): one full collection over every
    object, frozen ones included, then freeze the survivors again."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
