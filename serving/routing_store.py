"""Where the gateway keeps the routing in force: a routing source, a routing file, or memory.

- With a routing source (``routing_source`` in gateway.yaml) the replica watches the
  source and caches what it applies (``serving.routing_sync``); an admin change is sent
  to the source, one model at a time, as a compare-and-swap on the revision this replica
  had, so it reaches every replica and never undoes a change it had not seen.
- With a routing file every replica on the machine reads the same file, and an admin
  change rewrites only the models it changes, under a file lock.
- With neither, routing lives in this process and admin changes are lost on restart.

Callers read ``current()``, build the config they want from it, and hand it to
``replace``; ``replace`` compares it with what ``current()`` was when it is called (no
await in between) so only the models the caller changed are written.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge

from serving.config import GatewayConfig
from serving.errors import DeadlineExceeded, FailedPrecondition, Unavailable
from serving.routing import (
    ModelRouting,
    RoutingConfig,
    RoutingWatcher,
    update_routing_file,
    write_routing,
)
from serving.routing_sync import RoutingSourceConfig, RoutingSubscriber

# How long an admin change through this replica waits to see it applied here.
APPLY_TIMEOUT_S = 10.0


class RoutingStore:
    """The routing config in force (``current``) and the one way to change it (``replace``)."""

    def __init__(
        self,
        path: Path | None = None,
        *,
        source: RoutingSourceConfig | None = None,
        token: str | None = None,
        registry: CollectorRegistry | None = None,
        interval: float = 1.0,
    ) -> None:
        if path is not None and source is not None:
            raise ValueError("give a routing file or a routing source, not both")
        self.path = path
        self._watcher = None if path is None else RoutingWatcher(path, interval=interval)
        self._source = None if source is None else RoutingSubscriber(source, token)
        self._memory = RoutingConfig()
        self._lock = asyncio.Lock()
        if registry is not None:
            self._register(registry)

    @classmethod
    def for_gateway(cls, config: GatewayConfig, registry: CollectorRegistry) -> RoutingStore:
        """The store gateway.yaml asks for; a source is reached with the admin token."""
        source = config.routing_source
        return cls(
            config.routing_file,
            source=source,
            token=None if source is None else config.admin_token(),
            registry=registry,
        )

    def current(self) -> RoutingConfig:
        if self._source is not None:
            return self._source.table.config()
        return self._memory if self._watcher is None else self._watcher.current

    @property
    def revision(self) -> int:
        """The routing source's revision this replica applies (0 without a source)."""
        return 0 if self._source is None else self._source.table.revision

    def status(self) -> dict[str, object]:
        """Where routing comes from and whether it is current, for ``/admin/routing/status``."""
        if self._source is not None:
            return {
                "source": self._source.config.url,
                "replica": self._source.replica,
                "revision": self._source.table.revision,
                "connected": self._source.connected,
                "error": self._source.last_error,
            }
        if self._watcher is not None:
            return {"file": str(self.path), "error": self._watcher.last_error}
        return {"memory": True}

    async def start(self) -> None:
        if self._source is not None:
            await self._source.start()
        elif self._watcher is not None:
            if not self.path.exists():
                await asyncio.to_thread(write_routing, self.path, RoutingConfig())
            await self._watcher.start()

    async def stop(self) -> None:
        if self._source is not None:
            await self._source.stop()
        elif self._watcher is not None:
            await self._watcher.stop()

    async def replace(self, config: RoutingConfig) -> None:
        """Put ``config`` in force, writing only the models that differ from ``current()``."""
        if self._source is not None:
            await self._replace_at_source(config)
            return
        if self._watcher is None:
            self._memory = config
            return
        changes = _changes(self.current(), config)
        async with self._lock:
            try:
                await asyncio.to_thread(update_routing_file, self.path, changes)
            except OSError as exc:
                raise Unavailable(f"cannot write the routing file {self.path}: {exc}") from None
            await self._watcher.refresh()

    async def refresh(self) -> None:
        """Re-read the file now; a file that does not parse keeps the last good config.
        With a source, say so if it cannot be reached (the watch reconnects by itself)."""
        if self._source is not None and not self._source.connected:
            raise Unavailable(
                f"routing source {self._source.config.url} unreachable, serving revision "
                f"{self._source.table.revision}: {self._source.last_error}"
            )
        if self._watcher is not None:
            await self._watcher.refresh()
            if self._watcher.last_error is not None:
                raise FailedPrecondition(f"routing file not applied: {self._watcher.last_error}")

    async def _replace_at_source(self, config: RoutingConfig) -> None:
        source = self._source
        table = source.table
        revision = table.revision
        for model, routing in _changes(table.config(), config).items():
            revision = await source.set_model(model, routing, table.model_revision(model))
        if not await source.wait_for(revision, APPLY_TIMEOUT_S):
            raise DeadlineExceeded(
                f"routing written to {source.config.url} at revision {revision}, but this "
                f"replica has not applied it within {APPLY_TIMEOUT_S:g}s (at revision "
                f"{source.table.revision}): {source.last_error or 'watch not answered'}"
            )

    def _register(self, registry: CollectorRegistry) -> None:
        """The routing gauges, set when the routing changes rather than computed at each
        scrape: a pool of processes exposes the values its workers last stored, and its
        lowest revision (or any lost source) is what matters."""
        revision = Gauge(
            "slipway_gateway_routing_revision",
            "Revision of the routing source's table this replica applies (0: no source; in "
            "a pool of processes, the lowest any worker applies).",
            multiprocess_mode="livemin",
            registry=registry,
        )
        source_up = Gauge(
            "slipway_gateway_routing_source_up",
            "1 while this replica's watch on its routing source is answered, 0 while it is "
            "not (it serves its last routing meanwhile); 1 without a source.",
            multiprocess_mode="livemin",
            registry=registry,
        )

        def publish() -> None:
            revision.set(self.revision)
            source_up.set(1 if self._source is None or self._source.connected else 0)

        publish()
        if self._source is not None:
            self._source.on_change = publish


def _changes(old: RoutingConfig, new: RoutingConfig) -> Mapping[str, ModelRouting | None]:
    """The models whose routing differs (None: removed), in name order."""
    names = sorted(set(old.models) | set(new.models))
    return {
        name: new.models.get(name) for name in names if old.models.get(name) != new.models.get(name)
    }
