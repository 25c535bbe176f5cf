"""Waiting for a condition with a deadline, the one way the tests wait for something to happen.

A test never sleeps for a fixed time to let something happen: it waits for the thing
itself, and fails naming what it waited for when a deadline passes. Deadlines are generous
because a loaded machine is slow, and a condition that holds returns at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

POLL_S = 0.05


def wait_until(
    condition: Callable[[], T], what: str, timeout: float = 30.0, interval: float = POLL_S
) -> T:
    """Return ``condition()``'s first truthy value; AssertionError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)
