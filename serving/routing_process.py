"""Run ``slipway routing serve`` as a child process on a free loopback port, and talk to it.

For tests, benchmarks and local fleets that want a real routing source next to real
gateway processes. It is a ``GatewayProcess`` with another command line: the same
deadlines on every wait, the same SIGTERM stop, the same output on failure. The port is
kept across ``stop``/``start``, so gateways pointed at ``url`` reconnect to a restarted
source by themselves.
"""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path
from typing import Any

from serving.process import GatewayProcess
from serving.routing_cli import DEFAULT_TOKEN_ENV


class RoutingSourceProcess(GatewayProcess):
    """The routing source in a child process, its table in ``state``; a context manager."""

    def __init__(self, state: Path, token: str, *, seed: Path | None = None) -> None:
        super().__init__(state.parent, env={DEFAULT_TOKEN_ENV: token})
        self.log_path = state.parent / f"routing-source-{self.rest_port}.log"
        self.state = state
        self.seed = seed

    @property
    def url(self) -> str:
        return self.rest_url

    def command(self) -> list[str]:
        command = [
            sys.executable, "-m", "slipway", "routing", "serve",
            "--state", str(self.state), "--host", "127.0.0.1", "--port", str(self.rest_port),
        ]  # fmt: skip
        if self.seed is not None:
            command += ["--seed", str(self.seed)]
        return command


def admin_call(url: str, token: str, method: str = "GET", body: Any = None) -> Any:
    """One JSON call to an admin endpoint (a gateway's ``/admin/…``, the source's ``/v1/…``)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Authorization", f"Bearer {token}")
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read())


def write_replica_config(
    directory: Path, source_url: str, *, watch_s: float = 30.0, ready_without_models: bool = False
) -> Path:
    """A gateway.yaml for one replica watching ``source_url``, with its own routing cache
    beside it and the admin token from ``$SLIPWAY_ADMIN_TOKEN`` (the source's too).
    ``ready_without_models`` lets a replica over an empty repository report ready."""
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "routing_source": {"url": source_url, "cache_file": "routing-cache.json",
                           "watch_s": watch_s},
        "version_policy": {"kind": "all"},
        "poll_interval_s": 0.5,
        "admin": {"token_env": DEFAULT_TOKEN_ENV},
        "grace_period_s": 2.0,
        "ready_without_models": ready_without_models,
    }  # fmt: skip
    path = directory / "gateway.yaml"
    path.write_text(json.dumps(config, indent=2) + "\n")  # JSON is YAML
    return path
