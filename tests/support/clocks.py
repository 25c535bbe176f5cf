"""A clock the test moves by hand, for code that takes its time source as an argument.

Deadlines, scrape windows and checkpoint intervals are tested at exact instants this
way, without sleeping and without a test depending on how fast the machine is.
"""

from __future__ import annotations

START = 1_000.0


class FakeClock:
    """A ``time.monotonic``-like callable returning ``now``, which the test sets or advances."""

    def __init__(self, now: float = START) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
