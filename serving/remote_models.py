"""Models the gateway forwards to another model server instead of loading from disk.

A model configured with a ``remote`` backend in ``gateway.yaml`` is served by a
TensorFlow Serving (or another gateway) over ``PredictionService``; this module keeps
its connection and reports it in the repository's terms (one servable, a version
status), so routing, batching and metrics treat it like a local model.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import grpc

from serving.config import GatewayConfig, RemoteBackend
from serving.errors import NotFound, ServingError, Unavailable, as_serving_error
from serving.repository import Servable, VersionState, VersionStatus

logger = logging.getLogger(__name__)


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
