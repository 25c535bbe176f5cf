"""The rollout controller's hands: one model's routing on every gateway replica at once.

A canary's weight must change on all replicas together, or clients see a mixture of old
and new splits that no step of the rollout intended; a rollback that reaches only some
replicas is not a rollback. Two ways, chosen by what the gateways report
(``GET /admin/routing/status``):

- **Routing source** (production): the gateways watch one routing source
  (``slipway routing serve``). A change is written there once, for this model only, and
  ``set_routing`` returns when every replica the source knows - including replicas
  started after the controller was - reports the new revision; a replica that lags is
  named. ``checked`` asks every such replica, not just the URLs given, and refuses when
  one has not applied the model's latest revision.
- **Fixed replicas** (one machine): every change is sent to every given URL concurrently
  (``PUT /admin/routing/{model}``), and also written to the shared routing file when one
  is given, rewriting only this model under the file's lock. A replica that fails is
  named in the error after the others have been tried, so the healthy ones already carry
  the change.
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pydantic

from serving.routing import ModelRouting, RoutingConfigError, update_routing_file

DEFAULT_TIMEOUT_S = 5.0
# How long set_routing waits for every replica to apply a change (the goal is 2 s).
APPLY_TIMEOUT_S = 10.0
APPLY_POLL_S = 0.05
AVAILABLE = "AVAILABLE"
STATUS_PATH = "/admin/routing/status"


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
        apply_timeout: float = APPLY_TIMEOUT_S,
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
        self._apply_timeout = apply_timeout
        self._ssl = ssl.create_default_context(cafile=str(ca_file)) if ca_file else None

    # -- reading --------------------------------------------------------------------------

    def source(self) -> str | None:
        """The routing source the given gateways watch, or None when they watch none.

        A gateway that cannot be asked is left to the call that follows, which names it;
        gateways watching different sources are an error (they cannot agree).
        """
        sources = set()
        for url in self.urls:
            try:
                status = self._request(url, "GET", STATUS_PATH)
            except (GatewayAdminError, _NotFound):
                continue
            sources.add(status.get("source") if isinstance(status, dict) else None)
        if len(sources) > 1:
            listed = ", ".join(sorted(str(source) for source in sources))
            raise GatewayAdminError(f"the gateways watch different routing sources: {listed}")
        return sources.pop() if sources else None

    def replicas(self, source: str | None) -> list[str]:
        """The replicas to act on: those watching ``source``, or the URLs given."""
        if source is None:
            return self.urls
        records = self._replica_records(source)
        unreachable = [str(record.get("replica")) for record in records if not record.get("url")]
        if unreachable:
            raise GatewayAdminError(
                f"{source}: replica(s) {', '.join(unreachable)} report no URL to check them at "
                "(start them with --advertise-url)"
            )
        if not records:
            raise GatewayAdminError(f"{source}: no gateway replica watches this routing source")
        return [record["url"].rstrip("/") for record in records]

    def get_routing(self, model: str) -> dict[str, ModelRouting]:
        """The model's routing as each replica has it, by replica URL."""
        answers = self._on_every_replica(
            lambda url: self._request(url, "GET", _routing_path(model)),
            urls=self.replicas(self.source()),
        )
        return {url: _model_routing(url, body) for url, body in answers.items()}

    def routing(self, model: str) -> ModelRouting:
        """The model's routing, which every replica must agree on (the source's, if any)."""
        source = self.source()
        if source is not None:
            return _model_routing(source, self._source_entry(source, model)["routing"])
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
        and (with a routing source) has applied the model's latest routing revision; return
        the model's current routing. Nothing is changed either way.

        A rollout to a version that some replica has not loaded would send that replica's
        canary share to stable (the router keeps traffic off unavailable versions), so
        the canary's numbers would come from fewer replicas than its weight suggests; a
        replica behind the source would split traffic as an older step did.
        """
        source = self.source()
        urls = self.replicas(source)
        wanted = sorted(set(versions))
        statuses = self._on_every_replica(
            lambda url: self._request(url, "GET", f"/v1/models/{_quote(model)}"),
            not_found=lambda url: UnknownModelError(f"{url}: model {model!r} is not served"),
            urls=urls,
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
        if source is None:
            return self.routing(model)
        entry = self._source_entry(source, model)
        self._require_applied(source, urls, model, int(entry["revision"]))
        return _model_routing(source, entry["routing"])

    # -- changing -------------------------------------------------------------------------

    def set_routing(self, model: str, routing: ModelRouting) -> None:
        """Give ``model`` this routing everywhere: the routing file, then every replica
        (through the routing source when the gateways watch one)."""
        if self.routing_file is not None:
            try:
                update_routing_file(self.routing_file, {model: routing})
            except (OSError, RoutingConfigError) as exc:
                raise GatewayAdminError(f"routing file {self.routing_file}: {exc}") from None
        body = routing.model_dump(mode="json", exclude_none=True)
        source = self.source()
        if source is None:
            self._on_every_replica(
                lambda url: self._request(url, "PUT", _routing_path(model), body),
                not_found=lambda url: UnknownModelError(f"{url}: model {model!r} is not served"),
            )
            return
        # Unconditional for this one model: during a rollout the controller owns the
        # model's routing (its state lock), and what it sends is the state it wants, not an
        # edit of what it read. Other models' entries are never touched.
        written = self._request(source, "PUT", _source_path(model), body)
        self._wait_applied(source, int(written["table_revision"]))

    def _wait_applied(self, source: str, revision: int) -> None:
        """Return once every live replica reports ``revision``; name the ones that do not."""
        deadline = time.monotonic() + self._apply_timeout
        while True:
            lagging = self._lagging(source, revision)
            if not lagging:
                return
            if time.monotonic() > deadline:
                raise GatewayAdminError(
                    f"routing revision {revision} written to {source} but not applied within "
                    f"{self._apply_timeout:g}s by: {'; '.join(lagging)}"
                )
            time.sleep(APPLY_POLL_S)  # polling another process's progress: nothing to await

    def _lagging(self, source: str, revision: int) -> list[str]:
        records = self._replica_records(source)
        if not records:
            return ["no gateway replica watches this routing source"]
        return [
            f"{record.get('url') or record.get('replica')} (at revision {record.get('revision')})"
            for record in records
            if int(record.get("revision", -1)) < revision
        ]

    def _require_applied(self, source: str, urls: list[str], model: str, revision: int) -> None:
        """Raise naming every replica whose applied revision is older than ``revision``."""
        statuses = self._on_every_replica(
            lambda url: self._request(url, "GET", STATUS_PATH), urls=urls
        )
        lagging = [
            f"{url}: at routing revision {status.get('revision')}"
            + ("" if status.get("connected") else f" (source unreachable: {status.get('error')})")
            for url, status in statuses.items()
            if int(status.get("revision", -1)) < revision
        ]
        if lagging:
            raise GatewayAdminError(
                f"replicas have not applied revision {revision} of {model!r}'s routing from "
                f"{source}: {'; '.join(lagging)}"
            )

    def _replica_records(self, source: str) -> list[dict[str, Any]]:
        """The live replicas as the source lists them: name, URL and applied revision."""
        listed = self._request(source, "GET", "/v1/replicas")
        records = listed.get("replicas") if isinstance(listed, dict) else None
        if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
            raise GatewayAdminError(f"{source}: unexpected replica list: {listed!r}")
        return records

    def _source_entry(self, source: str, model: str) -> dict[str, Any]:
        entry = self._request(source, "GET", _source_path(model))
        if not isinstance(entry, dict) or "revision" not in entry or "routing" not in entry:
            raise GatewayAdminError(f"{source}: unexpected routing answer: {entry!r}")
        return entry

    # -- transport ------------------------------------------------------------------------

    def _on_every_replica(
        self,
        call: Any,
        *,
        not_found: Any = None,
        urls: Sequence[str] | None = None,
    ) -> dict[str, Any]:
        """Run ``call(url)`` on all replicas (default: the URLs given) concurrently; raise
        one error naming each replica that failed once all have answered."""
        urls = self.urls if urls is None else urls
        with ThreadPoolExecutor(max_workers=len(urls)) as pool:
            futures = {url: pool.submit(call, url) for url in urls}
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
        if self._token is not None and path.startswith(("/admin/", "/v1/routing", "/v1/replicas")):
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


def _source_path(model: str) -> str:
    return f"/v1/routing/{_quote(model)}"


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
