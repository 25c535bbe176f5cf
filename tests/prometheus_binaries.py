"""Where the tests find Prometheus and promtool, and how they skip without them.

The rollout and deploy-asset tests run Debian's real ``prometheus`` package. Without it
they skip with one reason, which the suite's closing summary counts and explains.
"""

from __future__ import annotations

import shutil

import pytest

MISSING = "Prometheus is not installed"
INSTALL_HINT = "`make prometheus` (Debian's package 'prometheus')"


def binary(name: str) -> str:
    """The path of ``prometheus`` or ``promtool``; skips the calling test when absent."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{MISSING}: no {name} on PATH; install with {INSTALL_HINT}")
    return path
