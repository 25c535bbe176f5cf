"""The ``slipway`` command run in the test's own process.

A test of what a command does, not of the process boundary, calls the CLI's ``main`` here:
it shares the test's already-imported TensorFlow instead of spending seconds importing it
again in a child process, and its output is captured by ``capsys``.
"""

from __future__ import annotations

from pathlib import Path

from slipway.cli import main


def slipway(*argv: str | Path) -> int:
    """Run ``slipway ARGV...`` in this process and return its exit code."""
    return main([str(arg) for arg in argv])
