"""Which model version answers a request: labels, canary weight, sticky keys, shadow, failover.

The routing file is shared by every gateway replica (a Kubernetes ConfigMap in production)
and rewritten at run time by the rollout controller, so it is read defensively: a file that
is half-written or invalid is logged and ignored, and the last good config keeps serving.

Example (YAML or JSON)::

    models:
      digits:
        labels: {stable: 1, canary: 2}
        canary_weight: 0.1          # fraction of routed traffic sent to the canary
        sticky_header: x-user-id    # same header value -> same side of the split
        shadow: {label: canary, percent: 5}
        failover: true              # canary error/timeout -> retried on stable
        timeout_ms: 500
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import logging
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, Protocol

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StringConstraints, model_validator

from contracts.atomic_files import write_text_atomically
from contracts.yaml_config import ConfigError, parse_model, parse_yaml, read_config_text
from serving.errors import InvalidArgument, NotFound

logger = logging.getLogger(__name__)

STABLE = "stable"
CANARY = "canary"
SHADOW = "shadow"  # the route of a mirrored copy, in metrics
Route = Literal["stable", "canary", "explicit"]

# A label must not look like a version number (REST paths put either in the same place) and
# must be safe in a URL path segment.
LabelName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")]
Version = Annotated[StrictInt, Field(ge=0)]
# An HTTP header field name (RFC 9110 token); gRPC metadata keys are the same, lower-cased.
HeaderName = Annotated[
    str,
    StringConstraints(to_lower=True, pattern=r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$"),
]


class RoutingConfigError(ConfigError):
    """The routing file is unreadable or invalid; the message names file, line and key."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ShadowRoute(_Section):
    """Mirror a percentage of routed traffic to another version and compare the answers."""

    label: LabelName | None = None
    version: Version | None = None
    percent: float = Field(ge=0, le=100)

    @model_validator(mode="after")
    def _one_target(self) -> ShadowRoute:
        if (self.label is None) == (self.version is None):
            raise ValueError("give exactly one of label or version")
        return self


class ModelRouting(_Section):
    """Routing of one model. A model with no entry routes to its highest available version."""

    labels: dict[LabelName, Version] = {}
    canary_weight: float = Field(default=0.0, ge=0, le=1)
    sticky_header: HeaderName | None = None
    shadow: ShadowRoute | None = None
    failover: bool = False
    timeout_ms: int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _labels_exist(self) -> ModelRouting:
        if self.canary_weight > 0 and CANARY not in self.labels:
            raise ValueError("canary_weight > 0 needs a 'canary' label")
        if CANARY in self.labels and STABLE not in self.labels:
            raise ValueError("a 'canary' label needs a 'stable' label to split traffic with")
        shadow_label = self.shadow.label if self.shadow is not None else None
        if shadow_label is not None and shadow_label not in self.labels:
            raise ValueError(f"shadow label {shadow_label!r} is not one of the labels")
        return self

    def shadow_version(self) -> int | None:
        if self.shadow is None:
            return None
        if self.shadow.version is not None:
            return self.shadow.version
        return self.labels[self.shadow.label]


class RoutingConfig(_Section):
    """The whole routing file: one ``ModelRouting`` per model name."""

    models: dict[str, ModelRouting] = {}

    def for_model(self, model: str) -> ModelRouting:
        return self.models.get(model, _NO_ROUTING)


_NO_ROUTING = ModelRouting()


# --------------------------------------------------------------------------- file format


def parse_routing(text: str, *, source: str = "<routing>") -> RoutingConfig:
    """Parse YAML or JSON text (JSON is YAML) into a validated ``RoutingConfig``."""
    try:
        data = parse_yaml(text, source=source)
        config = (
            None if data is None else parse_model(data, RoutingConfig, source=source, text=text)
        )
    except ConfigError as exc:
        raise RoutingConfigError(str(exc)) from None
    if config is None:
        # An empty file is what a reader sees while a non-atomic writer is half-way through;
        # taking it as "no routing" would drop every label at once.
        raise RoutingConfigError(f"{source}: empty routing file (write 'models: {{}}' for none)")
    return config


def load_routing(path: str | Path) -> RoutingConfig:
    """Read a routing file; every failure is a ``RoutingConfigError``."""
    try:
        text = read_config_text(path)
    except ConfigError as exc:
        raise RoutingConfigError(str(exc)) from None
    return parse_routing(text, source=str(path))


