"""Keep TensorFlow's start-up chatter off the terminal, and nothing else.

Importing TensorFlow prints lines from its C++ runtime straight to file descriptor 2,
before its logging is configured, so ``TF_CPP_MIN_LOG_LEVEL`` cannot silence them:
oneDNN notices, "Could not find cuda drivers", and on a machine without a GPU an alarming
``E0000 … failed call to cuInit: UNKNOWN ERROR (303)``. None of it is actionable for a
user of a CPU machine, and it buries the one line a command has to say.

The filter routes descriptor 2 through a pipe and drops exactly those known start-up
lines; everything else (Python tracebacks, real C++ errors, worker output) passes through
unchanged. ``--verbose`` leaves descriptor 2 alone.
"""

from __future__ import annotations

import atexit
import io
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
    rb"|cuda_dnn\.cc|cuda_fft\.cc|cuda_blas\.cc|computation_placer\.cc)"
    rb":\d+\] .*"
    rb"|To enable the following instructions: .*, in other operations, rebuild TensorFlow .*"
    rb")\r?\n?$"
)


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


def filter_start_up_noise() -> StartUpNoiseFilter | None:
    """Install the filter when descriptor 2 exists; a no-op where it cannot be redirected."""
    try:
        return StartUpNoiseFilter()
    except OSError:
        return None
