"""The model repository: versions on disk become servables, and go away again.

The layout is TensorFlow Serving's, ``<root>/<model>/<version>/``, and so are the
lifecycle states a client sees through ``GetModelStatus``. A poll compares the disk with
what is loaded: versions a policy wants are verified against ``slipway.json``, loaded,
warmed up and only then made AVAILABLE; versions it no longer wants stop taking new
requests, wait for the ones in flight, and are closed. New versions load before old
ones unload, so a model never drops out while its next version comes up. All of this
runs on the polling thread (or whoever calls ``poll``), never on a request.

A version that cannot be verified or loaded ends in END with its error, and the
policy looks past it: the other versions keep serving.

Besides what its policy keeps, a model keeps every version that routing names (a label,
a shadow version) loaded: publishing a canary under ``latest`` with ``num_versions: 1``
must not unload the ``stable`` version the canary is compared with and that unlabelled
requests still go to. A version stops being kept once routing no longer names it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Any, Literal

import grpc
import numpy as np

from contracts.model_manifest import unsafe_links, verify_files
from serving.backends import Backend, open_backend
from serving.errors import (
    DataLoss,
    FailedPrecondition,
    NotFound,
    PermissionDenied,
    ServingError,
    as_serving_error,
)
from serving.model_files import model_format, read_model_manifest, safe_join, validate_model_name
from serving.signature import Signature
from serving.warmup import warm_up

log = logging.getLogger(__name__)

_MAX_PROBLEMS_SHOWN = 5


class VersionState(IntEnum):
    """``tensorflow.serving.ModelVersionStatus.State``, same numbers."""

    START = 10
    LOADING = 20
    AVAILABLE = 30
    UNLOADING = 40
    END = 50


@dataclass(frozen=True)
class VersionStatus:
    """One row of ``GetModelStatus``: ``error_code`` is a ``google.rpc.Code`` (0 = OK)."""

    version: int
    state: VersionState
    error_code: int = 0
    error_message: str = ""


@dataclass(frozen=True)
class VersionPolicy:
    """Which versions on disk to serve, as TensorFlow Serving's ``ServableVersionPolicy``.

    ``latest``: the ``num_versions`` highest; ``all``: every version; ``specific``: those
    listed in ``versions``.
    """

    kind: Literal["latest", "all", "specific"] = "latest"
    num_versions: int = 1
    versions: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in ("latest", "all", "specific"):
            raise ValueError(
                f"version policy kind must be latest, all or specific, not {self.kind!r}"
            )
        if self.kind == "latest" and self.num_versions < 1:
            raise ValueError(f"latest policy needs num_versions >= 1, got {self.num_versions}")
        if self.kind == "specific" and not self.versions:
            raise ValueError("specific policy needs at least one version")
        object.__setattr__(self, "versions", tuple(sorted(set(self.versions))))

    def select(self, candidates: Iterable[int]) -> set[int]:
        available = sorted(set(candidates))
        if self.kind == "all":
            return set(available)
        if self.kind == "specific":
            return set(available) & set(self.versions)
        return set(available[-self.num_versions :])


Listener = Callable[[str, VersionStatus], None]
# Model name -> the versions routing names (labels, shadow); kept loaded beyond the policy.
PinnedVersions = Callable[[str], Iterable[int]]
BackendFactory = Callable[[Path], Backend]
Warmup = Callable[[Backend, Path], Any]


class Servable:
    """A loaded version. ``with servable:`` counts a request in flight, so unloading
    waits for it; entering a servable that has started unloading raises ``NotFound``."""

    def __init__(
        self,
        model: str,
        version: int,
        path: Path,
        backend: Backend,
        manifest: dict[str, Any] | None,
        load_seconds: float,
    ) -> None:
        self.model = model
        self.version = version
        self.path = path
        self.backend = backend
        self.manifest = manifest
        self.load_seconds = load_seconds
        self._in_flight = 0
        self._accepting = True
        self._idle = threading.Condition()

    @property
    def signatures(self) -> dict[str, Signature]:
        return self.backend.signatures

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def run(
        self, signature_name: str, inputs: dict[str, np.ndarray], timeout: float | None = None
    ) -> dict[str, np.ndarray]:
        return self.backend.run(signature_name, inputs, timeout)

    def __enter__(self) -> Servable:
        with self._idle:
            if not self._accepting:
                raise NotFound(f"model {self.model!r} version {self.version} is unloading")
            self._in_flight += 1
        return self

    def __exit__(self, *exc_info: object) -> None:
        with self._idle:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.notify_all()

    def _drain(self, timeout: float | None) -> bool:
        """Stop admitting requests and wait for those in flight; False on timeout."""
        with self._idle:
            self._accepting = False
            return self._idle.wait_for(lambda: self._in_flight == 0, timeout)


@dataclass
class _Version:
    number: int
    path: Path
    state: VersionState = VersionState.START
    error: ServingError | None = None
    servable: Servable | None = None
    identity: tuple[int, ...] | None = None

    def status(self) -> VersionStatus:
        if self.error is None:
            return VersionStatus(self.number, self.state)
        return VersionStatus(self.number, self.state, self.error.error_code, self.error.message)

    @property
    def failed(self) -> bool:
        return self.state is VersionState.END and self.error is not None


@dataclass
class _Scan:
    """What one model directory holds: version -> path, or the error that hides it."""

    paths: dict[int, Path] = field(default_factory=dict)
    errors: dict[int, ServingError] = field(default_factory=dict)
    readable: bool = True


class ModelRepository:
    """Serves every model directory under ``root`` according to its version policy.

    ``policies`` maps model names to policies (others get ``default_policy``).
    ``strict`` refuses versions without ``slipway.json``. ``backend_factory`` opens a
    version directory; ``warmup`` runs a loaded backend before it becomes AVAILABLE.
    Unloading waits up to ``unload_timeout`` seconds for requests in flight.
    ``pinned`` returns the versions of a model that routing names: they are served in
    addition to what the policy selects, as long as they are on disk. With
    ``poll_interval`` None the disk is read at start and then only when ``request_poll``
    asks (a worker of a pool, whose supervisor watches the disk for every worker).
    """

    def __init__(
        self,
        root: str | Path,
        *,
        policies: Mapping[str, VersionPolicy] | None = None,
        default_policy: VersionPolicy | None = None,
        strict: bool = False,
        poll_interval: float | None = 1.0,
        backend_factory: BackendFactory = open_backend,
        warmup: Warmup = warm_up,
        unload_timeout: float = 30.0,
        pinned: PinnedVersions | None = None,
    ) -> None:
        self.root = Path(root)
        self.policies = dict(policies or {})
        self.default_policy = default_policy or VersionPolicy()
        self.strict = strict
        self.poll_interval = poll_interval
        self.unload_timeout = unload_timeout
        self._backend_factory = backend_factory
        self._warmup = warmup
        self._pinned = pinned
        self._models: dict[str, dict[int, _Version]] = {}
        self._lock = threading.Lock()
        self._poll_lock = threading.Lock()
        self._notify_lock = threading.Lock()
        self._listeners: list[Listener] = []
        self._unloaders: list[threading.Thread] = []
        self._skipped_names: set[str] = set()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None

    # -- queries (any thread) -------------------------------------------------------

    def models(self) -> list[str]:
        """Every model the repository knows of, whatever the state of its versions."""
        with self._lock:
            return sorted(self._models)

    def knows(self, model: str) -> bool:
        """Whether the repository knows of ``model``, whatever the state of its versions."""
        with self._lock:
            return model in self._models

    def versions(self, model: str) -> list[int]:
        """The AVAILABLE versions of ``model``, ascending (empty if none or unknown)."""
        with self._lock:
            records = self._models.get(model, {})
            return sorted(v for v, r in records.items() if r.state is VersionState.AVAILABLE)

    def status(self, model: str, version: int | None = None) -> list[VersionStatus]:
        """``GetModelStatus``: every version known (highest first), or just ``version``."""
        with self._lock:
            records = self._models.get(model)
            if records is None:
                raise NotFound(f"model {model!r} not found")
            if version is None:
                return [records[v].status() for v in sorted(records, reverse=True)]
            if version not in records:
                raise NotFound(f"could not find version {version} of model {model!r}")
            return [records[version].status()]

    def servable(self, model: str, version: int | None = None) -> Servable:
        """The AVAILABLE servable for ``version`` (highest when None); ``NotFound`` says
        which versions are available instead."""
        with self._lock:
            records = self._models.get(model)
            if records is None:
                raise NotFound(f"model {model!r} not found")
            record = records.get(version) if version is not None else None
            if record is not None and record.state is VersionState.AVAILABLE:
                assert record.servable is not None
                return record.servable  # the request path's case: one lookup
            available = sorted(v for v, r in records.items() if r.state is VersionState.AVAILABLE)
            if version is None:
                if not available:
                    raise NotFound(f"model {model!r} has no available version")
                version = available[-1]
            record = records.get(version)
            if record is None or record.state is not VersionState.AVAILABLE:
                listed = ", ".join(map(str, available)) or "none"
                raise NotFound(
                    f"model {model!r} version {version} is not available; "
                    f"available versions: {listed}"
                )
            assert record.servable is not None
            return record.servable

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(model, status)`` on every state change, from the thread that
        made it (the polling thread or an unloading thread)."""
        with self._lock:
            self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        with self._lock:
            self._listeners.remove(listener)

    # -- polling ----------------------------------------------------------------------

    def start(self) -> None:
        """Poll now and then every ``poll_interval`` seconds (or on ``request_poll``) on a
        background thread."""
        if self._thread is not None:
            raise RuntimeError("the repository is already polling")
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._poll_loop, name="model-repository", daemon=True
        )
        self._thread.start()

    def request_poll(self) -> None:
        """Have the polling thread read the disk again soon; requests made while it polls
        fold into one more poll, so a burst of them costs two scans, not one each."""
        self._wake.set()

    def wait_ready(self, timeout: float | None = None) -> bool:
        """True once the first poll after ``start`` has finished loading."""
        return self._ready.wait(timeout)

    def stop(self) -> None:
        """Stop polling and unload every version (each waits for its requests in flight)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._poll_lock:
            with self._lock:
                loaded = [
                    (model, record)
                    for model, records in self._models.items()
                    for record in records.values()
                    if record.state is VersionState.AVAILABLE
                ]
            for model, record in loaded:
                self._begin_unload(model, record)
            self._join_unloaders()

    def _poll_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll()
            except Exception:
                log.exception("polling the model repository %s failed", self.root)
            self._ready.set()
            self._wake.wait(self.poll_interval)
            self._wake.clear()

    def poll(self) -> None:
        """Bring the servables in line with the disk once; blocks while versions load.

        Unloads are started here and finish on their own threads once their requests
        in flight are done.
        """
        with self._poll_lock:
            scanned = self._scan()
            with self._lock:
                known = set(self._models)
            for model in sorted(set(scanned) | known):
                self._sync(model, scanned.get(model, _Scan()))
            with self._lock:
                self._unloaders = [t for t in self._unloaders if t.is_alive()]

    def _scan(self) -> dict[str, _Scan]:
        try:
            names = sorted(os.listdir(self.root))
        except OSError as exc:
            # An unreadable root (a remount, a glitch) must not unload everything.
            log.error("cannot list model repository %s: %s", self.root, exc)
            with self._lock:
                return {model: _Scan(readable=False) for model in self._models}
        scanned = {}
        for name in names:
            if name.startswith("."):
                continue
            try:
                validate_model_name(name)
                model_dir = safe_join(self.root, name)
            except ServingError as exc:
                if name not in self._skipped_names:
                    self._skipped_names.add(name)
                    log.warning("skipping %s in %s: %s", name, self.root, exc.message)
                continue
            if model_dir.is_dir():
                scanned[name] = self._scan_model(model_dir, name)
        return scanned

    def _scan_model(self, model_dir: Path, model: str) -> _Scan:
        scan = _Scan()
        try:
            names = os.listdir(model_dir)
        except OSError as exc:
            log.error("cannot list %s: %s", model_dir, exc)
            scan.readable = False
            return scan
        for name in names:
            if not is_version_name(name):
                continue
            version = int(name)
            try:
                path = safe_join(self.root, model, name)
            except PermissionDenied as exc:
                scan.errors[version] = exc
                continue
            if path.is_dir():
                scan.paths[version] = path
        return scan

    def _sync(self, model: str, scan: _Scan) -> None:
        if not scan.readable:
            return
        policy = self.policies.get(model, self.default_policy)
        with self._lock:
            records = self._models.setdefault(model, {})
        self._record_scan_errors(model, records, scan)
        self._forget_replaced_failures(records, scan)
        while True:
            candidates = [v for v in scan.paths if v not in records or not records[v].failed]
            wanted = policy.select(candidates) | (self._pinned_versions(model) & set(candidates))
            pending = [
                v for v in wanted if v not in records or records[v].state is VersionState.END
            ]
            if not pending:
                break
            for version in sorted(pending, reverse=True):
                self._load(model, version, scan.paths[version])
        for version, record in sorted(records.items()):
            if record.state is VersionState.AVAILABLE and version not in wanted:
                self._begin_unload(model, record)

    def _pinned_versions(self, model: str) -> set[int]:
        """The versions routing names for ``model``; if that cannot be read, every version
        loaded now, so that a failure never unloads a version routing may name."""
        if self._pinned is None:
            return set()
        try:
            return set(self._pinned(model))
        except Exception:
            log.exception("reading the routed versions of model %s failed", model)
            return set(self.versions(model))

    def _record_scan_errors(self, model: str, records: dict[int, _Version], scan: _Scan) -> None:
        """Versions whose directory cannot be used (a symlink out of the root) end with
        that error; a loaded one is first unloaded as it is no longer on disk."""
        for version, error in scan.errors.items():
            record = records.get(version)
            if record is None or (record.state is VersionState.END and not record.failed):
                path = self.root / model / str(version)
                self._set(model, _Version(version, path), VersionState.END, error=error)

    def _forget_replaced_failures(self, records: dict[int, _Version], scan: _Scan) -> None:
        """A failed version is retried only if its directory was replaced (republished)."""
        for version, record in list(records.items()):
            path = scan.paths.get(version)
            if (
                record.failed
                and path is not None
                and record.identity not in (None, path_identity(path))
            ):
                record.error = None

    def _load(self, model: str, version: int, path: Path) -> None:
        record = _Version(version, path, identity=path_identity(path))
        self._set(model, record, VersionState.START)
        self._set(model, record, VersionState.LOADING)
        started = time.monotonic()
        backend: Backend | None = None
        try:
            manifest = self._verify(model, version, path)
            backend = self._backend_factory(path)
            self._warmup(backend, path)
        except Exception as exc:
            error = as_serving_error(exc, default=grpc.StatusCode.UNKNOWN)
            log.error("model %s version %s failed to load: %s", model, version, error.message)
            if backend is not None:
                with contextlib.suppress(Exception):
                    backend.close()
            self._set(model, record, VersionState.END, error=error)
            return
        record.servable = Servable(
            model, version, path, backend, manifest, time.monotonic() - started
        )
        log.info(
            "model %s version %s is available (%.2f s)",
            model,
            version,
            record.servable.load_seconds,
        )
        self._set(model, record, VersionState.AVAILABLE)

    def _verify(self, model: str, version: int, path: Path) -> dict[str, Any] | None:
        manifest = read_model_manifest(path)
        if manifest is None:
            if self.strict:
                raise FailedPrecondition(
                    "no slipway.json: strict mode serves only verified model versions"
                )
            problems = unsafe_links(path)
            if problems:
                raise PermissionDenied("; ".join(problems))
            log.warning(
                "model %s version %s has no slipway.json: serving it unverified", model, version
            )
        else:
            problems = verify_files(path, manifest)
            if problems:
                shown = problems[:_MAX_PROBLEMS_SHOWN]
                more = len(problems) - len(shown)
                raise DataLoss(
                    "files do not match slipway.json: "
                    + "; ".join(shown)
                    + (f"; and {more} more" if more else "")
                )
        if model_format(path) is None:
            raise NotFound(f"{path}: no saved_model.pb or model.tflite")
        return manifest

    def _begin_unload(self, model: str, record: _Version) -> None:
        self._set(model, record, VersionState.UNLOADING)
        thread = threading.Thread(
            target=self._finish_unload,
            args=(model, record),
            name=f"unload-{model}-{record.number}",
            daemon=True,
        )
        with self._lock:
            self._unloaders.append(thread)
        thread.start()

    def _finish_unload(self, model: str, record: _Version) -> None:
        servable = record.servable
        assert servable is not None
        if not servable._drain(self.unload_timeout):
            log.warning(
                "model %s version %s: %d requests still in flight after %.0f s; unloading anyway",
                model,
                record.number,
                servable.in_flight,
                self.unload_timeout,
            )
        try:
            servable.backend.close()
        except Exception:
            log.exception("closing model %s version %s failed", model, record.number)
        record.servable = None
        self._set(model, record, VersionState.END)

    def _join_unloaders(self) -> None:
        with self._lock:
            threads, self._unloaders = self._unloaders, []
        for thread in threads:
            thread.join()

    def _set(
        self,
        model: str,
        record: _Version,
        state: VersionState,
        *,
        error: ServingError | None = None,
    ) -> None:
        """Record a state change and tell the listeners, in order, outside the data lock.

        Listeners run on the thread making the change and must return quickly without
        calling ``poll`` or ``stop``.
        """
        with self._notify_lock:
            with self._lock:
                record.state = state
                record.error = error
                self._models.setdefault(model, {})[record.number] = record
                listeners = list(self._listeners)
            status = record.status()
            for listener in listeners:
                try:
                    listener(model, status)
                except Exception:
                    log.exception("repository listener failed on %s %s", model, status)


def is_version_name(name: str) -> bool:
    """TensorFlow Serving's rule: versions are integer names; staging and other
    directories are invisible. Only the canonical spelling counts."""
    return name.isascii() and name.isdigit() and str(int(name)) == name


def disk_fingerprint(root: Path) -> tuple[object, ...]:
    """What a poll would find under ``root``, cheaply: every model directory and every
    version directory's identity. Equal fingerprints mean a poll would change nothing
    (a pool's supervisor compares them to tell its workers when to poll)."""
    found: list[object] = []
    with contextlib.suppress(OSError):
        for model in sorted(os.listdir(root)):
            found.append(model)
            with contextlib.suppress(OSError):
                for name in sorted(os.listdir(root / model)):
                    if is_version_name(name):
                        found.append((model, name, path_identity(root / model / name)))
    return tuple(found)


def path_identity(path: Path) -> tuple[int, ...] | None:
    """Tells a republished directory from the one that failed (inode numbers are
    reused, so the change time is part of it)."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return (stat.st_dev, stat.st_ino, stat.st_mtime_ns, stat.st_ctime_ns)
