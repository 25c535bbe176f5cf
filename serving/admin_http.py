"""What every admin HTTP API of Slipway shares: the bearer-token check and body validation.

The gateway's admin API and the routing source both take changes from the same callers
(the rollout controller, operators) with the same token, so both check it here, and both
answer a malformed body with the same 400 naming each bad field. Nothing here imports
TensorFlow: the routing source is a small process that never loads a model.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pydantic
from aiohttp import web

from serving.errors import InvalidArgument, PermissionDenied, Unauthenticated

Body = TypeVar("Body", bound=pydantic.BaseModel)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class AdminAuth:
    """Checks ``Authorization`` values against the configured token (None: admin off)."""

    def __init__(self, token: str | None) -> None:
        self._token = None if token is None else token.encode("utf-8")

    @property
    def enabled(self) -> bool:
        return self._token is not None

    def check(self, authorization: str | None) -> None:
        """Return if ``authorization`` carries the token; raise the right error if not.

        Tokens are compared in constant time so response timing does not leak how much of
        a guess was right.
        """
        if self._token is None:
            raise PermissionDenied("the admin API is disabled: no admin token is configured")
        if not authorization:
            raise Unauthenticated("admin calls need an 'authorization: Bearer <token>' header")
        scheme, _, credentials = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not credentials.strip():
            raise Unauthenticated("admin calls need an 'authorization: Bearer <token>' header")
        if not hmac.compare_digest(credentials.strip().encode("utf-8"), self._token):
            raise PermissionDenied("the admin token is not valid")

    def guarded(self, handler: Handler) -> Handler:
        """``handler`` behind the token check."""

        async def checked(request: web.Request) -> web.StreamResponse:
            self.check(request.headers.get("Authorization"))
            return await handler(request)

        return checked


async def read_body(request: web.Request, model_type: type[Body]) -> Body:
    """Read and validate a JSON request body in one step (pydantic parses the JSON too)."""
    try:
        return model_type.model_validate_json(await request.read())
    except pydantic.ValidationError as exc:
        raise InvalidArgument(f"invalid {model_type.__name__}: {_problems(exc)}") from None


def _problems(exc: pydantic.ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(part) for part in error['loc']) or '<body>'}: "
        f"{error['msg'].removeprefix('Value error, ')}"
        for error in exc.errors()
    )
