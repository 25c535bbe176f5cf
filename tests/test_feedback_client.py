"""The demo client's label feedback: each label goes to the gateway that answered, by
request id, batched; what the gateway said of it is counted; labels not yet due when the
client stops are never sent.

A fake gateway (a plain HTTP server) answers feedback batches as the real one does
(serving/feedback.py): label 7 is the served class, any other class is not, and the
request id ``unknown`` is refused.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from slipway.feedback_client import DelayedFeedback, FeedbackCounts
from tests.support.ports import free_port
from tests.support.waiting import wait_until

SERVED_CLASS = 7
WAIT_S = 30.0


class FakeGateway(ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.received: list[tuple[str, list[dict]]] = []
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def __enter__(self) -> FakeGateway:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()
        self._thread.join(WAIT_S)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the gateway

    def do_POST(self) -> None:
        items = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["feedback"]
        self.server.received.append((self.path, items))
        body = json.dumps({"results": [_result(item) for item in items]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _result(item: dict) -> dict:
    if item["request_id"] == "unknown":
        return {"error": "request id 'unknown' is unknown or expired", "code": "NOT_FOUND"}
    outcome = "correct" if item["label"] == SERVED_CLASS else "incorrect"
    return {"request_id": item["request_id"], "rows": [{"row": 0, "outcome": outcome}]}


@pytest.fixture
def gateways() -> Iterator[list[FakeGateway]]:
    with FakeGateway() as first, FakeGateway() as second:
        yield [first, second]


def test_labels_go_to_the_gateway_that_answered_and_outcomes_are_counted(
    gateways: list[FakeGateway],
) -> None:
    feedback = DelayedFeedback("digits/v2").start()
    try:
        feedback.add(gateways[0].url, "a", SERVED_CLASS)
        feedback.add(gateways[1].url, "b", 3)
        feedback.add(gateways[1].url, "unknown", SERVED_CLASS)
        wait_until(lambda: feedback.counts().sent == 3, "three labels posted", WAIT_S)
    finally:
        counts = feedback.stop()
    assert counts == FeedbackCounts(sent=3, correct=1, incorrect=1, refused=1)
    sent = {
        gateway.url: [(path, item) for path, items in gateway.received for item in items]
        for gateway in gateways
    }
    path = "/v1/models/digits%2Fv2/feedback"
    assert sent[gateways[0].url] == [(path, {"request_id": "a", "label": SERVED_CLASS})]
    assert sorted(item["request_id"] for _, item in sent[gateways[1].url]) == ["b", "unknown"]


def test_labels_not_yet_due_when_stopped_are_never_sent(gateways: list[FakeGateway]) -> None:
    feedback = DelayedFeedback("digits", delay=3600).start()
    feedback.add(gateways[0].url, "a", SERVED_CLASS)
    assert feedback.stop() == FeedbackCounts()
    assert gateways[0].received == []


def test_an_unreachable_gateway_refuses_its_labels() -> None:
    feedback = DelayedFeedback("digits", timeout=5.0).start()
    try:
        feedback.add(f"http://127.0.0.1:{free_port()}", "a", SERVED_CLASS)
        wait_until(lambda: feedback.counts().sent == 1, "the label posted", WAIT_S)
    finally:
        counts = feedback.stop()
    assert counts == FeedbackCounts(sent=1, refused=1)


def test_a_negative_delay_is_refused() -> None:
    with pytest.raises(ValueError, match="delay must be >= 0"):
        DelayedFeedback("digits", delay=-1)
