"""Where the gateway keeps the routing in force: the shared routing file, or memory.

With a routing file configured, every replica reads the same file (re-read when its
content changes) and an admin change is written to it atomically, so replicas started
later follow too; without one, routing lives in this process and admin changes are lost
on restart.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from serving.errors import FailedPrecondition, Unavailable
from serving.routing import RoutingConfig, RoutingWatcher, write_routing


class RoutingStore:
    """The routing config in force (``current``) and the one way to change it (``replace``)."""

    def __init__(self, path: Path | None, *, interval: float = 1.0) -> None:
        self.path = path
        self._watcher = None if path is None else RoutingWatcher(path, interval=interval)
        self._memory = RoutingConfig()

    def current(self) -> RoutingConfig:
        return self._memory if self._watcher is None else self._watcher.current

    async def start(self) -> None:
        if self._watcher is None:
            return
        if not self.path.exists():
            await asyncio.to_thread(write_routing, self.path, RoutingConfig())
        await self._watcher.start()

    async def stop(self) -> None:
        if self._watcher is not None:
            await self._watcher.stop()

    async def replace(self, config: RoutingConfig) -> None:
        if self._watcher is None:
            self._memory = config
            return
        try:
            await asyncio.to_thread(write_routing, self.path, config)
        except OSError as exc:
            raise Unavailable(f"cannot write the routing file {self.path}: {exc}") from None
        await self._watcher.refresh()

    async def refresh(self) -> None:
        """Re-read the file now; a file that does not parse keeps the last good config."""
        if self._watcher is not None:
            await self._watcher.refresh()
            if self._watcher.last_error is not None:
                raise FailedPrecondition(f"routing file not applied: {self._watcher.last_error}")
