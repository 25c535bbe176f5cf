"""Short garbage-collector pauses in a long-running server.

A gateway holds hundreds of thousands of long-lived objects (TensorFlow, the loaded
models). CPython's full (generation 2) collection scans all of them whenever enough new
objects have survived: 100-600 ms here, during which the event loop answers nothing,
so every request in flight waits, and that pause is the 99th percentile latency.
``gc.freeze()`` moves the objects that exist into a permanent generation that later
collections skip, so they scan only what came since. Frozen objects are never
collected, so after a version is unloaded the heap is collected in full once and frozen
again (``reclaim``), freeing the unloaded model's reference cycles.

The heap is the process's, not the gateway's: ``slipway serve`` (and each worker of its
pool) takes charge of it with ``manage``. A gateway embedded in another program (a
notebook, a test run, a server of the user's own) leaves that program's collector as it
found it: freezing there would keep whatever the program had dropped alive for good,
and each full collection would scan everything it ever built.
"""

from __future__ import annotations

import gc

_managed = False


def manage() -> None:
    """Let the gateways of this process freeze and reclaim its heap (``slipway serve``)."""
    global _managed
    _managed = True


def freeze_loaded() -> None:
    """After a version loaded: collect the young generations (the loading's own
    garbage), then freeze everything that is left, the new model included."""
    if _managed:
        gc.collect(1)
        gc.freeze()


def reclaim() -> None:
    """After a version unloaded (and at start-up): one full collection over every
    object, frozen ones included, then freeze the survivors again."""
    if _managed:
        gc.unfreeze()
        gc.collect()
        gc.freeze()
