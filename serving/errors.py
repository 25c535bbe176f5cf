"""Errors the gateway reports to clients, each tied to one gRPC status and one HTTP status.

Both APIs answer from the same exception: the gRPC server aborts with ``grpc_code`` and
the REST server replies ``{"error": message}`` with ``http_status``, so a client sees the
same failure whichever protocol it speaks. The HTTP statuses follow the mapping
TensorFlow Serving's REST API and Google's API design guide use for these codes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import ClassVar

import grpc

# How each gRPC status surfaces over HTTP (google.rpc.Code -> HTTP in the API design guide).
_HTTP_STATUS: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500,
    grpc.StatusCode.UNAUTHENTICATED: 401,
}


class StartupError(RuntimeError):
    """The gateway cannot start (missing model root, port in use, unreadable certificate):
    the operator's to fix, never sent to a client."""


class ServingError(Exception):
    """A failure with a status code a client can act on (retry, fix the request, …)."""

    grpc_code: ClassVar[grpc.StatusCode] = grpc.StatusCode.UNKNOWN

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def http_status(self) -> int:
        return _HTTP_STATUS.get(self.code, 500)

    @property
    def error_code(self) -> int:
        """The numeric ``google.rpc.Code`` (what ``GetModelStatus`` puts in ``error_code``)."""
        return self.code.value[0]

    @staticmethod
    def for_code(code: grpc.StatusCode, message: str) -> ServingError:
        """The most specific error class for ``code`` (used to relay a remote status)."""
        cls = _BY_CODE.get(code)
        return cls(message) if cls is not None else ServingError(code, message)

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.code.name}, {self.message!r})"


class _Coded(ServingError):
    """Base for the errors whose class fixes the status code."""

    def __init__(self, message: str) -> None:
        super().__init__(type(self).grpc_code, message)


class InvalidArgument(_Coded):
    """The request is malformed or does not match the signature; retrying will not help."""

    grpc_code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(_Coded):
    """No such model, version, label or signature."""

    grpc_code = grpc.StatusCode.NOT_FOUND


class Unavailable(_Coded):
    """Temporarily unable to serve (queue full, draining, backend down); retry later."""

    grpc_code = grpc.StatusCode.UNAVAILABLE


class ResourceExhausted(_Coded):
    """A quota or size limit was hit."""

    grpc_code = grpc.StatusCode.RESOURCE_EXHAUSTED


class DeadlineExceeded(_Coded):
    """The request's deadline passed before a result was ready."""

    grpc_code = grpc.StatusCode.DEADLINE_EXCEEDED


class FailedPrecondition(_Coded):
    """The system is not in a state that allows the operation (e.g. strict mode refuses)."""

    grpc_code = grpc.StatusCode.FAILED_PRECONDITION


class Unauthenticated(_Coded):
    """No valid credentials were presented."""

    grpc_code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(_Coded):
    """Credentials were valid but do not allow the operation."""

    grpc_code = grpc.StatusCode.PERMISSION_DENIED


class Internal(_Coded):
    """A bug or an unexpected failure inside the gateway or the model."""

    grpc_code = grpc.StatusCode.INTERNAL


class DataLoss(_Coded):
    """Files on disk do not match what their manifest vouches for."""

    grpc_code = grpc.StatusCode.DATA_LOSS


_BY_CODE: dict[grpc.StatusCode, type[_Coded]] = {
    cls.grpc_code: cls
    for cls in (
        InvalidArgument,
        NotFound,
        Unavailable,
        ResourceExhausted,
        DeadlineExceeded,
        FailedPrecondition,
        Unauthenticated,
        PermissionDenied,
        Internal,
        DataLoss,
    )
}


_BY_NUMBER: dict[int, grpc.StatusCode] = {code.value[0]: code for code in grpc.StatusCode}


