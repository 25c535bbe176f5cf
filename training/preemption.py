"""Turning SIGTERM/SIGINT into "save at the next step boundary, then exit".

A scheduler that preempts a worker sends SIGTERM and waits a grace period; the trainer
must not die mid-update, so the signal only raises a flag that the loop checks between
executions (and shares with the other workers, so they all save at the same step).
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

EXIT_PREEMPTED = 143  # 128 + SIGTERM: schedulers (Kubeflow's ExitCode policy) retry it


class PreemptionFlag:
    def __init__(self) -> None:
        self._event = threading.Event()
        self.signal_name: str | None = None
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self.signal_name = signal.Signals(signum).name
        self._event.set()

    def install(self) -> PreemptionFlag:
        """Catch SIGTERM and SIGINT (main thread only, as Python requires)."""
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def uninstall(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
