"""One worker of a pool of gateway processes: what it shares with its siblings.

A worker is a whole gateway (``serving.server``) started by the pool's supervisor
(``serving.pool``) with ``--pool-dir``, ``--pool-index`` and ``--pool-status-fd``. Compared
with a gateway alone it:

- listens with ``SO_REUSEPORT`` on the ports the supervisor holds, and only once its models
  are loaded, so the kernel never hands a connection to a worker that cannot answer;
- reads the disk only when the supervisor says it changed (SIGHUP), and tells the supervisor
  (a line on its status pipe) when a change came through it, an admin routing change or a
  reload, so that every sibling applies it at once;
- reads one routing file with its siblings: gateway.yaml's, or the pool's own;
- answers, on a Unix socket in the pool directory, its siblings' questions about labels
  (``serving.feedback_relay``) and the supervisor's liveness probe (``ALIVE_PATH``), which
  only an event loop that still turns can answer.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from serving.config import GatewayConfig

ROUTING_FILE = "routing.yaml"
METRICS_DIR = "metrics"
SOCKETS_DIR = "workers"

READY = b"ready\n"
CHANGED = b"changed\n"
ALIVE_PATH = "/alive"


@dataclass(frozen=True)
class PoolWorker:
    """Where a worker's shared state lives and how it reaches its supervisor."""

    directory: Path
    index: int
    status_fd: int

    def gateway_config(self, config: GatewayConfig) -> GatewayConfig:
        """``config`` as a worker applies it: a routing file shared with the siblings when
        gateway.yaml names neither a file nor a routing source (in memory, each worker
        would route on its own)."""
        return config.model_copy(update={"routing_file": pool_routing_file(config, self.directory)})

    @property
    def socket_path(self) -> Path:
        return private_socket(self.directory, self.index)

    def sibling_sockets(self) -> list[Path]:
        """The other workers' sockets (a dead worker's may linger: asking it fails fast)."""
        try:
            paths = sorted((self.directory / SOCKETS_DIR).glob("*.sock"))
        except OSError:
            return []
        return [path for path in paths if path != self.socket_path]

    def announce_ready(self) -> None:
        self._tell(READY)

    def announce_change(self) -> None:
        """Something every worker must re-read changed through this one."""
        self._tell(CHANGED)

    def _tell(self, message: bytes) -> None:
        # A few bytes into a pipe the supervisor always drains: never blocks. A supervisor
        # that is gone (the worker outlived it) is no reason to fail the request.
        with contextlib.suppress(OSError):
            os.write(self.status_fd, message)


def private_socket(directory: Path, index: int) -> Path:
    """Where worker ``index`` of the pool in ``directory`` answers its siblings and its
    supervisor."""
    return directory / SOCKETS_DIR / f"{index}.sock"


def pool_routing_file(config: GatewayConfig, directory: Path) -> Path | None:
    """The routing file a pool's workers share (None: they follow a routing source)."""
    if config.routing_source is not None:
        return None
    return config.routing_file or directory / ROUTING_FILE
