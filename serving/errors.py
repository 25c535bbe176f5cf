"""Errors the gateway reports to clients, each tied to one gRPC status and one HTTP status.

Both APIs answer from the same exception: the gRPC server aborts with ``grpc_code`` and
the REST server replies ``{"error": message}`` with ``http_status``, so a client sees the
same failure whichever protocol it speaks. The HTTP statuses follow the mapping
TensorFlow Serving's REST API and Google's API design guide use for these codes.
"""

from __future__ import annotations

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
