"""Labels for answers another worker of a pool gave.

The kernel spreads connections over a pool's workers (``SO_REUSEPORT``), so a label often
reaches a worker that did not answer the request it names. Each worker keeps only its own
answers: a store shared by all would cost every answer a write under a cross-process lock,
while labels are few and late. A worker that does not know a request id asks its siblings
on their Unix sockets, and the one that answered counts the label. Only the unknown items
travel; an item no worker knows is ``NOT_FOUND``, exactly as in a gateway alone.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import grpc
from aiohttp import web

from serving.errors import NotFound, ServingError
from serving.feedback import FeedbackStore

logger = logging.getLogger(__name__)

SIBLING_TIMEOUT_S = 5.0
_NOT_FOUND = grpc.StatusCode.NOT_FOUND.name


class FeedbackRelay:
    """``FeedbackStore.submit`` for a pool: what this worker does not know, its siblings may."""

    def __init__(self, store: FeedbackStore, siblings: Callable[[], list[Path]]) -> None:
        self._store = store
        self._siblings = siblings
        self._sessions: dict[Path, aiohttp.ClientSession] = {}

    async def submit(self, model: str, body: Mapping[str, Any]) -> dict[str, Any]:
        try:
            answer = self._store.submit(model, body)
        except NotFound:
            for sibling in self._siblings():
                reply = await self._ask(sibling, model, body)
                if reply is None or reply.get("code") == _NOT_FOUND:
                    continue
                if "error" in reply:
                    raise ServingError(grpc.StatusCode[reply["code"]], reply["error"]) from None
                return reply["answer"]
            raise
        if "results" in answer:
            await self._resolve_unknown(model, body["feedback"], answer["results"])
        return answer

    async def _resolve_unknown(
        self, model: str, items: list[Any], results: list[dict[str, Any]]
    ) -> None:
        """Replace, in place, the batch results this worker had no answer for."""
        for sibling in self._siblings():
            unknown = [i for i, result in enumerate(results) if result.get("code") == _NOT_FOUND]
            if not unknown:
                return
            reply = await self._ask(sibling, model, {"feedback": [items[i] for i in unknown]})
            if reply is None or "answer" not in reply:
                continue
            for index, result in zip(unknown, reply["answer"]["results"], strict=True):
                if result.get("code") != _NOT_FOUND:
                    results[index] = result

    async def _ask(
        self, sibling: Path, model: str, body: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        """The sibling's own answer, or None when it cannot be reached (a dead worker's
        socket is left behind until its replacement starts)."""
        session = self._sessions.get(sibling)
        if session is None:
            session = self._sessions[sibling] = aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=str(sibling)),
                timeout=aiohttp.ClientTimeout(total=SIBLING_TIMEOUT_S),
            )
        try:
            async with session.post(f"http://worker/feedback/{model}", json=body) as response:
                return await response.json()
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            logger.debug("feedback relay: sibling %s not reached: %s", sibling, exc)
            return None

    async def close(self) -> None:
        sessions, self._sessions = list(self._sessions.values()), {}
        await asyncio.gather(*(session.close() for session in sessions))


def sibling_route(store: FeedbackStore) -> web.RouteDef:
    """What a worker answers its siblings, on its private socket: labels counted against
    its own answers only (never relayed again, so a question cannot go round the pool)."""

    async def feedback(request: web.Request) -> web.Response:
        try:
            answer = store.submit(request.match_info["model"], await request.json())
        except ServingError as exc:
            return web.json_response({"error": exc.message, "code": exc.code.name})
        return web.json_response({"answer": answer})

    return web.post("/feedback/{model}", feedback)
