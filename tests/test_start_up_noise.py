"""The slipway program hides TensorFlow's and Beam's start-up notices, and nothing else."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from slipway.start_up_noise import is_import_warning, is_start_up_noise

NOISE = [
    b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    b"I0000 00:00:1795459007.788397    7274 port.cc:153] oneDNN custom operations are on. "
    b"You may see slightly different numerical results.",
    b"I0000 00:00:1795459007.788943    7274 cudart_stub.cc:31] Could not find cuda drivers on "
    b"your machine, GPU will not be used.",
    b"E0000 00:00:1795459014.398783    7274 cuda_platform.cc:52] failed call to cuInit: "
    b"INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)",
    b"To enable the following instructions: AVX2 AVX512F FMA, in other operations, rebuild "
    b"TensorFlow with the appropriate compiler flags.",
    b"E0000 00:00:1795957177.090663   21577 op_level_cost_estimator.cc:1126] Incompatible "
    b"Matrix dimensions",
]
KEPT = [
    b"E0000 00:00:1795459014.398783    7274 bfc_allocator.cc:485] Allocator ran out of memory",
    b"Traceback (most recent call last):",
    b"error: experiment.yaml:3: training.steps: expected int, got 'abc'",
    b"",
]


@pytest.mark.parametrize("line", NOISE)
def test_known_start_up_lines_are_noise(line: bytes) -> None:
    assert is_start_up_noise(line)
    assert is_start_up_noise(line + b"\n")


@pytest.mark.parametrize("line", KEPT)
def test_everything_else_is_kept(line: bytes) -> None:
    assert not is_start_up_noise(line)


def test_only_the_known_import_warning_is_dropped_from_logging() -> None:
    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord("root", logging.WARNING, __file__, 1, message, None, None)

    assert is_import_warning(
        record(
            "apitools not found, and bigquery client libraries are not available despite "
            "the import not raising an ImportError."
        )
    )
    assert not is_import_warning(record("the dataset has no split 'test'"))


def stderr_of(script: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr
    return result.stderr


@pytest.mark.process
def test_a_quieted_process_keeps_real_messages_and_drops_tensorflows_notices() -> None:
    importing = (
        "import os, sys\n"
        "import tensorflow as tf\n"
        "tf.config.list_physical_devices()\n"
        "os.write(2, b'E0000 00:00:1.2 1 other.cc:1] a real native error\\n')\n"
        "print('a Python message', file=sys.stderr)\n"
    )
    loud = stderr_of(importing)
    quiet = stderr_of(
        "from slipway.start_up_noise import quiet_start_up_noise\n"
        "quiet_start_up_noise()\n" + importing
    )
    assert "a real native error" in quiet and "a Python message" in quiet
    assert not any(is_start_up_noise(line.encode()) for line in quiet.splitlines())
    if not any(is_start_up_noise(line.encode()) for line in loud.splitlines()):
        pytest.skip("this TensorFlow build printed no start-up notices to hide")
