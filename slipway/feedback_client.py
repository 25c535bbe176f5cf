"""The client side of label feedback: true labels posted to the gateway after the answer.

In production the true label of a prediction arrives later than the answer (a user
corrects it, an order ships or is returned), so ``DelayedFeedback`` holds each label for
``delay`` seconds and then posts it by the answer's request id, batched per gateway
(``{"feedback": [...]}``, see serving/feedback.py), to the replica that answered: each
gateway remembers only what it served itself.

``KeepAlive`` is the keep-alive HTTP connection per gateway that both the predict load
and the feedback sender use from their own threads.
"""

from __future__ import annotations

import heapq
import http.client
import itertools
import json
import threading
import time
import urllib.parse
from collections import defaultdict
from dataclasses import dataclass
from email.message import Message

Label = int | str

MAX_BATCH = 500  # labels per feedback request: one gateway event-loop turn stays short


class KeepAlive:
    """One keep-alive HTTP connection per gateway URL, for a single thread."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._connections: dict[str, http.client.HTTPConnection] = {}

    def post(self, url: str, path: str, body: bytes) -> tuple[int, Message | None, bytes]:
        """Status, headers and body of a JSON POST; status 0 (no headers) when the
        connection failed, which also drops it so the next call reconnects."""
        connection = self._connections.get(url)
        if connection is None:
            parts = urllib.parse.urlsplit(url)
            connection = http.client.HTTPConnection(
                parts.hostname, parts.port, timeout=self.timeout
            )
            self._connections[url] = connection
        try:
            connection.request("POST", path, body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            return response.status, response.headers, response.read()
        except (OSError, http.client.HTTPException):
            connection.close()
            self._connections.pop(url, None)
            return 0, None, b""

    def close(self) -> None:
        for connection in self._connections.values():
            connection.close()
        self._connections.clear()


@dataclass
class FeedbackCounts:
    """Labels posted and what the gateways said of them: the served class matched the
    label (``correct``) or not (``incorrect``), or the label was refused (an unknown or
    expired request id, an unreachable gateway)."""

    sent: int = 0
    correct: int = 0
    incorrect: int = 0
    refused: int = 0


@dataclass(order=True, frozen=True)
class _Pending:
    due: float
    order: int
    url: str
    request_id: str
    label: Label


class DelayedFeedback:
    """Posts each label ``delay`` seconds after it was added, from one background thread.

    Labels still waiting when ``stop()`` is called are not sent, as labels that had not
    arrived yet when the traffic ended.
    """

    def __init__(self, model: str, *, delay: float = 0.0, timeout: float = 10.0) -> None:
        if delay < 0:
            raise ValueError(f"the feedback delay must be >= 0, got {delay}")
        self.path = f"/v1/models/{urllib.parse.quote(model, safe='')}/feedback"
        self.delay = delay
        self.timeout = timeout
        self._pending: list[_Pending] = []
        self._order = itertools.count()
        self._changed = threading.Condition()
        self._stopped = False
        self._counts = FeedbackCounts()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def add(self, url: str, request_id: str, label: Label) -> None:
        """The true label of the answer ``url`` gave under ``request_id``."""
        with self._changed:
            item = _Pending(
                time.monotonic() + self.delay, next(self._order), url, request_id, label
            )
            heapq.heappush(self._pending, item)
            self._changed.notify()

    def counts(self) -> FeedbackCounts:
        with self._changed:
            return FeedbackCounts(**vars(self._counts))

    def start(self) -> DelayedFeedback:
        self._thread.start()
        return self

    def stop(self) -> FeedbackCounts:
        with self._changed:
            self._stopped = True
            self._changed.notify()
        if self._thread.is_alive():
            self._thread.join(self.timeout + 5)
        return self.counts()

    def _run(self) -> None:
        client = KeepAlive(self.timeout)
        try:
            while (due := self._next_due()) is not None:
                by_gateway: defaultdict[str, list[_Pending]] = defaultdict(list)
                for item in due:
                    by_gateway[item.url].append(item)
                for url, items in by_gateway.items():
                    for start in range(0, len(items), MAX_BATCH):
                        self._post(client, url, items[start : start + MAX_BATCH])
        finally:
            client.close()

    def _next_due(self) -> list[_Pending] | None:
        """Wait until some labels are due and take them; None once stopped."""
        with self._changed:
            while not self._stopped:
                now = time.monotonic()
                if self._pending and self._pending[0].due <= now:
                    due = []
                    while self._pending and self._pending[0].due <= now:
                        due.append(heapq.heappop(self._pending))
                    return due
                # Until the first label is due, or until a label or stop() arrives.
                self._changed.wait(self._pending[0].due - now if self._pending else None)
            return None

    def _post(self, client: KeepAlive, url: str, items: list[_Pending]) -> None:
        body = {"feedback": [{"request_id": i.request_id, "label": i.label} for i in items]}
        status, _, data = client.post(url, self.path, json.dumps(body).encode())
        outcomes = [(item.get("rows") or [{}])[0].get("outcome") for item in _results(status, data)]
        correct, incorrect = outcomes.count("correct"), outcomes.count("incorrect")
        with self._changed:
            self._counts.sent += len(items)
            self._counts.correct += correct
            self._counts.incorrect += incorrect
            self._counts.refused += len(items) - correct - incorrect


def _results(status: int, data: bytes) -> list[dict]:
    """The per-item results of a batch answer; none when the batch itself failed."""
    if status != 200:
        return []
    try:
        results = json.loads(data)["results"]
    except (ValueError, KeyError, TypeError):
        return []
    return [item for item in results if isinstance(item, dict)] if isinstance(results, list) else []
