"""Run a TFLite (LiteRT) model in this process.

An interpreter holds its tensors between ``resize``, ``set`` and ``invoke`` and must
never be used by two threads at once, so each thread calling ``run`` gets its own
interpreter over the same model bytes (read once). The batch dimension is resized to
each request's batch before running.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np

from serving.backends.base import check_deadline, find_signature, model_failure
from serving.errors import InvalidArgument, Unavailable
from serving.model_files import TFLITE_FILE
from serving.signature import Signature, TensorSpec


class TFLiteBackend:
    """A ``.tflite`` flatbuffer run through its signature runners, one interpreter per thread."""

    def __init__(self, path: str | Path, num_threads: int = 1) -> None:
        from ai_edge_litert.interpreter import Interpreter

        model_path = Path(path)
        if model_path.is_dir():
            model_path = model_path / TFLITE_FILE
        self.path = model_path
        self._interpreter_class = Interpreter
        self._content = model_path.read_bytes()
        self._num_threads = max(1, int(num_threads))
        self._lock = threading.Lock()
        self._runners: dict[int, dict[str, Any]] = {}
        self._closed = False
        probe = self._thread_runners()
        if not probe:
            raise InvalidArgument(f"{model_path}: the model has no signatures to serve")
        self.signatures: dict[str, Signature] = {
            key: Signature(
                key,
                _specs(runner.get_input_details()),
                _specs(runner.get_output_details()),
            )
            for key, runner in probe.items()
        }

    def _thread_runners(self) -> dict[str, Any]:
        """This thread's signature runners, creating its interpreter on first use.

        Keyed by thread id: a dead thread's id may be reused by a new thread, which
        then inherits an interpreter nobody else can be using.
        """
        ident = threading.get_ident()
        runners = self._runners.get(ident)
        if runners is None:
            interpreter = self._interpreter_class(
                model_content=self._content, num_threads=self._num_threads
            )
            runners = {
                key: interpreter.get_signature_runner(key)
                for key in interpreter.get_signature_list()
            }
            with self._lock:
                if self._closed:
                    raise Unavailable(f"{self.path}: the model has been unloaded")
                self._runners[ident] = runners
        return runners

    def run(
        self, signature_name: str, inputs: dict[str, np.ndarray], timeout: float | None = None
    ) -> dict[str, np.ndarray]:
        if self._closed:
            raise Unavailable(f"{self.path}: the model has been unloaded")
        signature = find_signature(self.signatures, signature_name)
        check_deadline(timeout)
        missing = [name for name in signature.inputs if name not in inputs]
        if missing:
            raise InvalidArgument(f"signature {signature_name!r}: missing input {missing[0]!r}")
        runner = self._thread_runners()[signature_name]
        feed = {
            name: np.ascontiguousarray(inputs[name], dtype=spec.dtype)
            for name, spec in signature.inputs.items()
        }
        try:
            return dict(runner(**feed))
        except Exception as exc:
            raise model_failure(exc, feed) from exc

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._runners.clear()


def _specs(details: dict[str, dict[str, Any]]) -> dict[str, TensorSpec]:
    specs = {}
    for name, detail in details.items():
        dims = detail.get("shape_signature")
        if dims is None or len(dims) != len(detail["shape"]):
            dims = detail["shape"]
        specs[name] = TensorSpec(
            name, np.dtype(detail["dtype"]), tuple(int(d) for d in dims), detail.get("name", "")
        )
    return specs
