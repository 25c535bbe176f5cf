"""The TFLite converter's own output goes to a log file; the user reads one line.

The converter talks from C++ straight to file descriptors 1 and 2 (``fully_quantize: 0,
inference_type: 6, …`` at every int8 calibration), and when it refuses a model its
exception carries the whole MLIR diagnostic: thousands of characters of call-site
locations before the sentence that matters. A compression run names a log file
(:func:`logging_to`); while it is set, every conversion writes its native output there,
and a refusal is appended in full while the error the user sees is its gist and the
log's path. Without a log file native output is left alone.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path

_LOG: ContextVar[Path | None] = ContextVar("converter_log", default=None)

# "error: 'tf.StridedSlice' op is neither a custom op nor a flex op", after its location.
_MLIR_ERROR = re.compile(r"error: (?!failed while converting)([^\n]+)")
_LONGEST_GIST = 300


@contextlib.contextmanager
def logging_to(path: str | Path) -> Iterator[Path]:
    """Send the converter's output of every conversion inside the block to ``path``,
    started afresh and written only once there is something to write (a run refused
    before its first conversion leaves no file behind)."""
    log = Path(path)
    log.unlink(missing_ok=True)
    token = _LOG.set(log)
    try:
        yield log
    finally:
        _LOG.reset(token)


@contextlib.contextmanager
def native_output_captured() -> Iterator[None]:
    """Descriptors 1 and 2 point at the log for the block, when a log is set."""
    log = _LOG.get()
    if log is None:
        yield
        return
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    log.parent.mkdir(parents=True, exist_ok=True)
    saved = [os.dup(1), os.dup(2)]
    target = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.dup2(target, 1)
        os.dup2(target, 2)
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for descriptor in (*saved, target):
            os.close(descriptor)


def refusal(message: str) -> str:
    """What the user reads of a converter error: its gist, and where the rest is.

    The full message goes to the log when one is set."""
    log = _LOG.get()
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a", encoding="utf-8") as out:
            out.write(f"\nTFLite conversion failed:\n{message}\n")
    found = _MLIR_ERROR.search(message)
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    gist = found.group(1).strip() if found else (lines[-1] if lines else "no message")
    if len(gist) > _LONGEST_GIST:
        gist = gist[:_LONGEST_GIST] + "…"
    return gist + (f" (the converter's full message: {log})" if log is not None else "")
