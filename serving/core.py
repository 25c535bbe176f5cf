"""The gateway behind both APIs: routing, batching, shadowing and failover of one request.

gRPC and REST are translations of the same calls on ``Gateway``, so a request behaves the
same (status codes, routing, metrics) whichever protocol carried it. Execution is
asynchronous: a request waits on its version's ``Batcher`` while the event loop keeps
accepting others; only the model itself runs on threads.

The model repository changes under the gateway (versions appear, unload, fail): it is
the source of truth for what can serve, and the gateway keeps one batcher per serving
version and signature, created on first use and closed once the version leaves
AVAILABLE.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from tensorflow.core.example.example_pb2 import Example
from tensorflow.core.example.feature_pb2 import Feature

from serving.backends import open_backend
from serving.batching import Batcher, BatchingConfig
from serving.config import GatewayConfig, RemoteBackend
from serving.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ServingError,
    Unavailable,
    as_serving_error,
)
from serving.health import Health
from serving.metrics import GatewayMetrics
from serving.repository import ModelRepository, Servable, VersionState, VersionStatus
from serving.routing import (
    CANARY,
    STABLE,
    ModelRouting,
    RouteDecision,
    Router,
    RoutingConfig,
    RoutingWatcher,
    write_routing,
)
from serving.signature import STRING, Signature, TensorSpec
from serving.validation import validate_inputs

logger = logging.getLogger(__name__)

DEFAULT_SIGNATURE = "serving_default"
CLASSIFY_METHOD = "tensorflow/serving/classify"
REGRESS_METHOD = "tensorflow/serving/regress"
# Output names TF Serving's classify / regress signatures use.
SCORES_OUTPUT, CLASSES_OUTPUT, REGRESS_OUTPUT = "scores", "classes", "outputs"
SHADOW_TIMEOUT_S = 10.0

Tensors = dict[str, np.ndarray]
# Inputs are decoded against the signature of the version the request is routed to
# (REST JSON needs its dtypes); gRPC tensors carry their own and ignore it.
InputSource = Callable[[Signature], Mapping[str, np.ndarray]]


@dataclass(frozen=True)
class PredictResult:
    model: str
    version: int
    signature_name: str
    outputs: Tensors
    route: str


@dataclass(frozen=True)
class ClassifyResult:
    model: str
    version: int
    signature_name: str
    classes: list[list[tuple[str, float]]]  # per example: (class label, score)


@dataclass(frozen=True)
class RegressResult:
    model: str
    version: int
    signature_name: str
    values: list[float]  # one per example


@dataclass(frozen=True)
class ModelMetadata:
    model: str
    version: int
    signatures: dict[str, Signature]


# --------------------------------------------------------------------------- tf.Example


def examples_to_inputs(
    examples: Sequence[Example], context: Example | None, signature: Signature
) -> Tensors:
    """Batch tensors for ``signature`` from tf.Examples, feature name = input name.

    Features of ``context`` apply to every example (an example's own feature wins). A
    signature with one string input and no feature of that name takes the serialized
    examples themselves, as TF Serving's classify/regress signatures do.
    """
    if not examples:
        raise InvalidArgument("input: no examples")
    merged = [_with_context(example, context) for example in examples]
    names = list(signature.inputs)
    if (
        len(names) == 1
        and signature.inputs[names[0]].dtype is STRING
        and not any(names[0] in example.features.feature for example in merged)
    ):
        serialized = np.empty(len(merged), dtype=object)
        serialized[:] = [example.SerializeToString() for example in merged]
        return {names[0]: serialized}
    inputs = {}
    for name, spec in signature.inputs.items():
        rows = []
        for index, example in enumerate(merged):
            features = example.features.feature
            if name not in features:
                raise InvalidArgument(
                    f"example {index}: missing feature {name!r}; signature {signature.name!r} "
                    f"takes {signature.describe_inputs()}"
                )
            rows.append(_feature_to_array(features[name], spec, f"example {index}"))
        try:
            inputs[name] = np.stack(rows)
        except ValueError:
            raise InvalidArgument(
                f"feature {name!r}: examples give it different numbers of values"
            ) from None
    return inputs


def _with_context(example: Example, context: Example | None) -> Example:
    if context is None or not context.features.feature:
        return example
    merged = Example()
    merged.CopyFrom(context)
    for name, feature in example.features.feature.items():
        merged.features.feature[name].CopyFrom(feature)
    return merged


def _feature_to_array(feature: Feature, spec: TensorSpec, where: str) -> np.ndarray:
    """One example's values for ``spec``, shaped like the spec without its batch dim."""
    kind = feature.WhichOneof("kind")
    label = f"{where}: feature {spec.name!r}"
    expected = spec.describe()
    if spec.dtype is STRING:
        if kind not in ("bytes_list", None):
            raise InvalidArgument(f"{label}: expected bytes_list for {expected}, got {kind}")
        values = np.empty(len(feature.bytes_list.value), dtype=object)
        values[:] = list(feature.bytes_list.value)
    elif kind == "float_list":
        if spec.dtype.kind != "f":
            raise InvalidArgument(f"{label}: expected int64_list for {expected}, got float_list")
        values = np.asarray(feature.float_list.value, dtype=spec.dtype)
    elif kind == "int64_list":
        if spec.dtype.kind not in "iuf":
            raise InvalidArgument(f"{label}: expected {spec.dtype_name} values, got int64_list")
        values = np.asarray(feature.int64_list.value, dtype=np.int64)
        if spec.dtype.kind in "iu":
            limits = np.iinfo(spec.dtype)
            if values.size and (values.min() < limits.min or values.max() > limits.max):
                raise InvalidArgument(f"{label}: value out of range for {spec.dtype_name}")
        values = values.astype(spec.dtype)
    elif kind is None:
        values = np.zeros(0, dtype=spec.dtype)
    else:
        raise InvalidArgument(f"{label}: expected values for {expected}, got {kind}")
    inner = None if spec.shape is None else spec.shape[1:]
    if inner is None:
        return values
    known = int(np.prod([d for d in inner if d is not None], dtype=np.int64))
    free = [axis for axis, d in enumerate(inner) if d is None]
    if (not free and values.size != known) or (
        free and (len(free) > 1 or known == 0 or values.size % known)
    ):
        raise InvalidArgument(f"{label}: {values.size} values do not fit {expected}")
    shape = tuple(values.size // known if d is None else d for d in inner)
    return values.reshape(shape)


def _manifest_classes(manifest: Mapping[str, Any] | None, output: str) -> list[str] | None:
    labels = (manifest or {}).get("labels")
    entry = labels.get(output) if isinstance(labels, Mapping) else None
    classes = entry.get("classes") if isinstance(entry, Mapping) else None
    if isinstance(classes, list) and all(isinstance(name, str) for name in classes):
        return classes
    return None


def _labelled_output(
    outputs: Mapping[str, np.ndarray], manifest: Mapping[str, Any] | None, kind: str
) -> str | None:
    labels = (manifest or {}).get("labels")
    if not isinstance(labels, Mapping):
        return None
    found = [
        name
        for name, entry in labels.items()
        if name in outputs and isinstance(entry, Mapping) and entry.get("kind") == kind
    ]
    return found[0] if len(found) == 1 else None


def _pick_output(
    outputs: Mapping[str, np.ndarray],
    manifest: Mapping[str, Any] | None,
    preferred: str,
    kind: str,
    fits: Callable[[np.ndarray], bool],
) -> str:
    """The output a classify/regress call reads: TF Serving's name for it, else the one
    slipway.json labels with ``kind``, else the only output whose shape ``fits``."""
    if preferred in outputs:
        return preferred
    if len(outputs) == 1:
        return next(iter(outputs))
    labelled = _labelled_output(outputs, manifest, kind)
    if labelled is not None:
        return labelled
    fitting = [name for name, array in outputs.items() if fits(np.asarray(array))]
    if len(fitting) == 1:
        return fitting[0]
    raise FailedPrecondition(
        f"cannot tell which of the outputs ({', '.join(outputs)}) holds the {kind} result: "
        f"name it {preferred!r} or label it {kind!r} in slipway.json"
    )


def _is_scores(array: np.ndarray) -> bool:
    return array.ndim == 2 and array.shape[1] > 1 and array.dtype.kind == "f"


def _is_one_value(array: np.ndarray) -> bool:
    return (
        array.ndim == 1 or (array.ndim == 2 and array.shape[1] == 1)
    ) and array.dtype.kind in "fiu"


def classes_from_outputs(
    outputs: Mapping[str, np.ndarray], manifest: Mapping[str, Any] | None, examples: int
) -> list[list[tuple[str, float]]]:
    """Per example, every class with its score, in the model's class order.

    Class names come from a ``classes`` output, else slipway.json's
    ``labels.<output>.classes``, else the class index as text.
    """
    candidates = {k: v for k, v in outputs.items() if k != CLASSES_OUTPUT}
    name = _pick_output(candidates, manifest, SCORES_OUTPUT, "classification", _is_scores)
    scores = np.asarray(outputs[name])
    if scores.ndim == 1:
        scores = scores[:, None]
    if scores.ndim != 2 or scores.shape[0] != examples or scores.dtype.kind not in "fiu":
        raise FailedPrecondition(
            f"output {name!r} has shape {list(scores.shape)} ({scores.dtype}); classification "
            f"needs numeric scores of shape [{examples}, classes]"
        )
    count = scores.shape[1]
    if CLASSES_OUTPUT in outputs and np.shape(outputs[CLASSES_OUTPUT]) == scores.shape:
        rows = [
            [
                item.decode("utf-8", "replace") if isinstance(item, bytes) else str(item)
                for item in row
            ]
            for row in np.asarray(outputs[CLASSES_OUTPUT]).tolist()
        ]
    else:
        names = _manifest_classes(manifest, name)
        if names is None or len(names) != count:
            names = [str(index) for index in range(count)]
        rows = [names] * examples
    return [
        list(zip(labels, (float(score) for score in row), strict=True))
        for labels, row in zip(rows, scores.tolist(), strict=True)
    ]


def values_from_outputs(
    outputs: Mapping[str, np.ndarray], manifest: Mapping[str, Any] | None, examples: int
) -> list[float]:
    """One regression value per example, from an output of shape [examples] or [examples, 1]."""
    name = _pick_output(outputs, manifest, REGRESS_OUTPUT, "regression", _is_one_value)
    values = np.asarray(outputs[name])
    if values.ndim == 2 and values.shape[1] == 1:
        values = values[:, 0]
    if values.shape != (examples,) or values.dtype.kind not in "fiu":
        raise FailedPrecondition(
            f"output {name!r} has shape {list(np.shape(outputs[name]))}; regression needs one "
            f"number per example ([{examples}] or [{examples}, 1])"
        )
    return [float(value) for value in values.tolist()]


# --------------------------------------------------------------------------- shadow


def compare_outputs(
    primary: Mapping[str, np.ndarray], shadow: Mapping[str, np.ndarray]
) -> tuple[float | None, float | None]:
    """(top-1 agreement, mean absolute difference) between two answers to one request.

    Agreement is the fraction of rows whose arg-max matches, over the first output
    with class scores (rank 2, more than one column); the difference averages every
    numeric output both answers share with the same shape. None when not comparable.
    """
    agreement = None
    differences = []
    for name, first in primary.items():
        second = shadow.get(name)
        if second is None or np.shape(first) != np.shape(second):
            continue
        first, second = np.asarray(first), np.asarray(second)
        if first.dtype.kind not in "fiub" or second.dtype.kind not in "fiub" or first.size == 0:
            continue
        if agreement is None and first.ndim == 2 and first.shape[1] > 1:
            agreement = float(np.mean(first.argmax(axis=1) == second.argmax(axis=1)))
        differences.append(np.abs(first.astype(np.float64) - second.astype(np.float64)).mean())
    return agreement, (float(np.mean(differences)) if differences else None)


# --------------------------------------------------------------------------- routing store


class RoutingStore:
    """The routing config in force: the shared routing file when one is configured
    (re-read on change, written atomically on admin changes), else kept in memory."""

    def __init__(self, path: Path | None, *, interval: float = 1.0) -> None:
        self.path = path
        self._watcher = None if path is None else RoutingWatcher(path, interval=interval)
        self._memory = RoutingConfig()

    def current(self) -> RoutingConfig:
        return self._memory if self._watcher is None else self._watcher.current

    async def start(self) -> None:
        if self._watcher is None:
            return
        if not self.path.exists():
            await asyncio.to_thread(write_routing, self.path, RoutingConfig())
        await self._watcher.start()

    async def stop(self) -> None:
        if self._watcher is not None:
            await self._watcher.stop()

    async def replace(self, config: RoutingConfig) -> None:
        if self._watcher is None:
            self._memory = config
            return
        try:
            await asyncio.to_thread(write_routing, self.path, config)
        except OSError as exc:
            raise Unavailable(f"cannot write the routing file {self.path}: {exc}") from None
        await self._watcher.refresh()

    async def refresh(self) -> None:
        """Re-read the file now; a file that does not parse keeps the last good config."""
        if self._watcher is not None:
            await self._watcher.refresh()
            if self._watcher.last_error is not None:
                raise FailedPrecondition(f"routing file not applied: {self._watcher.last_error}")


# --------------------------------------------------------------------------- remote models


class RemoteModels:
    """Models served by another model server, one servable each.

    A remote model shows up as a single version: the remote version it is pinned to,
    or 1 when it follows the remote's latest (or labelled) version. A failed connection
    leaves it in END with the error, like a version that failed to load, and is retried
    every poll interval.
    """

    def __init__(self, config: GatewayConfig) -> None:
        self._specs = {
            name: model.backend
            for name, model in config.models.items()
            if isinstance(model.backend, RemoteBackend)
        }
        self._max_message_bytes = config.max_message_bytes
        self._servables: dict[str, Servable] = {}
        self._errors: dict[str, ServingError] = {}

    def __contains__(self, model: str) -> bool:
        return model in self._specs

    def models(self) -> list[str]:
        return sorted(self._specs)

    @staticmethod
    def version_of(spec: RemoteBackend) -> int:
        return spec.version if spec.version is not None else 1

    def connect(self, model: str) -> Servable | None:
        """Open the connection (blocking; run it off the event loop)."""
        from serving.backends.remote import RemoteBackend as RemoteClient

        spec = self._specs[model]
        started = time.monotonic()
        tls = spec.tls
        try:
            backend = RemoteClient(
                spec.target,
                spec.model_name or model,
                spec.version if spec.version is not None else spec.label,
                pool_size=spec.pool_size,
                tls=tls is not None,
                root_certificates=_read(tls.ca) if tls else None,
                private_key=_read(tls.key) if tls else None,
                certificate_chain=_read(tls.cert) if tls else None,
                max_message_bytes=self._max_message_bytes,
            )
        except Exception as exc:
            self._errors[model] = as_serving_error(exc, default=grpc.StatusCode.UNAVAILABLE)
            logger.error("remote model %s at %s: %s", model, spec.target, self._errors[model])
            return None
        self._errors.pop(model, None)
        servable = Servable(
            model, self.version_of(spec), Path(spec.target), backend, None,
            time.monotonic() - started,
        )  # fmt: skip
        self._servables[model] = servable
        return servable

    def failed(self) -> list[str]:
        return [model for model in self._specs if model not in self._servables]

    def versions(self, model: str) -> list[int]:
        servable = self._servables.get(model)
        return [] if servable is None else [servable.version]

    def servable(self, model: str, version: int | None) -> Servable:
        servable = self._servables.get(model)
        if servable is None:
            error = self._errors.get(model)
            reason = f": {error.message}" if error else ""
            raise Unavailable(f"remote model {model!r} is not connected{reason}")
        if version is not None and version != servable.version:
            raise NotFound(
                f"model {model!r} version {version} is not available; "
                f"available versions: {servable.version}"
            )
        return servable

    def status(self, model: str, version: int | None) -> list[VersionStatus]:
        spec = self._specs[model]
        number = self.version_of(spec)
        if version is not None and version != number:
            raise NotFound(f"could not find version {version} of model {model!r}")
        if model in self._servables:
            return [VersionStatus(number, VersionState.AVAILABLE)]
        error = self._errors.get(model)
        if error is None:
            return [VersionStatus(number, VersionState.LOADING)]
        return [VersionStatus(number, VersionState.END, error.error_code, error.message)]

    def close(self) -> None:
        for servable in self._servables.values():
            servable.backend.close()
        self._servables.clear()


def _read(path: Path | None) -> bytes | None:
    return None if path is None else path.read_bytes()


# --------------------------------------------------------------------------- gateway


@dataclass
class _Outcome:
    """What one routed request ended up doing, for its metrics."""

    version: int | str = ""
    route: str = STABLE


@dataclass(frozen=True)
class _Executed:
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
    ) -> None:
        self.config = config or GatewayConfig()
        self.model_root = Path(model_root)
        self.metrics = metrics or GatewayMetrics()
        self.health = health or Health()
        self.routing = RoutingStore(self.config.routing_file)
        self.remote = RemoteModels(self.config)
        self.repository = ModelRepository(
            self.model_root,
            policies={name: self.config.policy_for(name) for name in self.config.models},
            default_policy=self.config.version_policy,
            strict=self.config.strict,
            poll_interval=self.config.poll_interval_s,
            backend_factory=self._open_backend,
            unload_timeout=self.config.grace_period_s,
        )
        self.router = Router(self.routing.current, self.available_versions)
        self._batchers: dict[tuple[str, int, str], Batcher] = {}
        self._batching: dict[str, BatchingConfig] = {}
        self._background: set[asyncio.Task[None]] = set()
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._draining = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loading: asyncio.Task[None] | None = None

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
        await self._publish_health(loaded=True)
        while True:  # keep retrying remote servers that were down
            await asyncio.sleep(self.config.poll_interval_s)
            for model in self.remote.failed():
                if await self._connect(model):
                    await self._publish_health()

    async def _connect(self, model: str) -> bool:
        servable = await asyncio.to_thread(self.remote.connect, model)
        if servable is None:
            return False
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
        await self.routing.stop()

    def _open_backend(self, path: Path) -> Any:
        backend = self.config.model(path.parent.name).backend
        return open_backend(path, num_threads=getattr(backend, "tflite_threads", 1))

    def _on_version_change(self, model: str, status: VersionStatus) -> None:
        """Repository listener (polling or unloading thread): hop onto the event loop."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._apply_version_change, model, status)

    def _apply_version_change(self, model: str, status: VersionStatus) -> None:
        available = status.state is VersionState.AVAILABLE
        self.metrics.set_model_loaded(model, status.version, available)
        if available:
            with contextlib.suppress(ServingError):
                servable = self.repository.servable(model, status.version)
                self.metrics.observe_model_load(model, status.version, servable.load_seconds)
        else:
            for key in [k for k in self._batchers if k[:2] == (model, status.version)]:
                self._spawn(self._batchers.pop(key).close(drain=True))
        if self.repository.wait_ready(0):
            self._spawn(self._publish_health())

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

    # -- lookups ------------------------------------------------------------------------

    def available_versions(self, model: str) -> list[int]:
        if model in self.remote:
            return self.remote.versions(model)
        return self.repository.versions(model)

    def _known(self, model: str) -> bool:
        return model in self.remote or model in self.repository.models()

    def _servable(self, model: str, version: int | None) -> Servable:
        if model in self.remote:
            return self.remote.servable(model, version)
        return self.repository.servable(model, version)

    def _resolve(self, model: str, version: int | None, label: str | None) -> int:
        """The version a metadata/status call means: explicit, by label, or the default
        one (the ``stable`` label, else the highest available)."""
        if not self._known(model):
            raise NotFound(f"model {model!r} not found")
        if version is not None and label is not None:
            raise InvalidArgument("give a model version or a version label, not both")
        routing = self.router.model_routing(model)
        if label is not None:
            if label not in routing.labels:
                known = ", ".join(sorted(routing.labels)) or "none"
                raise InvalidArgument(
                    f"Unrecognized servable version label: {label} (labels of {model}: {known})"
                )
            return routing.labels[label]
        if version is not None:
            return version
        available = self.available_versions(model)
        if STABLE in routing.labels and routing.labels[STABLE] in available:
            return routing.labels[STABLE]
        if not available:
            raise NotFound(f"model {model!r} has no available version")
        return available[-1]

    def _role(self, model: str, version: int) -> str:
        """The route label a version's batch metrics carry: the part it plays now."""
        labels = self.router.model_routing(model).labels
        if labels.get(CANARY) == version:
            return CANARY
        if labels.get(STABLE, version) == version:
            return STABLE
        return "explicit"

    def _batcher(self, servable: Servable, signature_name: str) -> Batcher:
        key = (servable.model, servable.version, signature_name)
        batcher = self._batchers.get(key)
        if batcher is None:
            model, version = servable.model, servable.version

            def run(inputs: Tensors) -> Tensors:
                return servable.run(signature_name, inputs)

            batcher = Batcher(
                run,
                self.batching_config(model),
                observer=self.metrics.batch_observer(
                    model, version, lambda: self._role(model, version)
                ),
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
        if not self._known(model):
            raise NotFound(f"Servable not found for request: model {model!r} is not served here")
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
    ) -> tuple[Tensors, Tensors, Mapping[str, Any] | None]:
        """Validate and run one request on one version: (inputs, outputs, manifest)."""
        servable = self._servable(model, version)
        with servable:
            signature = servable.signatures.get(signature_name)
            if signature is None:
                known = ", ".join(sorted(servable.signatures)) or "none"
                raise NotFound(
                    f"signature {signature_name!r} not found in model {model!r} version "
                    f"{version}; available signatures: {known}"
                )
            inputs = validate_inputs(source(signature), signature)
            batcher = self._batcher(servable, signature_name)
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
        # Unknown model names come from clients: never let them mint new series.
        name = model if self._known(model) else ""
        self.metrics.observe_request(name, version, route, code, api, time.monotonic() - started)

    def _mirror(
        self, model: str, version: int, signature_name: str, primary: _Executed, api: str
    ) -> None:
        """Send a copy of a served request to ``version`` in the background and compare."""

        async def shadow() -> None:
            started = time.monotonic()
            try:
                _, outputs, _ = await self._execute(
                    model, version, signature_name, lambda _sig: primary.inputs,
                    started + SHADOW_TIMEOUT_S,
                )  # fmt: skip
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                code = _code_name(exc)
                self.metrics.observe_shadow(model, version, code)
                self._observe(model, version, "shadow", code, api, started)
                return
            agreement, difference = compare_outputs(primary.outputs, outputs)
            self.metrics.observe_shadow(
                model, version, "OK", agreement=agreement, abs_diff=difference
            )
            self._observe(model, version, "shadow", "OK", api, started)

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
    ) -> PredictResult:
        """Run ``signature_name`` on the routed version; ``inputs`` decodes the request
        against that version's signature. ``output_filter`` keeps only the named outputs."""

        def source(signature: Signature) -> Mapping[str, np.ndarray]:
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
    ) -> ClassifyResult:
        """Classes with scores per tf.Example (see ``classes_from_outputs``)."""
        executed = await self._run(
            model, version, label, signature_name,
            lambda signature: examples_to_inputs(examples, context, signature),
            deadline=deadline, headers=headers, api=api,
        )  # fmt: skip
        classes = classes_from_outputs(executed.outputs, executed.manifest, len(examples))
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
    ) -> RegressResult:
        """One value per tf.Example (see ``values_from_outputs``)."""
        executed = await self._run(
            model, version, label, signature_name,
            lambda signature: examples_to_inputs(examples, context, signature),
            deadline=deadline, headers=headers, api=api,
        )  # fmt: skip
        values = values_from_outputs(executed.outputs, executed.manifest, len(examples))
        return RegressResult(model, executed.version, signature_name, values)

    async def metadata(self, model: str, version: int | None, label: str | None) -> ModelMetadata:
        async with self._admitted():
            number = self._resolve(model, version, label)
            servable = self._servable(model, number)
            return ModelMetadata(model, number, dict(servable.signatures))

    def status(self, model: str, version: int | None, label: str | None) -> list[VersionStatus]:
        """``GetModelStatus``: every version of ``model``, or the one named."""
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

    def batching_config(self, model: str) -> BatchingConfig:
        if not self._known(model):
            raise NotFound(f"model {model!r} not found")
        return self._batching.get(model) or self.config.batching_for(model)

    def set_batching_config(self, model: str, config: BatchingConfig) -> None:
        """Change a model's batching at run time (kept until restart)."""
        if not self._known(model):
            raise NotFound(f"model {model!r} not found")
        self._batching[model] = config
        for key, batcher in self._batchers.items():
            if key[0] == model:
                batcher.update_config(config)

    async def reload(self) -> None:
        """Rescan the model root and re-read the routing file now."""
        await asyncio.to_thread(self.repository.poll)
        for model in self.remote.failed():
            await self._connect(model)
        await self.routing.refresh()
        await self._publish_health()


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
