"""The routing source of truth: one revisioned table, persisted, watched by every replica.

This is the control plane Envoy's xDS and Istio's istiod are for a mesh, at the size of
one table: writers change one model at a time, each change is fsynced to disk before it
is acknowledged (so a restarted source loses nothing it confirmed), and watchers waiting
on an older revision are woken at once. Changes are serialised by one lock on one event
loop, so two rollouts of two models never overwrite each other, and a write naming a
stale model revision (compare-and-swap) is refused instead of undoing someone else's.

The source also remembers which replicas watch it and which revision each has applied
(the revision a replica asks past is the one it has), so the rollout controller can tell
a replica that lags from one that agrees.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from serving.errors import Unavailable
from serving.routing import ModelRouting, RoutingConfig
from serving.routing_table import RoutingTable, load_table, write_table

logger = logging.getLogger(__name__)

# A replica counts as live while it watches, and this long after its last watch ended:
# long enough to cover its reconnection, short enough that a dead one drops out soon.
REPLICA_LEASE_S = 15.0


@dataclass
class ReplicaRecord:
    """What the source last heard from one replica."""

    replica: str
    url: str | None
    revision: int
    seen: float  # time.monotonic() of the last watch's start or end
    watching: int = 0  # watches in progress (a reconnect may briefly overlap the old one)

    def live(self, now: float) -> bool:
        return self.watching > 0 or now - self.seen <= REPLICA_LEASE_S

    def to_json(self, now: float) -> dict[str, object]:
        return {
            "replica": self.replica,
            "url": self.url,
            "revision": self.revision,
            "watching": self.watching > 0,
            "seen_seconds_ago": round(now - self.seen, 3),
        }


class RoutingSource:
    """The table, its file, the watchers waiting for the next revision, and the replicas."""

    def __init__(self, path: Path, table: RoutingTable) -> None:
        self.path = path
        self._table = table
        self._lock = asyncio.Lock()
        self._changed = asyncio.Condition()
        self._replicas: dict[str, ReplicaRecord] = {}
        self._closing = False

    @classmethod
    def open(cls, path: Path, seed: RoutingConfig | None = None) -> RoutingSource:
        """The source stored at ``path``; a new one starts from ``seed`` (or empty).

        The seed is used only when the file does not exist yet, so re-deploying with the
        original seed never undoes a rollout's changes.
        """
        if path.exists():
            return cls(path, load_table(path))
        table = RoutingTable()
        for model, routing in sorted((seed or RoutingConfig()).models.items()):
            table = table.with_model(model, routing)
        write_table(path, table)
        return cls(path, table)

    @property
    def table(self) -> RoutingTable:
        return self._table

    async def set_model(
        self, model: str, routing: ModelRouting | None, *, if_match: int | None = None
    ) -> RoutingTable:
        """Change one model (None removes it) and persist; ``RevisionConflict`` if
        ``if_match`` is not the model's revision. Returns the table now in force."""
        async with self._lock:
            table = self._table.with_model(model, routing, if_match=if_match)
            if table is self._table:
                return table
            try:
                await asyncio.to_thread(write_table, self.path, table)
            except OSError as exc:  # not stored, so not applied: the caller may retry
                raise Unavailable(f"cannot write the routing table {self.path}: {exc}") from None
            self._table = table
        logger.info("routing of %s changed: revision %d", model, table.revision)
        async with self._changed:
            self._changed.notify_all()
        return table

    async def watch(
        self, after: int, wait: float, *, replica: str | None = None, url: str | None = None
    ) -> RoutingTable:
        """The table as soon as its revision is not ``after`` (a replica holding revision
        ``after``), or after ``wait`` seconds either way. Not "greater than": a source
        restored from an older backup is still the truth, and replicas must follow it."""
        record = self._seen(replica, url, after)
        if record is not None:
            record.watching += 1
        try:
            async with self._changed:
                await asyncio.wait_for(
                    self._changed.wait_for(lambda: self._closing or self._table.revision != after),
                    wait,
                )
        except TimeoutError:
            pass
        finally:
            if record is not None:
                record.watching -= 1
                record.seen = time.monotonic()
        return self._table

    async def close(self) -> None:
        """Answer every waiting watcher now, so replicas reconnect instead of timing out."""
        self._closing = True
        async with self._changed:
            self._changed.notify_all()

    def replicas(self) -> list[ReplicaRecord]:
        """The live replicas, by name; the dead are forgotten."""
        now = time.monotonic()
        for name in [name for name, record in self._replicas.items() if not record.live(now)]:
            del self._replicas[name]
        return [self._replicas[name] for name in sorted(self._replicas)]

    def _seen(self, replica: str | None, url: str | None, revision: int) -> ReplicaRecord | None:
        if replica is None:
            return None
        record = self._replicas.get(replica)
        if record is None:
            record = self._replicas[replica] = ReplicaRecord(replica, url, revision, 0.0)
        record.url, record.revision, record.seen = url, revision, time.monotonic()
        return record
