"""The gateway behind both APIs: routing, batching, shadowing and failover of one request.

gRPC and REST are translations of the same calls on ``Gateway``, so a request behaves the
same (status codes, routing, metrics) whichever protocol carried it. Execution is
asynchronous: a request waits on its version's ``Batcher`` while the event loop keeps
accepting others; only the model itself runs on threads.

The model repository changes under the gateway (versions appear, unload, fail): it is
the source of truth for what can serve, and the gateway keeps one batcher per serving
version and signature, created on first use and closed once the version leaves
AVAILABLE. Remote models, the routing store, tf.Example decoding and the reading of
Classify/Regress answers are modules of their own; this one decides where a request
goes and what happens around its execution.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tensorflow.core.example.example_pb2 import Example

from serving import heap
from serving.backends import open_backend
from serving.batching import Batcher, BatchingConfig, shadow_batching
from serving.config import GatewayConfig
from serving.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ServingError,
    Unavailable,
    client_message,
    echo,
)
from serving.example_inputs import examples_to_inputs
from serving.feedback import FeedbackStore
from serving.feedback_relay import FeedbackRelay
from serving.health import Health
from serving.inference_results import classes_from_outputs, values_from_outputs
from serving.metrics import GatewayMetrics
from serving.pool_worker import PoolWorker
from serving.prediction_log import (
    FillLog,
    fill_classify,
    fill_predict,
    fill_regress,
    open_prediction_log,
)
from serving.remote_models import RemoteModels
from serving.repository import ModelRepository, Servable, VersionState, VersionStatus
from serving.request_id import new_request_id
from serving.routing import (
    CANARY,
    SHADOW,
    STABLE,
    ModelRouting,
    RouteDecision,
    Router,
    RoutingConfig,
)
from serving.routing_store import RoutingStore
from serving.shadow import compare_outputs
from serving.signature import Signature, Tensors
from serving.validation import validate_inputs

logger = logging.getLogger(__name__)

SHADOW_TIMEOUT_S = 10.0

# Inputs are decoded against the signature of the version the request is routed to
# (REST JSON needs its dtypes); gRPC tensors carry their own and ignore it. A source may
# return an awaitable (REST decodes large bodies in a worker process).
Inputs = Mapping[str, np.ndarray]
InputSource = Callable[[Signature], Inputs | Awaitable[Inputs]]


@dataclass(frozen=True)
class PredictResult:
    """A Predict answer: the version that served it, by which route, and its outputs."""

    model: str
    version: int
    signature_name: str
    outputs: Tensors
    route: str


@dataclass(frozen=True)
class ClassifyResult:
    """A Classify answer: per example, every class with its score."""

    model: str
    version: int
    signature_name: str
    classes: list[list[tuple[str, float]]]  # per example: (class label, score)


@dataclass(frozen=True)
class RegressResult:
    """A Regress answer: one value per example."""

    model: str
    version: int
    signature_name: str
    values: list[float]  # one per example


@dataclass(frozen=True)
class ModelMetadata:
    """What ``GetModelMetadata`` reports: the signatures of one version."""

    model: str
    version: int
    signatures: dict[str, Signature]


@dataclass
class _Outcome:
    """What one routed request ended up doing, for its metrics."""

    version: int | str = ""
    route: str = STABLE


@dataclass(frozen=True)
class _Executed:
    """A request that ran: where, with which inputs, what came out, and its manifest."""

    version: int
    route: str
    inputs: Tensors
    outputs: Tensors
    manifest: Mapping[str, Any] | None


class Gateway:
    """Everything a request needs once its protocol has been decoded.

    Public coroutines run on the gateway's event loop. ``start`` begins loading models
    in the background (``health.ready`` turns true when the first load is done);
    ``drain`` refuses new requests and waits for those in flight; ``stop`` unloads.
    """

    def __init__(
        self,
        model_root: str | Path,
        config: GatewayConfig | None = None,
        *,
        metrics: GatewayMetrics | None = None,
        health: Health | None = None,
        pool: PoolWorker | None = None,
    ) -> None:
        config = config or GatewayConfig()
        self.config = config if pool is None else pool.gateway_config(config)
        # A worker of a pool reads the disk when its supervisor says so (``sync_shared``).
        self.pool = pool
        self.model_root = Path(model_root)
        # The ways the root may appear in a message, spelled out once, not per error.
        self._root_spellings = [(str(self.model_root), "<model root>")]
        for spelled in (self.model_root.resolve, self.model_root.absolute):
            with contextlib.suppress(OSError, RuntimeError):
                self._root_spellings.append((str(spelled()), "<model root>"))
        self.metrics = metrics or GatewayMetrics()
        self.health = health or Health()
        self.health.require_model = not self.config.ready_without_models
        self.routing = RoutingStore.for_gateway(self.config, self.metrics.registry)
        self.remote = RemoteModels(self.config)
        self.repository = ModelRepository(
            self.model_root,
            policies={name: self.config.policy_for(name) for name in self.config.models},
            default_policy=self.config.version_policy,
            strict=self.config.strict,
            poll_interval=self.config.poll_interval_s if pool is None else None,
            backend_factory=self._open_backend,
            unload_timeout=self.config.grace_period_s,
            pinned=self.routed_versions,
        )
        self.router = Router(self.routing.current, self.available_versions)
        self.feedback = FeedbackStore(
            self.metrics,
            capacity=self.config.feedback.max_requests,
            ttl_s=self.config.feedback.ttl_s,
        )
        self._feedback_relay = (
            None if pool is None else FeedbackRelay(self.feedback, pool.sibling_sockets)
        )
        self.prediction_log = open_prediction_log(self.config.prediction_log, self.metrics)
        # (model, version, signature, shadow): mirrored copies queue apart (``_batcher``).
        self._batchers: dict[tuple[str, int, str, bool], Batcher] = {}
        # Per model, the highest version seen available: the one answering requests that
        # name no version when no label is 'stable' (see ``_note_default_version``).
        self._newest: dict[str, int] = {}
        self._batching: dict[str, BatchingConfig] = {}
        self._background: set[asyncio.Task[None]] = set()
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._draining = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loading: asyncio.Task[None] | None = None
        self._loaded = asyncio.Event()

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Read the routing file and start loading models (in the background)."""
        self._loop = asyncio.get_running_loop()
        await self.health.start()
        await self.routing.start()
        self.repository.add_listener(self._on_version_change)
        self._loading = self._loop.create_task(self._load())

    async def _load(self) -> None:
        await asyncio.gather(*(self._connect(model) for model in self.remote.models()))
        self.repository.start()
        await asyncio.to_thread(self.repository.wait_ready)
        heap.reclaim()  # before ready: the start-up's garbage goes, the rest is frozen
        await self._publish_health(loaded=True)
        self._loaded.set()
        self._warn_when_nothing_serves()
        while True:  # keep retrying remote servers that were down
            await asyncio.sleep(self.config.poll_interval_s)
            for model in self.remote.failed():
                if await self._connect(model):
                    await self._publish_health()

    async def wait_loaded(self) -> None:
        """Until the first load after ``start`` is done (whether or not a model serves)."""
        await self._loaded.wait()

    def sync_shared(self) -> None:
        """Re-read what a pool's workers share, soon: the disk and the routing file (the
        supervisor asks after one of them changed). Call on the event loop thread."""
        self.repository.request_poll()
        self._spawn(self._refresh_routing())

    async def _refresh_routing(self) -> None:
        try:
            await self.routing.refresh()
        except ServingError as exc:
            logger.error("routing not re-read: %s", exc.message)

    def _announce_change(self) -> None:
        if self.pool is not None:
            self.pool.announce_change()

    def _warn_when_nothing_serves(self) -> None:
        """After the first load: say so when no model can answer, naming the root."""
        models = set(self.repository.models()) | set(self.remote.models())
        if any(self.available_versions(model) for model in models):
            return
        waiting = (
            "reporting ready anyway (ready_without_models)"
            if self.config.ready_without_models
            else "/readyz reports not ready until one is"
        )
        if not models:
            logger.warning(
                "model root %s holds no models (expected %s/<model>/<version>/"
                "saved_model.pb); serving on and polling for one: %s",
                self.model_root, self.model_root, waiting,
            )  # fmt: skip
        else:
            logger.warning(
                "model root %s: no version of %s is available; serving on and polling: %s",
                self.model_root, ", ".join(sorted(models)), waiting,
            )  # fmt: skip

    async def _connect(self, model: str) -> bool:
        servable = await asyncio.to_thread(self.remote.connect, model)
        if servable is None:
            return False
        self.metrics.create_version_series(model, servable.version)
        self.metrics.set_model_loaded(model, servable.version, True)
        self.metrics.observe_model_load(model, servable.version, servable.load_seconds)
        return True

    async def drain(self, timeout: float) -> bool:
        """Refuse new requests, report not ready, and wait up to ``timeout`` seconds for
        the requests in flight; False if some were still running then."""
        self._draining = True
        await self.health.drain()
        try:
            async with asyncio.timeout(timeout):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True

    async def stop(self) -> None:
        """Stop loading, cancel shadow requests, close batchers and unload every model."""
        self._draining = True
        if self._loading is not None:
            self._loading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loading
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        batchers, self._batchers = list(self._batchers.values()), {}
        await asyncio.gather(*(batcher.close(drain=False) for batcher in batchers))
        if self._loop is not None:
            self.repository.remove_listener(self._on_version_change)
        await asyncio.to_thread(self.repository.stop)
        self.remote.close()
        if self._feedback_relay is not None:
            await self._feedback_relay.close()
        await self.routing.stop()
        if self.prediction_log is not None:
            await asyncio.to_thread(self.prediction_log.close)

    def _open_backend(self, path: Path) -> Any:
        backend = self.config.model(path.parent.name).backend
        return open_backend(path, num_threads=getattr(backend, "tflite_threads", 1))

    def _on_version_change(self, model: str, status: VersionStatus) -> None:
        """Repository listener (polling or unloading thread): hop onto the event loop.

        A loading version's series are created here, on the loading thread, so they
        exist before the version can answer its first request.
        """
        if status.state is VersionState.LOADING:
            self.metrics.create_version_series(model, status.version)
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._apply_version_change, model, status)

    def _apply_version_change(self, model: str, status: VersionStatus) -> None:
        available = status.state is VersionState.AVAILABLE
        self.metrics.set_model_loaded(model, status.version, available)
        if available:
            with contextlib.suppress(ServingError):
                servable = self.repository.servable(model, status.version)
                self.metrics.observe_model_load(model, status.version, servable.load_seconds)
            self._note_default_version(model, status.version)
        else:
            for key in [k for k in self._batchers if k[:2] == (model, status.version)]:
                self._spawn(self._batchers.pop(key).close(drain=True))
            if self._newest.get(model) == status.version:
                remaining = [v for v in self.available_versions(model) if v != status.version]
                self._newest[model] = max(remaining, default=0)
        if self.repository.wait_ready(0):
            if available:
                heap.freeze_loaded()
            elif status.state is VersionState.END:
                heap.reclaim()
            self._spawn(self._publish_health())

    def _note_default_version(self, model: str, version: int) -> None:
        """Say so when a new version takes over the requests that name no version.

        Without a ``stable`` label those go to the highest available version, as with
        TF Serving's ``latest`` policy; with one, a new version gets no traffic until
        routing gives it some, and nothing is said. The version it takes over from is the
        one remembered, not read from what is loaded now: the policy may already have
        unloaded it by the time this change is applied.
        """
        previous = self._newest.get(model, 0)
        if version <= previous:
            return
        self._newest[model] = version
        routing = self.router.model_routing(model)
        if not previous or STABLE in routing.labels:
            return
        if routing.labels:
            logger.warning(
                "model %s: version %d now answers every request that names no version or "
                "label, in place of version %d: the routing labels %s but no 'stable' "
                "version; label the version that should keep that traffic 'stable'",
                model, version, previous,
                ", ".join(f"{k}={v}" for k, v in sorted(routing.labels.items())),
            )  # fmt: skip
        else:
            logger.info(
                "model %s: version %d now answers requests that name no version (the "
                "highest available; version %d did before); to run a new version as a "
                "canary instead, label the serving one 'stable' before publishing",
                model, version, previous,
            )  # fmt: skip

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        """Run a background task, keeping a reference until it is done (``stop`` cancels it)."""
        task = asyncio.get_running_loop().create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _publish_health(self, *, loaded: bool = False) -> None:
        models = set(self.repository.models()) | set(self.remote.models())
        await self.health.update(
            {model: bool(self.available_versions(model)) for model in models},
            loaded=loaded,
        )

    # -- what clients see ----------------------------------------------------------------

    def client_message(self, message: str, *, log: bool = True) -> str:
        """``message`` without the server's paths or overlong echoes of client input (see
        ``serving.errors.client_message``); with ``log`` the full message is logged here
        (a version's load error, shown by GetModelStatus, was logged when it failed)."""
        cleaned = client_message(message, self._root_spellings)
        if log and cleaned != message and len(message) <= 4 * len(cleaned) + 1000:
            logger.info("answered a client with %r; in full: %s", cleaned, message)
        return cleaned

    # -- lookups ------------------------------------------------------------------------

    def routed_versions(self, model: str) -> set[int]:
        """The versions the routing in force names for ``model`` (labels and shadow): the
        repository keeps them loaded whatever the version policy selects."""
        routing = self.routing.current().for_model(model)
        named = set(routing.labels.values())
        if routing.shadow is not None and routing.shadow.version is not None:
            named.add(routing.shadow.version)
        return named

    def available_versions(self, model: str) -> list[int]:
        if model in self.remote:
            return self.remote.versions(model)
        return self.repository.versions(model)

    def _known(self, model: str) -> bool:
        return model in self.remote or self.repository.knows(model)

    def _servable(self, model: str, version: int | None) -> Servable:
        if model in self.remote:
            return self.remote.servable(model, version)
        return self.repository.servable(model, version)

    def _resolve(self, model: str, version: int | None, label: str | None) -> int:
        """The version a metadata/status call means: explicit, by label, or the default
        one (the ``stable`` label, else the highest available)."""
        self._check_known(model)
        if version is not None and label is not None:
            raise InvalidArgument("give a model version or a version label, not both")
        routing = self.router.model_routing(model)
        if label is not None:
            self._check_label(model, label)
            return routing.labels[label]
        if version is not None:
            return version
        available = self.available_versions(model)
        if STABLE in routing.labels and routing.labels[STABLE] in available:
            return routing.labels[STABLE]
        if not available:
            raise NotFound(f"model {model!r} has no available version")
        return available[-1]

    def candidate_signatures(
        self, model: str, version: int | None, label: str | None
    ) -> dict[str, list[Signature]]:
        """The distinct signatures, by name, of every version a request naming ``version``
        or ``label`` may be routed to (all available versions when it names neither), so
        that a body can be decoded before routing picks one of them. Empty when nothing
        fits: the request then fails as routing says."""
        if not self._known(model):
            return {}
        if version is not None:
            versions = [version]
        elif label is not None:
            labels = self.router.model_routing(model).labels
            versions = [labels[label]] if label in labels else []
        else:
            versions = self.available_versions(model)
        found: dict[str, list[Signature]] = {}
        for number in versions:
            try:
                signatures = self._servable(model, number).signatures
            except ServingError:
                continue
            for name, signature in signatures.items():
                known = found.setdefault(name, [])
                if signature not in known:
                    known.append(signature)
        return found

    def _check_known(self, model: str, message: str = "model {model} not found") -> None:
        if not self._known(model):
            raise NotFound(message.format(model=echo(model)))

    def _check_label(self, model: str, label: str) -> None:
        """Refuse a label the model does not have, echoing at most a short part of it."""
        labels = self.router.model_routing(model).labels
        if label not in labels:
            known = ", ".join(sorted(labels)) or "none"
            raise InvalidArgument(
                f"Unrecognized servable version label: {echo(label)[1:-1]} "
                f"(labels of {model}: {known})"
            )

    def _role(self, model: str, version: int) -> str:
        """The route label a version's batch metrics carry: the part it plays now."""
        labels = self.router.model_routing(model).labels
        if labels.get(CANARY) == version:
            return CANARY
        if labels.get(STABLE, version) == version:
            return STABLE
        return "explicit"

    def _batcher(self, servable: Servable, signature_name: str, *, shadow: bool) -> Batcher:
        """The batch queue of one (model, version, signature), or its shadow queue.

        Mirrored copies never queue with the requests clients wait for: a shadow queue
        has one batch thread and a quarter of the queue bound (``shadow_batching``), and
        a copy it has no room for is dropped (counted as UNAVAILABLE) rather than
        delaying or refusing a real request to the same version.
        """
        key = (servable.model, servable.version, signature_name, shadow)
        batcher = self._batchers.get(key)
        if batcher is None:
            model, version = servable.model, servable.version

            def run(inputs: Tensors) -> Tensors:
                return servable.run(signature_name, inputs)

            def role() -> str:
                return SHADOW if shadow else self._role(model, version)

            config = self.batching_config(model)
            batcher = Batcher(
                run,
                shadow_batching(config) if shadow else config,
                observer=self.metrics.batch_observer(model, version, role),
            )
            self._batchers[key] = batcher
        return batcher

    # -- requests -----------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _admitted(self) -> AsyncIterator[None]:
        """Count a request in flight; refuse it while draining."""
        if self._draining:
            raise Unavailable("the server is shutting down; retry on another replica")
        self._in_flight += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()

    def _decide(
        self, model: str, version: int | None, label: str | None, headers: Mapping[str, str] | None
    ) -> RouteDecision:
        self._check_known(model, "Servable not found for request: model {model} is not served here")
        if label is not None and version is None:
            self._check_label(model, label)
        sticky_header = self.router.model_routing(model).sticky_header
        sticky_key = (headers or {}).get(sticky_header) if sticky_header else None
        return self.router.choose(model, version=version, label=label, sticky_key=sticky_key)

    async def _execute(
        self,
        model: str,
        version: int,
        signature_name: str,
        source: InputSource,
        deadline: float | None,
        *,
        shadow: bool = False,
    ) -> tuple[Tensors, Tensors, Mapping[str, Any] | None]:
        """Validate and run one request (or a mirrored copy of one) on one version:
        (inputs, outputs, manifest)."""
        servable = self._servable(model, version)
        with servable:
            signature = servable.signatures.get(signature_name)
            if signature is None:
                # TF Serving's answer: the request does not fit the model (HTTP 400); the
                # model and version exist, so it is not NOT_FOUND.
                known = ", ".join(sorted(servable.signatures)) or "none"
                raise FailedPrecondition(
                    f"Serving signature key {echo(signature_name)} not found in model "
                    f"{model!r} version {version}; available signatures: {known}"
                )
            decoded = source(signature)
            if hasattr(decoded, "__await__"):  # decoded off the loop (a big REST body)
                decoded = await decoded
            inputs = validate_inputs(decoded, signature, max_bytes=self.config.max_message_bytes)
            batcher = self._batcher(servable, signature_name, shadow=shadow)
            with self.metrics.track_in_flight(model, version):
                outputs = await batcher.submit(inputs, deadline)
        return inputs, outputs, servable.manifest

    async def _run(
        self,
        model: str,
        version: int | None,
        label: str | None,
        signature_name: str,
        source: InputSource,
        *,
        deadline: float | None,
        headers: Mapping[str, str] | None,
        api: str,
    ) -> _Executed:
        """Route, execute (failing over and shadowing as configured), and record metrics."""
        started = time.monotonic()
        outcome = _Outcome(route="explicit" if version is not None or label is not None else STABLE)
        try:
            async with self._admitted():
                decision = self._decide(model, version, label, headers)
                try:
                    executed = await self._attempt(
                        model, decision, signature_name, source, deadline, api, outcome
                    )
                except NotFound:
                    if decision.route == "explicit":
                        raise
                    # The routed version was unloaded between routing and lookup (a hot
                    # swap); route again onto what is serving now.
                    decision = self._decide(model, version, label, headers)
                    executed = await self._attempt(
                        model, decision, signature_name, source, deadline, api, outcome
                    )
        except BaseException as exc:
            code = _code_name(exc)
            if code == "CANCELLED" and deadline is not None and time.monotonic() >= deadline:
                code = "DEADLINE_EXCEEDED"  # the server cancels calls whose deadline passed
            self._observe(model, outcome.version, outcome.route, code, api, started)
            raise
        self._observe(model, executed.version, executed.route, "OK", api, started)
        if decision.shadow_version is not None:
            self._mirror(model, decision.shadow_version, signature_name, executed, api)
        return executed

    async def _attempt(
        self,
        model: str,
        decision: RouteDecision,
        signature_name: str,
        source: InputSource,
        deadline: float | None,
        api: str,
        outcome: _Outcome,
    ) -> _Executed:
        outcome.version, outcome.route = decision.version, decision.route
        attempt_deadline = deadline
        if decision.timeout_ms is not None:
            limit = time.monotonic() + decision.timeout_ms / 1000
            attempt_deadline = limit if deadline is None else min(deadline, limit)
        attempt_started = time.monotonic()
        try:
            inputs, outputs, manifest = await self._execute(
                model, decision.version, signature_name, source, attempt_deadline
            )
            return _Executed(decision.version, decision.route, inputs, outputs, manifest)
        except Exception as exc:
            fallback = decision.failover_version
            if fallback is None or (deadline is not None and time.monotonic() >= deadline):
                raise
            # Counted against the canary, invisible to the client.
            self._observe(
                model, decision.version, decision.route, _code_name(exc), api, attempt_started
            )
            self.metrics.observe_failover(model, decision.version, fallback)
            logger.warning(
                "model %s: canary version %s failed (%s); retrying on version %s",
                model, decision.version, _code_name(exc), fallback,
            )  # fmt: skip
        outcome.version, outcome.route = fallback, STABLE
        inputs, outputs, manifest = await self._execute(
            model, fallback, signature_name, source, deadline
        )
        return _Executed(fallback, STABLE, inputs, outputs, manifest)

    def _observe(
        self, model: str, version: int | str, route: str, code: str, api: str, started: float
    ) -> None:
        # Model names and versions come from clients: never let them mint new series. A
        # version with no series (made up, or never seen here) is counted as "unknown".
        name = model if self._known(model) else ""
        label = self.metrics.version_label(name, version if version != "" else None)
        self.metrics.observe_request(name, label, route, code, api, time.monotonic() - started)

    def _mirror(
        self, model: str, version: int, signature_name: str, primary: _Executed, api: str
    ) -> None:
        """Send a copy of a served request to ``version`` in the background and compare."""

        async def shadow() -> None:
            started = time.monotonic()
            try:
                _, outputs, _ = await self._execute(
                    model, version, signature_name, lambda _sig: primary.inputs,
                    started + SHADOW_TIMEOUT_S, shadow=True,
                )  # fmt: skip
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                code = _code_name(exc)
                self.metrics.observe_shadow(model, version, code)
                self._observe(model, version, SHADOW, code, api, started)
                return
            agreement, difference = compare_outputs(primary.outputs, outputs)
            self.metrics.observe_shadow(
                model, version, "OK", agreement=agreement, abs_diff=difference
            )
            self._observe(model, version, SHADOW, "OK", api, started)

        self._spawn(shadow())

    async def predict(
        self,
        model: str,
        version: int | None,
        label: str | None,
        signature_name: str,
        inputs: InputSource,
        *,
        deadline: float | None = None,
        headers: Mapping[str, str] | None = None,
        output_filter: Sequence[str] = (),
        api: str = "grpc",
        request_id: str | None = None,
    ) -> PredictResult:
        """Run ``signature_name`` on the routed version; ``inputs`` decodes the request
        against that version's signature. ``output_filter`` keeps only the named outputs.
        ``request_id`` is the key of the answer for feedback and the prediction log."""

        def source(signature: Signature) -> Inputs | Awaitable[Inputs]:
            unknown = [name for name in output_filter if name not in signature.outputs]
            if unknown:
                raise InvalidArgument(
                    f"output_filter: unknown output {unknown[0]!r}; signature "
                    f"{signature.name!r} returns {', '.join(signature.outputs)}"
                )
            return inputs(signature)

        executed = await self._run(
            model, version, label, signature_name, source,
            deadline=deadline, headers=headers, api=api,
        )  # fmt: skip
        outputs = executed.outputs
        if output_filter:
            outputs = {name: outputs[name] for name in output_filter}
        self._answered(
            request_id, model, signature_name, executed, fill_predict(executed.inputs, outputs)
        )
        return PredictResult(model, executed.version, signature_name, outputs, executed.route)

    async def classify(
        self,
        model: str,
        version: int | None,
        label: str | None,
        signature_name: str,
        examples: Sequence[Example],
        context: Example | None = None,
        *,
        deadline: float | None = None,
        headers: Mapping[str, str] | None = None,
        api: str = "grpc",
        request_id: str | None = None,
    ) -> ClassifyResult:
        """Classes with scores per tf.Example (see ``classes_from_outputs``)."""
        executed = await self._run(
            model, version, label, signature_name,
            lambda signature: examples_to_inputs(examples, context, signature),
            deadline=deadline, headers=headers, api=api,
        )  # fmt: skip
        classes = classes_from_outputs(executed.outputs, executed.manifest, len(examples))
        self._answered(
            request_id, model, signature_name, executed, fill_classify(examples, context, classes)
        )
        return ClassifyResult(model, executed.version, signature_name, classes)

    async def regress(
        self,
        model: str,
        version: int | None,
        label: str | None,
        signature_name: str,
        examples: Sequence[Example],
        context: Example | None = None,
        *,
        deadline: float | None = None,
        headers: Mapping[str, str] | None = None,
        api: str = "grpc",
        request_id: str | None = None,
    ) -> RegressResult:
        """One value per tf.Example (see ``values_from_outputs``)."""
        executed = await self._run(
            model, version, label, signature_name,
            lambda signature: examples_to_inputs(examples, context, signature),
            deadline=deadline, headers=headers, api=api,
        )  # fmt: skip
        values = values_from_outputs(executed.outputs, executed.manifest, len(examples))
        self._answered(
            request_id, model, signature_name, executed, fill_regress(examples, context, values)
        )
        return RegressResult(model, executed.version, signature_name, values)

    def _answered(
        self,
        request_id: str | None,
        model: str,
        signature_name: str,
        executed: _Executed,
        fill_log: FillLog,
    ) -> None:
        """Remember what was served for later labels and, if sampled, log it."""
        request_id = request_id or new_request_id()
        self.feedback.remember(
            request_id, model, executed.version, executed.route, executed.outputs,
            executed.manifest,
        )  # fmt: skip
        if self.prediction_log is not None:
            self.prediction_log.submit(
                request_id, model, executed.version, signature_name, fill_log
            )

    async def metadata(self, model: str, version: int | None, label: str | None) -> ModelMetadata:
        async with self._admitted():
            number = self._resolve(model, version, label)
            servable = self._servable(model, number)
            return ModelMetadata(model, number, dict(servable.signatures))

    def status(self, model: str, version: int | None, label: str | None) -> list[VersionStatus]:
        """``GetModelStatus``: every version of ``model``, or the one named."""
        self._check_known(model)
        if label is not None:
            version = self._resolve(model, None, label)
        if model in self.remote:
            return self.remote.status(model, version)
        return self.repository.status(model, version)

    # -- administration -----------------------------------------------------------------

    def routing_config(self) -> RoutingConfig:
        return self.routing.current()

    async def set_routing(self, config: RoutingConfig) -> None:
        await self.routing.replace(config)
        self._announce_change()

    async def set_model_routing(self, model: str, routing: ModelRouting | None) -> None:
        """Replace (or with None, remove) one model's routing."""
        if not self._known(model):
            raise NotFound(f"model {model!r} not found")
        models = dict(self.routing.current().models)
        if routing is None:
            models.pop(model, None)
        else:
            models[model] = routing
        await self.routing.replace(RoutingConfig(models=models))
        self._announce_change()

    async def set_version_labels(self, labels: Mapping[str, Mapping[str, int]]) -> None:
        """TF Serving's ``version_labels``: set each listed model's labels (others keep
        theirs). Every label must point at an AVAILABLE version."""
        models = dict(self.routing.current().models)
        for model, model_labels in labels.items():
            if not self._known(model):
                raise NotFound(f"model {model!r} not found")
            available = self.available_versions(model)
            for name, number in model_labels.items():
                if number not in available:
                    listed = ", ".join(map(str, available)) or "none"
                    raise FailedPrecondition(
                        f"model {model!r}: label {name!r} points at version {number}, which "
                        f"is not available (available versions: {listed})"
                    )
            current = models.get(model, ModelRouting()).model_dump()
            try:
                models[model] = ModelRouting.model_validate(
                    {**current, "labels": dict(model_labels)}
                )
            except ValueError as exc:
                raise InvalidArgument(f"model {model!r}: {_first_error(exc)}") from None
        await self.routing.replace(RoutingConfig(models=models))
        self._announce_change()

    def batching_config(self, model: str) -> BatchingConfig:
        if not self._known(model):
            raise NotFound(f"model {model!r} not found")
        return self._batching.get(model) or self.config.batching_for(model)

    def set_batching_config(self, model: str, config: BatchingConfig) -> None:
        """Change a model's batching at run time (kept until restart)."""
        if not self._known(model):
            raise NotFound(f"model {model!r} not found")
        if self.pool is not None:
            raise FailedPrecondition(
                "batching cannot change at run time in a pool of processes (--processes): "
                "only the worker answering would apply it; set it in gateway.yaml"
            )
        self._batching[model] = config
        for (name, _, _, shadow), batcher in self._batchers.items():
            if name == model:
                batcher.update_config(shadow_batching(config) if shadow else config)

    async def reload(self) -> None:
        """Rescan the model root and re-read the routing file now."""
        await asyncio.to_thread(self.repository.poll)
        for model in self.remote.failed():
            await self._connect(model)
        await self.routing.refresh()
        await self._publish_health()
        self._announce_change()

    async def submit_feedback(self, model: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Count labels for answered requests (see ``serving.feedback``); in a pool, also
        for the answers of the other workers."""
        if self._feedback_relay is None:
            return self.feedback.submit(model, body)
        return await self._feedback_relay.submit(model, body)


def _code_name(exc: BaseException) -> str:
    if isinstance(exc, ServingError):
        return exc.code.name
    if isinstance(exc, asyncio.CancelledError):
        return "CANCELLED"
    return "INTERNAL"


def _first_error(exc: ValueError) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        return "; ".join(error["msg"].removeprefix("Value error, ") for error in errors())
    return str(exc)