def dump_routing(config: RoutingConfig, *, as_json: bool) -> str:
    data = config.model_dump(mode="json", exclude_none=True)
    if as_json:
        return json.dumps(data, indent=2, sort_keys=True) + "\n"
    return yaml.safe_dump(data, sort_keys=False)


def write_routing(path: str | Path, config: RoutingConfig) -> None:
    """Replace the routing file atomically (JSON for ``*.json``, YAML otherwise).

    Readers on other replicas poll the file; an atomic replace means they see the old or
    the new config, never a mixture, even across a crash.
    """
    path = Path(path)
    write_text_atomically(path, dump_routing(config, as_json=path.suffix.lower() == ".json"))


def update_routing_file(path: str | Path, changes: Mapping[str, ModelRouting | None]) -> None:
    """Set (or, for None, remove) the named models' routing in the file, keeping the rest.

    The file is re-read under an exclusive lock (``<file>.lock`` beside it), so writers
    sharing one file - replicas, the rollout controller - never drop each other's models:
    a read-then-write without the lock would put back what it read.
    """
    path = Path(path)
    with path.with_name(path.name + ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        config = load_routing(path) if path.exists() else RoutingConfig()
        models = {**config.models, **changes}
        write_routing(
            path,
            RoutingConfig(
                models={name: routing for name, routing in models.items() if routing is not None}
            ),
        )


# --------------------------------------------------------------------------- watcher


@dataclass(frozen=True)
class _Snapshot:
    """What one look at the file found: its content hash, and a config or an error."""

    digest: str | None
    unchanged: bool = False
    config: RoutingConfig | None = None
    error: str | None = None


class RoutingWatcher:
    """Keeps the routing config in step with its file.

    Every ``interval`` seconds the file is read and hashed (SHA-256); only a new hash is
    parsed. The content decides, not the mtime: an atomic rename can reuse an inode with
    the same size and a timestamp within the filesystem's granularity, and a change missed
    that way would stay missed. File reads run in a worker thread so the event loop never
    blocks on the filesystem, and ``on_change`` is called on the event loop thread.
    """

    def __init__(
        self,
        path: str | Path,
        on_change: Callable[[RoutingConfig], None] | None = None,
        *,
        interval: float = 1.0,
    ) -> None:
        self.path = Path(path)
        self._on_change = on_change
        self._interval = interval
        self._config = RoutingConfig()
        self._good_digest: str | None = None
        self._seen_digest: str | None = None
        self._error: str | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def current(self) -> RoutingConfig:
        """The last good config (empty until the first successful load)."""
        return self._config

    @property
    def last_error(self) -> str | None:
        """Why the file on disk is not the config in use, or None if it is."""
        return self._error

    async def refresh(self) -> bool:
        """Check the file now without blocking the event loop; True if a new config was applied."""
        return self._apply(await asyncio.to_thread(self._look))

    async def start(self) -> None:
        """Load the file (a missing or invalid file is an error at start) and begin polling."""
        await self.refresh()
        if self._good_digest is None:
            raise RoutingConfigError(self._error or f"{self.path}: no routing config loaded")
        self._task = asyncio.get_running_loop().create_task(self._watch())

    async def stop(self) -> None:
        if self._task is None:
            return
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.refresh()
            except Exception:  # the watcher must outlive any one bad poll
                logger.exception("routing file %s: poll failed", self.path)

    def _look(self) -> _Snapshot:
        try:
            raw = self.path.read_bytes()
        except OSError as exc:
            return _Snapshot(None, error=f"{self.path}: cannot read: {exc}")
        digest = hashlib.sha256(raw).hexdigest()
        if digest == self._seen_digest:
            return _Snapshot(digest, unchanged=True)
        try:
            config = parse_routing(raw.decode("utf-8"), source=str(self.path))
        except UnicodeDecodeError as exc:
            return _Snapshot(digest, error=f"{self.path}: cannot read: {exc}")
        except RoutingConfigError as exc:
            return _Snapshot(digest, error=str(exc))
        return _Snapshot(digest, config=config)

    def _apply(self, snapshot: _Snapshot) -> bool:
        if snapshot.unchanged:
            return False
        self._seen_digest = snapshot.digest
        if snapshot.error is not None:
            if snapshot.error != self._error:  # log each distinct failure once, not every poll
                logger.error(
                    "routing file ignored, keeping the last good config: %s", snapshot.error
                )
            self._error = snapshot.error
            return False
        self._error = None
        if snapshot.digest == self._good_digest:  # back to the config already in use
            return False
        self._good_digest = snapshot.digest
        self._config = snapshot.config
        logger.info("routing config loaded from %s", self.path)
        if self._on_change is not None:
            try:
                self._on_change(snapshot.config)
            except Exception:
                logger.exception("routing change listener failed")
        return True


# --------------------------------------------------------------------------- router


class RandomSource(Protocol):
    def random(self) -> float: ...


@dataclass(frozen=True)
class RouteDecision:
    """Where one request goes.

    ``shadow_version`` receives a mirrored copy (answer discarded, compared only);
    ``failover_version`` is where to retry if ``version`` fails or times out.
    """

    version: int
    route: Route
    shadow_version: int | None = None
    failover_version: int | None = None
    timeout_ms: int | None = None


def sticky_fraction(model: str, key: str) -> float:
    """Map a sticky key to [0, 1) the same way on every replica and every run.

    A key goes to the canary iff its fraction is below the canary weight, so raising the
    weight only ever moves keys from stable to canary, never back.
    """
    digest = hashlib.sha256(f"{model}\0{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


class Router:
    """Turns a request's model / version / label / sticky key into a ``RouteDecision``.

    ``config_provider`` returns the current routing config (usually ``watcher.current``)
    so a reload takes effect on the next request. ``available_versions`` returns a model's
    versions that can take traffic: it picks the version of a model without a ``stable``
    label, and keeps weighted and shadow traffic off a version that is not (yet) available.
    """

    def __init__(
        self,
        config_provider: Callable[[], RoutingConfig],
        available_versions: Callable[[str], Iterable[int]] | None = None,
        *,
        rng: RandomSource | None = None,
    ) -> None:
        self._config = config_provider
        self._available = available_versions
        self._rng = rng or random.Random()

    def model_routing(self, model: str) -> ModelRouting:
        """The model's routing entry (e.g. for its ``sticky_header`` and ``timeout_ms``)."""
        return self._config().for_model(model)

    def choose(
        self,
        model: str,
        *,
        version: int | None = None,
        label: str | None = None,
        sticky_key: str | None = None,
        rng: RandomSource | None = None,
    ) -> RouteDecision:
        """Decide the version for one request.

        An explicit version or label goes exactly there. Otherwise the request goes to the
        canary with probability ``canary_weight`` — decided by ``sticky_key``'s hash when
        given, so one user stays on one side — and to stable otherwise.
        """
        routing = self.model_routing(model)
        if version is not None and label is not None:
            raise InvalidArgument("give a model version or a version label, not both")
        if version is not None:
            return RouteDecision(version, "explicit", timeout_ms=routing.timeout_ms)
        if label is not None:
            if label not in routing.labels:
                known = ", ".join(sorted(routing.labels)) or "none"
                raise InvalidArgument(
                    f"Unrecognized servable version label: {label} (labels of {model}: {known})"
                )
            return RouteDecision(routing.labels[label], "explicit", timeout_ms=routing.timeout_ms)

        draw = rng or self._rng
        available = None if self._available is None else set(self._available(model))
        stable = routing.labels.get(STABLE)
        if stable is None:
            if not available:
                raise NotFound(f"Servable not found for request: Latest({model})")
            stable = max(available)
        chosen, route, failover = stable, STABLE, None
        canary = routing.labels.get(CANARY)
        if (
            canary is not None
            and canary != stable
            and routing.canary_weight > 0
            and (available is None or canary in available)
        ):
            point = sticky_fraction(model, sticky_key) if sticky_key is not None else draw.random()
            if point < routing.canary_weight:
                chosen, route = canary, CANARY
                failover = stable if routing.failover else None
        return RouteDecision(
            version=chosen,
            route=route,
            shadow_version=self._shadow(routing, chosen, available, draw),
            failover_version=failover,
            timeout_ms=routing.timeout_ms,
        )

    @staticmethod
    def _shadow(
        routing: ModelRouting, chosen: int, available: set[int] | None, draw: RandomSource
    ) -> int | None:
        target = routing.shadow_version()
        if (
            target is None
            or target == chosen
            or (available is not None and target not in available)
        ):
            return None
        return target if draw.random() * 100 < routing.shadow.percent else None
