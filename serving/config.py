"""The gateway's settings file (``gateway.yaml``): models, batching, backends, TLS, admin.

Operators edit this file by hand, so every mistake is reported as
``gateway.yaml:12: models.digits.batching.max_batch_size: expected int, got 'x'`` rather
than as a traceback. Relative paths in the file (certificates, token file, routing file)
are resolved against the file's own directory, so a config can move with its secrets.
Routing (labels, canary weight, shadow, failover) lives elsewhere because it changes at
run time and is shared by every replica: this file names the routing file, or the routing
source the replica watches.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from contracts.yaml_config import ConfigError, load_yaml_model
from serving.batching import BatchingConfig
from serving.repository import VersionPolicy
from serving.routing_sync import RoutingSourceConfig
from serving.validation import MAX_TENSOR_BYTES

MIB = 1024 * 1024
# A tensor a request expands by repetition is capped at the same size (serving.validation).
DEFAULT_MAX_MESSAGE_BYTES = MAX_TENSOR_BYTES


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerTLS(_Section):
    """Server certificate for gRPC and REST; ``client_ca`` turns on mutual TLS."""

    cert: Path
    key: Path
    client_ca: Path | None = None


class ClientTLS(_Section):
    """How the gateway authenticates to a remote model server (TLS, optionally mTLS)."""

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None

    @model_validator(mode="after")
    def _pair(self) -> ClientTLS:
        if (self.cert is None) != (self.key is None):
            raise ValueError("cert and key must be given together")
        return self


class AdminConfig(_Section):
    """Where the admin bearer token comes from; with neither set the admin API is off."""

    token_env: str | None = None
    token_file: Path | None = None

    @model_validator(mode="after")
    def _one_source(self) -> AdminConfig:
        if self.token_env is not None and self.token_file is not None:
            raise ValueError("give token_env or token_file, not both")
        return self


class LocalBackend(_Section):
    """Versions are SavedModel / TFLite directories under the model root."""

    kind: Literal["local"] = "local"
    tflite_threads: int = Field(default=2, ge=1)


class RemoteBackend(_Section):
    """Requests are forwarded to another model server (TF Serving or a gateway)."""

    kind: Literal["remote"]
    target: str = Field(min_length=1)
    model_name: str | None = None
    version: int | None = Field(default=None, ge=0)
    label: str | None = None
    pool_size: int = Field(default=4, ge=1)
    tls: ClientTLS | None = None

    @model_validator(mode="after")
    def _version_or_label(self) -> RemoteBackend:
        if self.version is not None and self.label is not None:
            raise ValueError("give version or label, not both")
        return self


Backend = Annotated[LocalBackend | RemoteBackend, Field(discriminator="kind")]


class ModelConfig(_Section):
    """Per-model overrides; anything left out takes the gateway-wide default."""

    version_policy: VersionPolicy | None = None
    batching: BatchingConfig | None = None
    backend: Backend = LocalBackend()


class PredictionLogConfig(_Section):
    """Sampled requests and answers as ``PredictionLog`` TFRecords (see serving.prediction_log).

    Off unless ``sample`` > 0, which needs a ``directory``.
    """

    directory: Path | None = None
    sample: float = Field(default=0.0, ge=0, le=1)
    max_file_bytes: int = Field(default=64 * MIB, gt=0)
    max_file_age_s: float = Field(default=600.0, gt=0)
    queue_size: int = Field(default=1024, gt=0)

    @model_validator(mode="after")
    def _directory_when_on(self) -> PredictionLogConfig:
        if self.sample > 0 and self.directory is None:
            raise ValueError("sample > 0 needs a directory to write to")
        return self


class FeedbackConfig(_Section):
    """How many answers are kept for later labels (see serving.feedback), and how long."""

    max_requests: int = Field(default=100_000, gt=0)
    ttl_s: float = Field(default=3600.0, gt=0)


class PoolConfig(_Section):
    """How the supervisor of ``slipway serve --processes N`` checks that its workers live
    (see serving.pool): every ``probe_interval_s`` it asks each one on its private socket;
    one that has not answered for ``unresponsive_after_s`` (a stuck event loop, a process
    stopped) is killed and replaced."""

    probe_interval_s: float = Field(default=5.0, gt=0)
    unresponsive_after_s: float = Field(default=60.0, gt=0)

    @model_validator(mode="after")
    def _several_probes(self) -> PoolConfig:
        if self.unresponsive_after_s < 2 * self.probe_interval_s:
            raise ValueError(
                "unresponsive_after_s must allow at least two probes (2 x probe_interval_s)"
            )
        return self


class GatewayConfig(_Section):
    """Everything ``slipway serve --config`` reads. An empty file is a valid config."""

    routing_file: Path | None = None
    # Replicas that must agree watch one routing source instead (serving.routing_sync).
    routing_source: RoutingSourceConfig | None = None
    strict: bool = False
    # /readyz and the gRPC health of "" need a model with a version AVAILABLE, unless this
    # is true (a gateway that only fronts remote model servers, or waits for a first model).
    ready_without_models: bool = False
    poll_interval_s: float = Field(default=2.0, gt=0)
    version_policy: VersionPolicy = VersionPolicy()
    batching: BatchingConfig = BatchingConfig()
    models: dict[str, ModelConfig] = {}
    tls: ServerTLS | None = None
    admin: AdminConfig = AdminConfig()
    max_message_bytes: int = Field(default=DEFAULT_MAX_MESSAGE_BYTES, gt=0)
    grace_period_s: float = Field(default=20.0, ge=0)
    prediction_log: PredictionLogConfig = PredictionLogConfig()
    feedback: FeedbackConfig = FeedbackConfig()
    pool: PoolConfig = PoolConfig()

    @model_validator(mode="after")
    def _one_routing_origin(self) -> GatewayConfig:
        if self.routing_file is not None and self.routing_source is not None:
            raise ValueError("give routing_file or routing_source, not both")
        if self.routing_source is not None and self.admin == AdminConfig():
            raise ValueError(
                "routing_source needs admin.token_env or admin.token_file: the replica "
                "presents the admin token to the source"
            )
        return self

    def model(self, name: str) -> ModelConfig:
        return self.models.get(name, ModelConfig())

    def batching_for(self, name: str) -> BatchingConfig:
        return self.model(name).batching or self.batching

    def policy_for(self, name: str) -> VersionPolicy:
        return self.model(name).version_policy or self.version_policy

    def admin_token(self) -> str | None:
        """The admin bearer token, read when the server starts; None turns the API off."""
        if self.admin.token_env is not None:
            token = os.environ.get(self.admin.token_env, "").strip()
            if not token:
                raise ConfigError(
                    f"admin.token_env: environment variable {self.admin.token_env} is not set"
                )
            return token
        if self.admin.token_file is not None:
            try:
                token = self.admin.token_file.read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise ConfigError(f"admin.token_file: cannot read: {exc}") from None
            if not token:
                raise ConfigError(f"admin.token_file: {self.admin.token_file} is empty")
            return token
        return None


def load_config(path: str | Path | None) -> GatewayConfig:
    """Read ``gateway.yaml``; None gives the defaults. Every failure is a ``ConfigError``."""
    if path is None:
        return GatewayConfig()
    path = Path(path)
    return _resolve_paths(load_yaml_model(path, GatewayConfig), path.parent)


def with_prediction_log(
    config: GatewayConfig, directory: Path | None, sample: float | None
) -> GatewayConfig:
    """``config`` with the command line's ``--prediction-log-*`` flags over its file's
    ``prediction_log`` section (None: keep the file's value)."""
    section = config.prediction_log.model_dump()
    if directory is not None:
        section["directory"] = directory
    if sample is not None:
        section["sample"] = sample
    try:
        checked = PredictionLogConfig.model_validate(section)
    except ValidationError as exc:
        reason = "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())
        raise ConfigError(f"--prediction-log-sample / --prediction-log-dir: {reason}") from None
    return config.model_copy(update={"prediction_log": checked})


def _resolve_paths(config: GatewayConfig, base: Path) -> GatewayConfig:
    """Make every path in the file relative to the file, not to the working directory."""

    def resolve(value: Path | None) -> Path | None:
        return None if value is None else (base / value.expanduser())

    updates: dict[str, Any] = {
        "routing_file": resolve(config.routing_file),
        "prediction_log": config.prediction_log.model_copy(
            update={"directory": resolve(config.prediction_log.directory)}
        ),
    }
    if config.routing_source is not None:
        updates["routing_source"] = config.routing_source.model_copy(
            update={"cache_file": resolve(config.routing_source.cache_file)}
        )
    if config.tls is not None:
        updates["tls"] = config.tls.model_copy(
            update={
                "cert": resolve(config.tls.cert),
                "key": resolve(config.tls.key),
                "client_ca": resolve(config.tls.client_ca),
            }
        )
    if config.admin.token_file is not None:
        updates["admin"] = config.admin.model_copy(
            update={"token_file": resolve(config.admin.token_file)}
        )
    models = {}
    for name, model in config.models.items():
        backend = model.backend
        if isinstance(backend, RemoteBackend) and backend.tls is not None:
            tls = backend.tls.model_copy(
                update={key: resolve(getattr(backend.tls, key)) for key in ("ca", "cert", "key")}
            )
            model = model.model_copy(update={"backend": backend.model_copy(update={"tls": tls})})
        models[name] = model
    updates["models"] = models
    return config.model_copy(update=updates)
