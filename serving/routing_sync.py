"""A gateway replica's link to the routing source: watch it, apply it, cache it, write to it.

The replica long-polls the source with the revision it has (reconnecting with capped
exponential backoff when the source is away), applies each new table at once, and writes
it to a local cache file, so a replica restarted while the source is down starts with the
last routing it knew instead of none. A replica with no cache waits for the source at
start rather than serve with no labels, which would send every request to the highest
version - the canary. Losing the source is logged, shown by ``GET /admin/routing/status``
and the ``slipway_gateway_routing_source_up`` gauge; it is never silent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import grpc
from pydantic import BaseModel, ConfigDict, Field, field_validator

from serving.errors import ServingError, Unavailable
from serving.routing import ModelRouting, RoutingConfigError
from serving.routing_table import (
    RoutingTable,
    RoutingTableError,
    load_table,
    parse_table,
    write_table,
)

logger = logging.getLogger(__name__)

BACKOFF_FIRST_S = 0.1
BACKOFF_MAX_S = 5.0
# A conflict or a bad routing is the caller's to fix or retry; anything else is the source's.
_SOURCE_STATUS = {412: grpc.StatusCode.ABORTED, 400: grpc.StatusCode.INVALID_ARGUMENT}


class RoutingSourceConfig(BaseModel):
    """``routing_source`` in gateway.yaml: where the replica's routing comes from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str
    # The last routing applied, read at start when the source cannot be reached.
    cache_file: Path | None = None
    # How long one watch waits for a change before it is renewed.
    watch_s: float = Field(default=30.0, gt=0, le=60)
    # Without a cache, how long start waits for the source before giving up.
    start_timeout_s: float = Field(default=30.0, gt=0)
    # Where the rollout controller reaches this replica's REST API (``--advertise-url``).
    advertise_url: str | None = None

    @field_validator("url", "advertise_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and urllib.parse.urlsplit(value).scheme not in ("http", "https"):
            raise ValueError(f"expected http://host:port or https://…, got {value!r}")
        return None if value is None else value.rstrip("/")


class RoutingSubscriber:
    """The table this replica applies, kept in step with the source by a watch task."""

    def __init__(self, config: RoutingSourceConfig, token: str | None) -> None:
        self.config = config
        self.replica = config.advertise_url or f"{socket.gethostname()}:{os.getpid()}"
        self._headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        self._table = RoutingTable()
        self._applied = asyncio.Condition()
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self.connected = False
        self.last_error: str | None = None
        # Called after the applied table or ``connected`` changes (metrics follow it).
        self.on_change: Callable[[], None] = lambda: None

    @property
    def table(self) -> RoutingTable:
        return self._table

    async def start(self) -> None:
        """Start from the cache if there is one, else from the source (or fail), then watch."""
        cached = await asyncio.to_thread(self._read_cache)
        if cached is not None:
            self._table = cached
            self.on_change()
        self._session = aiohttp.ClientSession(headers=self._headers)
        self._task = asyncio.get_running_loop().create_task(self._watch())
        if cached is None:
            try:
                async with asyncio.timeout(self.config.start_timeout_s):
                    await self._first_answer()
            except TimeoutError:
                await self.stop()
                raise RoutingConfigError(
                    f"routing source {self.config.url}: no answer within "
                    f"{self.config.start_timeout_s:g}s and no cached routing "
                    f"({self.config.cache_file or 'no cache_file set'}): {self.last_error}"
                ) from None

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def wait_for(self, revision: int, timeout: float) -> bool:
        """Wait until this replica has applied ``revision``; False on timeout."""
        try:
            async with asyncio.timeout(timeout), self._applied:
                await self._applied.wait_for(lambda: self._table.revision >= revision)
        except TimeoutError:
            return False
        return True

    async def set_model(self, model: str, routing: ModelRouting | None, if_match: int) -> int:
        """Write one model's routing to the source (compare-and-swap on ``if_match``) and
        return the table revision that carries it."""
        path = f"/v1/routing/{urllib.parse.quote(model, safe='')}"
        body = None if routing is None else routing.model_dump(mode="json", exclude_none=True)
        method = "DELETE" if routing is None else "PUT"
        answer = await self._call(method, path, json=body, headers={"If-Match": f'"{if_match}"'})
        return int(answer["table_revision"])

    # -- the watch ------------------------------------------------------------------------

    async def _first_answer(self) -> None:
        async with self._applied:
            await self._applied.wait_for(lambda: self.connected)

    async def _watch(self) -> None:
        backoff = BACKOFF_FIRST_S
        while True:
            try:
                table = await self._poll()
            except Exception as exc:  # the watch must outlive any one failed poll
                if not isinstance(exc, ServingError | RoutingTableError):
                    logger.exception("routing watch: unexpected failure")
                await self._lost(str(exc))
                # Full jitter: replicas that lost the source together do not return together.
                await asyncio.sleep(random.uniform(0, backoff))
                backoff = min(backoff * 2, BACKOFF_MAX_S)
                continue
            backoff = BACKOFF_FIRST_S
            await self._apply(table)

    async def _poll(self) -> RoutingTable:
        query = {"replica": self.replica, "url": self.config.advertise_url or ""}
        # Reconnecting, ask for the table at once (no ``after``): that confirms the source
        # is back and fetches what changed meanwhile; connected, wait for the next change.
        if self.connected:
            query |= {"after": str(self._table.revision), "wait": f"{self.config.watch_s:g}"}
        answer = await self._call(
            "GET", "/v1/routing?" + urllib.parse.urlencode(query), timeout=self.config.watch_s + 10
        )
        return parse_table(answer, source=self.config.url)

    async def _apply(self, table: RoutingTable) -> None:
        if not self.connected:
            logger.info("routing source %s reached (revision %d)", self.config.url, table.revision)
        if table.revision != self._table.revision:
            try:
                await asyncio.to_thread(self._write_cache, table)
            except OSError as exc:  # serve the new routing anyway; only a restart needs it
                logger.error("routing cache %s not written: %s", self.config.cache_file, exc)
            logger.info("routing revision %d applied", table.revision)
        async with self._applied:
            self._table, self.connected, self.last_error = table, True, None
            self._applied.notify_all()
        self.on_change()

    async def _lost(self, error: str) -> None:
        if error != self.last_error:  # log each distinct failure once, not every retry
            logger.error(
                "routing source unreachable, serving routing revision %d: %s",
                self._table.revision,
                error,
            )
        async with self._applied:
            self.connected, self.last_error = False, error
            self._applied.notify_all()
        self.on_change()

    async def _call(self, method: str, path: str, *, timeout: float = 10.0, **kwargs: Any) -> Any:
        assert self._session is not None, "start() first"
        url = self.config.url + path
        try:
            async with self._session.request(
                method, url, timeout=aiohttp.ClientTimeout(total=timeout), **kwargs
            ) as answer:
                body = await answer.json(content_type=None)
                if answer.status >= 400:
                    message = body.get("error") if isinstance(body, dict) else None
                    raise ServingError.for_code(
                        _SOURCE_STATUS.get(answer.status, grpc.StatusCode.UNAVAILABLE),
                        f"routing source {url}: HTTP {answer.status}: {message or answer.reason}",
                    )
                return body
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            raise Unavailable(f"routing source {url}: {type(exc).__name__}: {exc}") from None

    # -- the cache ------------------------------------------------------------------------

    def _read_cache(self) -> RoutingTable | None:
        path = self.config.cache_file
        if path is None or not path.exists():
            return None
        try:
            table = load_table(path)
        except RoutingTableError as exc:
            logger.error("routing cache ignored: %s", exc)
            return None
        logger.info("routing revision %d read from the cache %s", table.revision, path)
        return table

    def _write_cache(self, table: RoutingTable) -> None:
        if self.config.cache_file is not None:
            write_table(self.config.cache_file, table)
