"""Keep TensorFlow's and Beam's start-up chatter off the terminal, and nothing else.

Importing TensorFlow prints lines from its C++ runtime straight to file descriptor 2,
before its logging is configured, so ``TF_CPP_MIN_LOG_LEVEL`` cannot silence them:
oneDNN notices, "Could not find cuda drivers", and on a machine without a GPU an alarming
``E0000 … failed call to cuInit: UNKNOWN ERROR (303)``. None of it is actionable for a
user of a CPU machine, and it buries the one line a command has to say.

Training on a mesh adds one more: grappler's cost model logging ``E0000 …
op_level_cost_estimator.cc … Incompatible Matrix dimensions`` for sharded matmuls it cannot
price, which says nothing about the result.

The filter routes descriptor 2 through a pipe and drops exactly those known lines;
everything else (Python tracebacks, real C++ errors, worker output) passes through
unchanged. Apache Beam's import likewise logs a warning about optional Google Cloud
client libraries that a local build never uses; a logging filter drops that one message.
``--verbose`` leaves both alone.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import logging
import os
import re
import sys
import threading

# Start-up notices of TensorFlow's native runtime that say nothing about the user's work.
START_UP_NOISE = re.compile(
    rb"^(?:"
    rb"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    rb"|[IWE]\d{4} [\d:. ]+\d+ (?:port\.cc|cudart_stub\.cc|cpu_feature_guard\.cc"
    rb"|cuda_platform\.cc|cuda_executor\.cc|cuda_diagnostics\.cc|gpu_device\.cc"
    rb"|cuda_dnn\.cc|cuda_fft\.cc|cuda_blas\.cc|computation_placer\.cc"
    # Grappler's cost model, estimating ops it cannot price while it plans a graph (a
    # mesh's sharded matmuls): an estimate, never the computation.
    rb"|op_level_cost_estimator\.cc)"
    rb":\d+\] .*"
    rb"|To enable the following instructions: .*, in other operations, rebuild TensorFlow .*"
    rb")\r?\n?$"
)


# Python-level warnings logged while packages import, with nothing for the user to do.
IMPORT_WARNINGS = ("apitools not found, and bigquery client libraries are not available",)


def is_start_up_noise(line: bytes) -> bool:
    """Whether one line of native output is a known TensorFlow start-up notice."""
    return START_UP_NOISE.match(line) is not None


class StartUpNoiseFilter:
    """Descriptor 2 through a pipe; a thread forwards every line that is not noise.

    Python's own ``sys.stderr`` is pointed at the original descriptor directly, so
    tracebacks and messages never wait on the thread.
    """

    def __init__(self) -> None:
        self._original = os.dup(2)
        reader, writer = os.pipe()
        os.dup2(writer, 2)
        os.close(writer)
        self._reader = reader
        sys.stderr.flush()
        sys.stderr = io.TextIOWrapper(
            os.fdopen(os.dup(self._original), "wb", buffering=0),
            encoding=sys.stderr.encoding or "utf-8",
            errors="backslashreplace",
            line_buffering=True,
        )
        self._thread = threading.Thread(target=self._forward, name="native-stderr", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def _forward(self) -> None:
        with os.fdopen(self._reader, "rb", buffering=0) as pipe:
            pending = b""
            while chunk := pipe.read(65536):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                self._write(b"".join(line + b"\n" for line in lines if not is_start_up_noise(line)))
            if pending and not is_start_up_noise(pending):
                self._write(pending)

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.write(self._original, view)
            view = view[written:]

    def close(self) -> None:
        """Give descriptor 2 back and let the thread forward what is still in the pipe."""
        if self._thread is None:
            return
        os.dup2(self._original, 2)  # closes the pipe's last writer: the thread sees EOF
        self._thread.join(timeout=5)
        self._thread = None


def is_import_warning(record: logging.LogRecord) -> bool:
    """Whether a log record is one of the known, harmless import-time warnings."""
    message = record.getMessage()
    return any(message.startswith(known) for known in IMPORT_WARNINGS)


def quiet_start_up_noise() -> None:
    """Filter native start-up lines on descriptor 2 and known import-time log warnings.

    For a program's entry point: it takes over descriptor 2 for the life of the process.
    The descriptor filter is skipped where descriptor 2 cannot be redirected.
    """
    logging.getLogger().addFilter(lambda record: not is_import_warning(record))
    with contextlib.suppress(OSError):
        StartUpNoiseFilter()
