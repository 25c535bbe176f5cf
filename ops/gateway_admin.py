"""The rollout controller's hands: one model's routing on every gateway replica at once.

A canary's weight must change on all replicas together, or clients see a mixture of old
and new splits that no step of the rollout intended; a rollback that reaches only some
replicas is not a rollback. So every change is sent to every replica concurrently (the
admin API, ``PUT /admin/routing/{model}``), and also written to the shared routing file
when one is given (a ConfigMap-like file that every replica polls). A replica that fails
is named in the error, after the others have been tried, so the caller knows which ones
to retry and the healthy ones already carry the change.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pydantic

from serving.routing import (
    ModelRouting,
    RoutingConfig,
    RoutingConfigError,
    load_routing,
    write_routing,
)

DEFAULT_TIMEOUT_S = 5.0
AVAILABLE = "AVAILABLE"


class GatewayAdminError(RuntimeError):
    """A replica refused or could not be reached; the message names every such replica."""


class UnknownModelError(ValueError):
    """The model or one of the versions a rollout names is not served by the gateways."""


class GatewayAdmin:
    """Reads and changes one model's routing on a set of gateway replicas.

    ``urls`` are the replicas' REST base URLs (``http://host:8501``); ``token`` is the admin
    bearer token. ``ca_file`` verifies HTTPS replicas signed by a private CA.
    """

    def __init__(
        self,
        urls: Sequence[str],
        token: str | None,
        *,
        routing_file: Path | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        ca_file: Path | None = None,
    ) -> None:
        if not urls:
            raise ValueError("give at least one gateway URL")
        self.urls = [url.rstrip("/") for url in urls]
        for url in self.urls:
            if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
                raise ValueError(f"gateway URL {url!r}: expected http://host:port or https://…")
        self.routing_file = routing_file
        self._token = token
        self._timeout = timeout
        self._ssl = ssl.create_default_context(cafile=str(ca_file)) if ca_file else None

    # -- reading --------------------------------------------------------------------------

    def get_routing(self, model: str) -> dict[str, ModelRouting]:
        """The model's routing as each replica has it, by replica URL."""
        answers = self._on_every_replica(
            lambda url: self._request(url, "GET", _routing_path(model))
        )
        return {url: _model_routing(url, body) for url, body in answers.items()}

    def routing(self, model: str) -> ModelRouting:
        """The model's routing, which every replica must agree on."""
        by_replica = self.get_routing(model)
        first, *others = by_replica.values()
        if any(routing != first for routing in others):
            described = "; ".join(
                f"{url}: {routing.model_dump(mode='json', exclude_none=True)}"
                for url, routing in by_replica.items()
            )
            raise GatewayAdminError(
                f"the replicas disagree on the routing of {model!r} ({described}); set it on "
                "every replica (or fix the shared routing file) before starting a rollout"
            )
        return first

    def checked(self, model: str, versions: Iterable[int]) -> ModelRouting:
        """Check that every replica serves ``model`` with each of ``versions`` AVAILABLE,
        and return the model's current routing; nothing is changed either way.

        A rollout to a version that some replica has not loaded would send that replica's
        canary share to stable (the router keeps traffic off unavailable versions), so
        the canary's numbers would come from fewer replicas than its weight suggests.
        """
        wanted = sorted(set(versions))
        statuses = self._on_every_replica(
            lambda url: self._request(url, "GET", f"/v1/models/{_quote(model)}"),
            not_found=lambda url: UnknownModelError(f"{url}: model {model!r} is not served"),
        )
        problems = []
        for url, body in statuses.items():
            available = _available_versions(url, body)
            missing = [version for version in wanted if version not in available]
            if missing:
                listed = ", ".join(map(str, sorted(available))) or "none"
                problems.append(
                    f"{url}: version(s) {', '.join(map(str, missing))} of {model!r} not "
                    f"available (available: {listed})"
                )
        if problems:
            raise UnknownModelError("; ".join(problems))
        return self.routing(model)

    # -- changing -------------------------------------------------------------------------

    def set_routing(self, model: str, routing: ModelRouting) -> None:
        """Give ``model`` this routing everywhere: the routing file, then every replica."""
        if self.routing_file is not None:
            self._write_file(model, routing)
        body = routing.model_dump(mode="json", exclude_none=True)
        self._on_every_replica(
            lambda url: self._request(url, "PUT", _routing_path(model), body),
            not_found=lambda url: UnknownModelError(f"{url}: model {model!r} is not served"),
        )

    def _write_file(self, model: str, routing: ModelRouting) -> None:
        path = self.routing_file
        try:
            config = load_routing(path) if path.exists() else RoutingConfig()
            write_routing(path, RoutingConfig(models={**config.models, model: routing}))
        except (OSError, RoutingConfigError) as exc:
            raise GatewayAdminError(f"routing file {path}: {exc}") from None

    # -- transport ------------------------------------------------------------------------

    def _on_every_replica(
        self,
        call: Any,
        *,
        not_found: Any = None,
    ) -> dict[str, Any]:
        """Run ``call(url)`` on all replicas concurrently; raise one error naming each
        replica that failed once all have answered."""
        with ThreadPoolExecutor(max_workers=len(self.urls)) as pool:
            futures = {url: pool.submit(call, url) for url in self.urls}
        answers: dict[str, Any] = {}
        failures: list[str] = []
        unknown: list[UnknownModelError] = []
        for url, future in futures.items():
            try:
                answers[url] = future.result()
            except _NotFound as exc:
                if not_found is None:
                    failures.append(f"{url}: {exc}")
                else:
                    unknown.append(not_found(url))
            except GatewayAdminError as exc:
                failures.append(str(exc))
        if unknown:
            raise UnknownModelError("; ".join(str(error) for error in unknown))
        if failures:
            raise GatewayAdminError("; ".join(failures))
        return answers

    def _request(self, url: str, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode("utf-8")
        request = urllib.request.Request(url + path, data=data, method=method)
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if self._token is not None and path.startswith("/admin/"):
            request.add_header("Authorization", f"Bearer {self._token}")
        try:
            with urllib.request.urlopen(
                request, timeout=self._timeout, context=self._ssl
            ) as answer:
                return json.loads(answer.read() or b"null")
        except urllib.error.HTTPError as exc:
            message = _error_message(exc)
            if exc.code == 404:
                # The gateway answers 404 both for an unknown model and, on admin paths,
                # when the admin API is off (its routes do not exist); only the first
                # names the model.
                if not path.startswith("/admin/") or "model" in message:
                    raise _NotFound(message) from None
                message = "the admin API is off (start the gateway with an admin token)"
            elif exc.code in (401, 403):
                message = f"admin token refused: {message}"
            raise GatewayAdminError(f"{url}: {method} {path}: HTTP {exc.code}: {message}") from None
        except (OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise GatewayAdminError(f"{url}: {method} {path}: {reason}") from None


class _NotFound(Exception):
    """A 404 about the model itself (not about the admin API being off)."""


def _routing_path(model: str) -> str:
    return f"/admin/routing/{_quote(model)}"


def _quote(model: str) -> str:
    return urllib.parse.quote(model, safe="")


def _error_message(exc: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(exc.read() or b"{}")
    except ValueError:
        return exc.reason or f"HTTP {exc.code}"
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        return body["error"]
    return exc.reason or f"HTTP {exc.code}"


def _model_routing(url: str, body: Any) -> ModelRouting:
    try:
        return ModelRouting.model_validate(body)
    except pydantic.ValidationError as exc:
        raise GatewayAdminError(f"{url}: unexpected routing answer: {exc}") from None


def _available_versions(url: str, body: Any) -> set[int]:
    statuses = body.get("model_version_status") if isinstance(body, dict) else None
    if not isinstance(statuses, list):
        raise GatewayAdminError(f"{url}: unexpected model status answer: {body!r}")
    available = set()
    for status in statuses:
        if isinstance(status, dict) and status.get("state") == AVAILABLE:
            try:
                available.add(int(status["version"]))
            except (KeyError, TypeError, ValueError):
                raise GatewayAdminError(
                    f"{url}: unexpected model status entry: {status!r}"
                ) from None
    return available
