"""The ``gateway.yaml`` reference (``docs/reference/gateway-yaml.md``), generated from its models.

Every key of ``serving.config.GatewayConfig`` and of the sections below it, with its
type, constraints, default and meaning, so the reference cannot drift from what
``slipway serve --config`` accepts: ``tests/docs/test_reference_pages.py`` fails when the
committed page and this output differ. Regenerate it with::

    python -m serving.config_reference > docs/reference/gateway-yaml.md

A key's meaning is its field's ``description`` when the model gives one, else the entry
for its field in ``DESCRIPTIONS`` below (``contracts.config_reference.describe``).
"""

from __future__ import annotations

from contracts.config_reference import Key, config_keys, render_reference
from serving.batching import BatchingConfig
from serving.config import (
    AdminConfig,
    ClientTLS,
    FeedbackConfig,
    GatewayConfig,
    LocalBackend,
    ModelConfig,
    PoolConfig,
    PredictionLogConfig,
    RemoteBackend,
    ServerTLS,
)
from serving.repository import VersionPolicy
from serving.routing_sync import RoutingSourceConfig

MODEL = "<model>"  # a served model's name: its directory under the model root

DESCRIPTIONS: dict[tuple[type, str], str] = {
    (GatewayConfig, "routing_file"): "the routing file every replica polls (labels, canary "
    "weight, shadow, failover); give this or routing_source",
    (GatewayConfig, "routing_source"): "the routing source this replica watches (`slipway "
    "routing serve`); needs admin.token_env or admin.token_file",
    (GatewayConfig, "strict"): "refuse a version without a slipway.json (one with it is always "
    "checked against it); otherwise such a version is served unverified, with a warning",
    (GatewayConfig, "ready_without_models"): "report ready with no model version available (a "
    "gateway that only fronts remote model servers, or waits for a first model)",
    (GatewayConfig, "poll_interval_s"): "seconds between two looks at the model root (new or "
    "removed versions) and retries of remote models",
    (GatewayConfig, "version_policy"): "which versions on disk are served, for every model "
    "that sets none of its own",
    (GatewayConfig, "batching"): "dynamic batching, for every model that sets none of its own",
    (GatewayConfig, "models"): "per-model settings, by model name",
    (GatewayConfig, "tls"): "TLS for gRPC and REST; null: plain text",
    (GatewayConfig, "admin"): "where the admin API's bearer token comes from",
    (GatewayConfig, "max_message_bytes"): "largest gRPC message, REST body and tensor a request "
    "expands to, in bytes",
    (GatewayConfig, "grace_period_s"): "on SIGTERM, and when a version unloads, seconds the "
    "requests in flight have to finish",
    (GatewayConfig, "prediction_log"): "sampled requests and answers written as "
    "PredictionLog TFRecord files",
    (GatewayConfig, "feedback"): "the answers kept to match labels sent later",
    (GatewayConfig, "pool"): "how `slipway serve --processes N` watches its workers",
    (RoutingSourceConfig, "url"): "the routing source's URL, http://host:port or https://…",
    (RoutingSourceConfig, "cache_file"): "the last routing applied, read at start when the "
    "source cannot be reached",
    (RoutingSourceConfig, "watch_s"): "how long one watch waits for a change before it is renewed",
    (RoutingSourceConfig, "start_timeout_s"): "without a cache, how long start waits for the "
    "source before giving up",
    (RoutingSourceConfig, "advertise_url"): "where the rollout controller reaches this "
    "replica's REST API (`--advertise-url` overrides it)",
    (VersionPolicy, "kind"): "latest: the num_versions highest; all: every version; specific: "
    "those in versions",
    (VersionPolicy, "num_versions"): "versions served by the latest policy (at least 1)",
    (VersionPolicy, "versions"): "the versions served by the specific policy",
    (BatchingConfig, "max_batch_size"): "rows in a batch; a larger request is split",
    (BatchingConfig, "batch_timeout_micros"): "microseconds a batch waits for more requests "
    "after its first",
    (BatchingConfig, "max_enqueued_batches"): "batches waiting for a thread; a request that "
    "would need more fails at once with UNAVAILABLE, one with more rows than the whole queue "
    "holds with INVALID_ARGUMENT",
    (BatchingConfig, "num_batch_threads"): "threads running batches",
    (BatchingConfig, "allowed_batch_sizes"): "batch sizes the model runs, increasing, the last "
    "equal to max_batch_size; a batch is padded up to the next",
    (BatchingConfig, "pad_variable_length"): "pad inputs whose lengths differ to the longest "
    "in the batch (else they go to different batches)",
    (BatchingConfig, "enabled"): "false: every request runs alone",
    (ModelConfig, "version_policy"): "this model's version policy; null: the gateway-wide one",
    (ModelConfig, "batching"): "this model's batching; null: the gateway-wide batching",
    (ModelConfig, "backend"): "where the model runs: local files or another model server",
    (LocalBackend, "tflite_threads"): "threads each TFLite interpreter uses",
    (RemoteBackend, "target"): "host:port of the model server (TF Serving or a gateway)",
    (RemoteBackend, "model_name"): "the model's name there; default: the name here",
    (RemoteBackend, "version"): "pin this remote version; default: the remote's latest",
    (RemoteBackend, "label"): "follow this remote version label instead of a version",
    (RemoteBackend, "pool_size"): "gRPC channels to the target, used in turn",
    (RemoteBackend, "tls"): "TLS to the target; null: plain text",
    (ClientTLS, "ca"): "CA bundle the target's certificate is checked against; default: the "
    "system's",
    (ClientTLS, "cert"): "client certificate for mutual TLS (with key)",
    (ClientTLS, "key"): "client private key for mutual TLS (with cert)",
    (ServerTLS, "cert"): "the server certificate chain (PEM)",
    (ServerTLS, "key"): "the server's private key (PEM)",
    (ServerTLS, "client_ca"): "CA bundle client certificates must chain to: mutual TLS",
    (AdminConfig, "token_env"): "environment variable holding the token",
    (AdminConfig, "token_file"): "file holding the token",
    (PredictionLogConfig, "directory"): "where the files are written; needed when sample > 0",
    (PredictionLogConfig, "sample"): "fraction of answered requests logged, chosen by request id",
    (PredictionLogConfig, "max_file_bytes"): "a file is closed at this size",
    (PredictionLogConfig, "max_file_age_s"): "a file is closed at this age",
    (PredictionLogConfig, "queue_size"): "records waiting to be written; a full queue drops "
    "the record (counted), never blocking a request",
    (FeedbackConfig, "max_requests"): "answers kept at most; the oldest goes first",
    (FeedbackConfig, "ttl_s"): "seconds an answer is kept",
    (PoolConfig, "probe_interval_s"): "seconds between two probes of each worker",
    (PoolConfig, "unresponsive_after_s"): "a worker silent this long is killed and replaced (at "
    "least two probe intervals)",
}

HEADER = f"""\
# gateway.yaml reference

Every key of the gateway's settings file (`slipway serve --config gateway.yaml`),
generated from the models in `serving/config.py` by

    python -m serving.config_reference > docs/reference/gateway-yaml.md

and checked by a test, so it cannot drift from what the gateway accepts. Every key is
optional: an empty file is a valid configuration. Relative paths (certificates, the token
file, the routing file, the cache file) are relative to the file itself. `{MODEL}` stands
for a served model's name. Routing (labels, canary weight, shadow, failover) is not in
this file: it changes while the gateway runs and lives in the routing file or routing
source named here.
"""


def gateway_keys() -> list[Key]:
    """Every key of gateway.yaml, in the order the models declare them."""
    return config_keys(GatewayConfig, any_name=MODEL)


def render() -> str:
    """The whole reference as Markdown: one table per section."""
    return render_reference(HEADER, gateway_keys(), DESCRIPTIONS)


def main() -> None:
    print(render(), end="")


if __name__ == "__main__":
    main()
