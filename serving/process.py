"""Run ``slipway serve`` as a child process on free loopback ports.

Used wherever a real gateway process is wanted next to other work (the demo, rollout
tests, benchmarks): it is started exactly as an operator starts it, and every wait has a
deadline, so a gateway that never becomes ready fails with its output instead of hanging.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

# Loading TensorFlow and warming every model up takes seconds on a quiet machine and
# much longer on a busy one; the bound is for a gateway that hangs.
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0


class GatewayProcessError(RuntimeError):
    """The gateway process did not start, or did not stop, as asked."""


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
        processes: int = 1,
    ) -> None:
        self.model_root = model_root
        self.config = config
        self.processes = processes
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
        if self.processes > 1:
            command += ["--processes", str(self.processes)]
        return command

    def start(self, timeout: float = START_TIMEOUT_S) -> GatewayProcess:
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            self.command(), env=self.env, stdout=self._log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise GatewayProcessError(
                    f"gateway exited with {self.process.returncode} before it was ready:\n"
                    f"{self.output()}"
                )
            if self.http_status("/readyz") == 200:
                return self
            time.sleep(0.1)  # polling a child process: there is nothing to wait on
        self.kill()
        raise GatewayProcessError(f"gateway not ready after {timeout}s:\n{self.output()}")

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
            raise GatewayProcessError(
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
