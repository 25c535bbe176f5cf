"""A gateway on a thread of the test process, on free loopback ports.

The thread runs the same ``GatewayServer`` behind the same sockets as ``slipway serve``
without paying for a second TensorFlow start-up, and lets a test look at the gateway's
state, so tests using it belong to the fast tier. A test about the process itself
(signals, exit codes, the command line) uses ``serving.process.GatewayProcess`` and is in
the process tier. Every wait has a deadline: a gateway that never becomes ready fails the
test instead of hanging it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from serving.config import GatewayConfig
from serving.gateway import Gateway
from serving.process import START_TIMEOUT_S, STOP_TIMEOUT_S
from serving.server import GatewayServer
from tests.support.waiting import wait_until

T = TypeVar("T")


class GatewayThread:
    """A ``GatewayServer`` on its own event loop thread; use as a context manager."""

    def __init__(self, model_root: Path, config: GatewayConfig | None = None) -> None:
        self.server = GatewayServer(
            model_root, config or GatewayConfig(), host="127.0.0.1", grpc_port=0, rest_port=0
        )
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    @property
    def gateway(self) -> Gateway:
        assert self.server.gateway is not None
        return self.server.gateway

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.server.grpc_port}"

    @property
    def rest_url(self) -> str:
        scheme = "https" if self.server.config.tls else "http"
        return f"{scheme}://127.0.0.1:{self.server.rest_port}"

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        """Run a coroutine on the gateway's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def metric(self, name: str, labels: dict[str, str]) -> float:
        """One sample of the gateway's metrics registry, 0 while the series does not exist."""
        return self.gateway.metrics.registry.get_sample_value(name, labels) or 0.0

    def start(self, timeout: float = START_TIMEOUT_S) -> GatewayThread:
        self._thread.start()
        self.run(self.server.start(), timeout)
        # Readiness is set on the gateway's own thread.
        wait_until(lambda: self.gateway.health.ready, "the gateway to be ready", timeout)
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            try:
                if self.server.gateway is not None:
                    self.run(self.server.shutdown(), STOP_TIMEOUT_S)
            finally:
                self.loop.call_soon_threadsafe(self.loop.stop)
                self._thread.join(STOP_TIMEOUT_S)
                self.loop.close()

    def __enter__(self) -> GatewayThread:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
