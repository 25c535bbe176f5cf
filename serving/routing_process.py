"""Run ``slipway routing serve`` as a child process on a free loopback port.

For tests, benchmarks and local fleets that want a real routing source next to real
gateway processes. As with ``serving.process``, every wait has a deadline and a source
that never answers fails with its output.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from serving.process import STOP_TIMEOUT_S, free_port
from serving.routing_cli import DEFAULT_TOKEN_ENV

START_TIMEOUT_S = 30.0


class RoutingSourceError(RuntimeError):
    """The routing source process did not start, or did not stop, as asked."""


class RoutingSourceProcess:
    """The routing source in a child process; use as a context manager.

    ``port`` is kept across ``stop``/``start``, so gateways configured with ``url``
    reconnect to a restarted source by themselves.
    """

    def __init__(self, state: Path, token: str, *, seed: Path | None = None) -> None:
        self.state = state
        self.seed = seed
        self.port = free_port()
        self.env = {**os.environ, DEFAULT_TOKEN_ENV: token}
        self.log_path = state.parent / f"routing-source-{self.port}.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        command = [
            sys.executable, "-m", "slipway", "routing", "serve",
            "--state", str(self.state), "--host", "127.0.0.1", "--port", str(self.port),
        ]  # fmt: skip
        if self.seed is not None:
            command += ["--seed", str(self.seed)]
        return command

    def start(self, timeout: float = START_TIMEOUT_S) -> RoutingSourceProcess:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.command(), env=self.env, stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RoutingSourceError(
                    f"routing source exited with {self.process.returncode}:\n{self.output()}"
                )
            if self._healthy():
                return self
            time.sleep(0.05)  # polling a child process: there is nothing to wait on
        self.kill()
        raise RoutingSourceError(f"routing source not up after {timeout}s:\n{self.output()}")

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM, then wait; the exit code (0 for a graceful stop)."""
        if self.process is None or self.process.poll() is not None:
            return 0 if self.process is None else self.process.returncode
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RoutingSourceError(
                f"routing source did not exit within {timeout}s:\n{self.output()}"
            ) from None

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(STOP_TIMEOUT_S)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")[-8000:]

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/healthz", timeout=2) as answer:
                return answer.status == 200
        except OSError:
            return False

    def __enter__(self) -> RoutingSourceProcess:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        try:
            self.stop()
        finally:
            self.kill()


def write_replica_config(directory: Path, source_url: str, *, watch_s: float = 30.0) -> Path:
    """A gateway.yaml for one replica watching ``source_url``, with its own routing cache
    beside it and the admin token from ``$SLIPWAY_ADMIN_TOKEN`` (the source's too)."""
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "routing_source": {"url": source_url, "cache_file": "routing-cache.json",
                           "watch_s": watch_s},
        "version_policy": {"kind": "all"},
        "poll_interval_s": 0.5,
        "admin": {"token_env": DEFAULT_TOKEN_ENV},
        "grace_period_s": 2.0,
    }  # fmt: skip
    path = directory / "gateway.yaml"
    path.write_text(json.dumps(config, indent=2) + "\n")  # JSON is YAML
    return path
