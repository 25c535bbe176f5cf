"""A plain HTTP client for the gateway's REST port, answering errors instead of raising them.

Tests compare status codes and bodies, so an HTTP error is an answer like any other here,
and a body that is not JSON comes back as text for the assertion to show.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any, NamedTuple, Protocol

TIMEOUT_S = 30.0


class Answer(NamedTuple):
    """An HTTP answer: its status, its body (parsed JSON, else text) and its headers."""

    status: int
    body: Any
    headers: dict[str, str]


class RestServer(Protocol):
    """Anything with a REST base URL: a gateway on a thread or in a process."""

    @property
    def rest_url(self) -> str: ...


def fetch(
    url: str,
    method: str = "GET",
    body: Any = None,
    headers: dict[str, str] | None = None,
    raw: bytes | None = None,
    timeout: float = TIMEOUT_S,
) -> Answer:
    """Send ``body`` as JSON (or ``raw`` bytes as they are) and return the answer."""
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, text, answer_headers = response.status, response.read(), response.headers
    except urllib.error.HTTPError as exc:
        status, text, answer_headers = exc.code, exc.read(), exc.headers
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = text.decode()
    return Answer(status, parsed, dict(answer_headers))


def http(
    server: RestServer,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    raw: bytes | None = None,
    timeout: float = TIMEOUT_S,
) -> tuple[int, Any]:
    """``(status, body)`` of a request to ``path`` on ``server``'s REST port."""
    answer = fetch(server.rest_url + path, method, body, headers, raw, timeout)
    return answer.status, answer.body