def as_serving_error(
    exc: BaseException, default: grpc.StatusCode = grpc.StatusCode.INTERNAL
) -> ServingError:
    """``exc`` as a ``ServingError``, keeping the status a TensorFlow error carries.

    TensorFlow's ``OpError`` subclasses have a numeric ``error_code`` from the same
    ``google.rpc.Code`` space, so a model's own ``InvalidArgumentError`` reaches the
    client as ``INVALID_ARGUMENT``; anything else becomes ``default``.
    """
    if isinstance(exc, ServingError):
        return exc
    number = getattr(exc, "error_code", None)
    if isinstance(number, int) and number in _BY_NUMBER and number != 0:
        message = getattr(exc, "message", None) or str(exc)
        return ServingError.for_code(_BY_NUMBER[number], message)
    return ServingError.for_code(default, f"{type(exc).__name__}: {exc}")


class ClientDisconnected(ServingError):
    """The client went away before its request was read or answered (not a server fault).

    Nobody receives the answer; the status (``CANCELLED``, HTTP 499 as nginx logs it) is
    for the access log and metrics only.
    """

    grpc_code = grpc.StatusCode.CANCELLED

    def __init__(self, message: str = "the client closed the connection") -> None:
        super().__init__(grpc.StatusCode.CANCELLED, message)


# -- what a client may see -------------------------------------------------------------------

# Client input echoed in a message (a model name, a label, a path) is cut to this many
# characters: a 10k-character model name must not come back 10k characters long.
MAX_ECHO_CHARS = 100
# The longest message a client gets, whatever it holds (a last guard).
MAX_CLIENT_MESSAGE_CHARS = 4096
ELLIPSIS = "…"

# An absolute filesystem path of at least two components (``/srv/models/digits``), not
# the tail of a URL (``http://host/x``) nor one of the gateway's own REST paths.
_ABSOLUTE_PATH = re.compile(
    r"(?<![\w.~:/>-])/(?!v1/|admin/)(?:[^\s/'\"`:,;()\[\]{}<>|]+/)+[^\s/'\"`:,;()\[\]{}<>|]*"
)
# Where a path ends: the next character cannot continue a file name.
_PATH_END = r"(?![^\s/'\"`:,;()\[\]{}<>|])"
# A run of non-blank characters too long to be anything but echoed input.
_LONG_TOKEN = re.compile(rf"\S{{{MAX_ECHO_CHARS + 1},}}")
_CLOSING = re.compile(r"[\"'`)\]}>,;:.]{1,3}$")
SERVER_PATH = "<server path>"


def shorten(text: str, limit: int = MAX_ECHO_CHARS) -> str:
    """``text`` cut to ``limit`` characters with an ellipsis (client input in messages)."""
    return text if len(text) <= limit else text[:limit] + ELLIPSIS


def echo(value: object, limit: int = MAX_ECHO_CHARS) -> str:
    """``repr(value)`` for a message, cut to ``limit`` characters, closing quote kept."""
    text = repr(value)
    if len(text) <= limit:
        return text
    closing = text[-1] if text[:1] in ("'", '"') and text[-1] == text[0] else ""
    return text[:limit] + ELLIPSIS + closing


def _shorten_token(match: re.Match[str]) -> str:
    token = match.group()
    closing = _CLOSING.search(token)
    return token[:MAX_ECHO_CHARS] + ELLIPSIS + (closing.group() if closing else "")


def client_message(message: str, roots: Sequence[tuple[str, str]] = ()) -> str:
    """``message`` as a client may see it: no filesystem path of the server, no echo of
    client input longer than ``MAX_ECHO_CHARS``, at most ``MAX_CLIENT_MESSAGE_CHARS``.

    ``roots`` are ``(directory, name)`` pairs: a path under ``directory`` keeps its part
    below it, written under ``name`` (``<model root>/digits/1``), so the client still
    learns which version is broken; any other absolute path becomes ``<server path>``.
    """
    for directory, name in sorted(roots, key=lambda pair: len(pair[0]), reverse=True):
        if directory and directory != "/":
            pattern = re.escape(directory.rstrip("/")) + _PATH_END
            message = re.sub(pattern, lambda _match, name=name: name, message)
    message = _ABSOLUTE_PATH.sub(SERVER_PATH, message)
    message = _LONG_TOKEN.sub(_shorten_token, message)
    return shorten(message, MAX_CLIENT_MESSAGE_CHARS)
