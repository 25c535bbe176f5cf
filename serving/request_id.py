"""Request ids: the key that joins an answer, its prediction log record and its label.

Every answer carries one (gRPC response metadata ``x-request-id``, REST header
``X-Request-Id``). A client that already has an id (a tracing header from its own
front end) sends it the same way and the gateway uses it; it is checked because it
ends up in log files and in later feedback calls: visible ASCII, at most
``MAX_LENGTH`` characters. Otherwise the gateway makes a random one.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Mapping

from serving.errors import InvalidArgument

HEADER = "x-request-id"
MAX_LENGTH = 128
_VALID = re.compile(rf"[\x21-\x7e]{{1,{MAX_LENGTH}}}")


def new_request_id() -> str:
    return uuid.uuid4().hex


def check_request_id(value: object, where: str = HEADER) -> str:
    """``value`` if it is a usable request id, else ``InvalidArgument`` naming ``where``."""
    if not isinstance(value, str) or _VALID.fullmatch(value) is None:
        raise InvalidArgument(
            f"{where}: expected 1 to {MAX_LENGTH} visible ASCII characters (no spaces), "
            f"got {value!r:.{MAX_LENGTH + 20}}"
        )
    return value


def request_id_of(headers: Mapping[str, str]) -> str:
    """The client's id from lower-cased ``headers`` (checked), or a new one."""
    sent = headers.get(HEADER)
    return new_request_id() if sent is None else check_request_id(sent)


def id_fraction(request_id: str) -> float:
    """A point in [0, 1) fixed by the id: the same id is sampled the same way everywhere."""
    digest = hashlib.sha256(request_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64
