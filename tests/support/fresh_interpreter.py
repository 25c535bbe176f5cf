"""A Python snippet run in a fresh interpreter: the only way to see what an import loads.

The test's own process has imported everything already, so questions such as "does this
module load TensorFlow?" are asked of a new interpreter started from the repository.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]


def run_python(
    script: str, *, environment: Mapping[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``python -c SCRIPT`` from the repository, its output captured; not checked."""
    return subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPOSITORY,
        env=dict(os.environ if environment is None else environment),
        check=False,
    )
