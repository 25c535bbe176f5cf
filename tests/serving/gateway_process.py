"""Run a gateway for tests on free loopback ports: as a real ``python -m slipway serve``
process, or on a thread of the test process.

The process is started exactly as an operator would start it, so signals, exit codes and
the command line are exercised too. The thread runs the same ``GatewayServer`` behind the
same sockets without paying for a second TensorFlow start-up, and lets a test look at the
gateway's state. Every wait has a deadline: a gateway that never becomes ready fails the
test with its output instead of hanging it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from serving.config import GatewayConfig
from serving.core import Gateway
from serving.server import GatewayServer

T = TypeVar("T")

REPO_ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 45.0
STOP_TIMEOUT_S = 30.0


def free_port() -> int:
    """A port nothing listens on right now (the gateway binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class GatewayProcess:
    """``slipway serve`` in a child process; use as a context manager."""

    def __init__(
        self,
        model_root: Path,
        *,
        config: Path | None = None,
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
    ) -> None:
        self.model_root = model_root
        self.config = config
        self.grpc_port = free_port()
        self.rest_port = free_port()
        self.env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
        self.log_path = log_path or model_root.parent / f"gateway-{self.rest_port}.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def rest_url(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    def command(self) -> list[str]:
        command = [
            sys.executable, "-m", "slipway", "serve",
            "--model-root", str(self.model_root),
            "--host", "127.0.0.1",
            "--grpc-port", str(self.grpc_port),
            "--rest-port", str(self.rest_port),
        ]  # fmt: skip
        if self.config is not None:
            command += ["--config", str(self.config)]
        return command

    def start(self, timeout: float = START_TIMEOUT_S) -> GatewayProcess:
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            self.command(), cwd=REPO_ROOT, env=self.env, stdout=self._log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(
                    f"gateway exited with {self.process.returncode} before it was ready:\n"
                    f"{self.output()}"
                )
            if self.http_status("/readyz") == 200:
                return self
            time.sleep(0.1)  # polling a child process: there is nothing to wait on
        self.kill()
        raise AssertionError(f"gateway not ready after {timeout}s:\n{self.output()}")

    def http_status(self, path: str) -> int | None:
        try:
            with urllib.request.urlopen(self.rest_url + path, timeout=2) as response:
                return response.status
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError:
            return None

    def terminate(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)

    def wait(self, timeout: float = STOP_TIMEOUT_S) -> int:
        assert self.process is not None
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"gateway did not exit within {timeout}s:\n{self.output()}"
            ) from None

    def stop(self) -> int:
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        self.terminate()
        return self.wait()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(STOP_TIMEOUT_S)

    def output(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-8000:]

    def __enter__(self) -> GatewayProcess:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        try:
            self.stop()
        finally:
            self.kill()
            self._log.close()


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

    def start(self, timeout: float = START_TIMEOUT_S) -> GatewayThread:
        self._thread.start()
        self.run(self.server.start(), timeout)
        deadline = time.monotonic() + timeout
        while not self.gateway.health.ready:
            if time.monotonic() > deadline:
                raise AssertionError(f"gateway not ready after {timeout}s")
            time.sleep(0.05)  # readiness is set on another thread; poll it
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
