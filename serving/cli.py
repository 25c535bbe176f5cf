"""The ``serve`` sub-command: start the TensorFlow Serving-compatible gateway.

Only argparse is imported here, so ``slipway --help`` stays instant; the gateway and
TensorFlow load when the command runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from serving import routing_cli
from serving.log_options import add_log_level, configure_logging

DEFAULT_GRPC_PORT = 8500
DEFAULT_REST_PORT = 8501


def register(subparsers: argparse._SubParsersAction) -> None:
    serve = subparsers.add_parser(
        "serve",
        help="serve a model repository over TensorFlow Serving's gRPC and REST APIs",
        description="Serve every model under MODEL_ROOT, laid out as <model>/<version>/ "
        "(SavedModel or TFLite), with TensorFlow Serving's gRPC and REST APIs, dynamic "
        "batching, canary routing, Prometheus metrics at /metrics and an admin API. New "
        "versions are loaded while serving. SIGTERM stops the gateway gracefully: it "
        "reports not ready, finishes the requests in flight, then exits.",
    )
    serve.add_argument(
        "--model-root",
        type=Path,
        required=True,
        metavar="MODEL_ROOT",
        help="Model repository to serve, one directory per model and one numbered "
        "directory per version inside it.",
    )
    serve.add_argument(
        "--grpc-port",
        type=int,
        default=DEFAULT_GRPC_PORT,
        metavar="PORT",
        help="Port of the gRPC API (PredictionService, ModelService and health checks). "
        "Default: %(default)s, TensorFlow Serving's gRPC port.",
    )
    serve.add_argument(
        "--rest-port",
        type=int,
        default=DEFAULT_REST_PORT,
        metavar="PORT",
        help="Port of the REST API, /metrics, /healthz, /readyz and the admin API. "
        "Default: %(default)s, TensorFlow Serving's REST port.",
    )
    serve.add_argument(
        "--host",
        default="0.0.0.0",
        help="Address both ports listen on; 127.0.0.1 keeps the gateway off the network. "
        "Default: %(default)s (every interface).",
    )
    serve.add_argument(
        "--config",
        type=Path,
        metavar="GATEWAY_YAML",
        help="Gateway settings: batching, version policies, remote backends, TLS, the admin "
        "token and the shared routing file or routing source. Without it every setting takes "
        "its default.",
    )
    serve.add_argument(
        "--prediction-log-dir",
        type=Path,
        metavar="DIR",
        help="Write sampled requests and answers here as TensorFlow Serving PredictionLog "
        "TFRecord files (rotated by size and age, closed on SIGTERM). Overrides "
        "prediction_log.directory in the config.",
    )
    serve.add_argument(
        "--prediction-log-sample",
        type=_fraction,
        metavar="FRACTION",
        help="Fraction of answered requests to log, chosen by request id, from 0 to 1. "
        "Default: 0 (off), or prediction_log.sample in the config.",
    )
    serve.add_argument(
        "--processes",
        type=_positive,
        default=1,
        metavar="N",
        help="Run N gateway processes sharing both ports (SO_REUSEPORT), for machines with "
        "more cores than one Python process can use: one watcher of the model root for all, "
        "one routing, /metrics adding up every process, labels reaching the process that "
        "answered. Default: %(default)s.",
    )
    # A worker of a pool: where it shares state with its siblings and how it reaches the
    # supervisor (set by the supervisor only).
    serve.add_argument("--pool-dir", type=Path, help=argparse.SUPPRESS)
    serve.add_argument("--pool-index", type=int, help=argparse.SUPPRESS)
    serve.add_argument("--pool-status-fd", type=int, help=argparse.SUPPRESS)
    add_log_level(serve)
    serve.add_argument(
        "--advertise-url",
        metavar="URL",
        help="REST URL at which the rollout controller reaches this replica, reported to "
        "the routing source (gateway.yaml's routing_source). Default: http(s)://HOST:PORT, "
        "with this machine's name for a wildcard HOST.",
    )
    serve.set_defaults(handler=run_serve)
    _register_publish(subparsers)
    routing_cli.register(subparsers)


def _register_publish(subparsers: argparse._SubParsersAction) -> None:
    publish = subparsers.add_parser(
        "publish",
        help="publish any SavedModel as a new version in a model repository",
        description="Publish a SavedModel exported by any Keras or TensorFlow code as "
        "MODEL_ROOT/MODEL/VERSION: check that it has a serving_default signature, write "
        "slipway.json beside it (SHA-256 of every file and the signature) and rename the "
        "copy into place, so a gateway sees the whole version or nothing. The source "
        "directory is not changed. Exit 2 when it is not a SavedModel with a "
        "serving_default signature, the version exists, or its inputs or outputs differ "
        "from the model's newest version (each difference named).",
    )
    publish.add_argument(
        "saved_model_dir",
        type=Path,
        metavar="SAVEDMODEL_DIR",
        help="The SavedModel directory (saved_model.pb, variables/, assets/) to publish.",
    )
    publish.add_argument(
        "--model", required=True, metavar="NAME", help="Model name (letters, digits, . _ -)."
    )
    publish.add_argument(
        "--version",
        type=int,
        metavar="N",
        help="Version number; an existing version is never replaced. Default: the next "
        "integer after the highest version of the model.",
    )
    publish.add_argument(
        "--model-root",
        type=Path,
        default=Path("models"),
        metavar="MODEL_ROOT",
        help="Model repository to publish into (created if missing). Default: %(default)s.",
    )
    publish.add_argument(
        "--allow-contract-change",
        action="store_true",
        help="Publish even if its inputs or outputs (names, dtypes, shapes) differ from the "
        "model's newest version, which that version's clients would notice.",
    )
    publish.set_defaults(handler=run_publish)


def run_publish(args: argparse.Namespace) -> int:
    from serving.publish import publish_saved_model

    version, path = publish_saved_model(
        args.saved_model_dir,
        args.model_root,
        args.model,
        version=args.version,
        allow_contract_change=args.allow_contract_change,
    )
    print(f"published {args.model} version {version} at {path}")
    return 0


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a fraction from 0 to 1, got {text!r}")
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return value


def run_serve(args: argparse.Namespace) -> int:
    import asyncio

    from serving.config import load_config, with_prediction_log

    worker = None if args.pool_dir is None else f"worker {args.pool_index}"
    configure_logging(args.log_level, worker)
    config = with_prediction_log(
        load_config(args.config), args.prediction_log_dir, args.prediction_log_sample
    )
    if config.routing_source is not None:
        config = config.model_copy(
            update={"routing_source": config.routing_source.model_copy(
                update={"advertise_url": args.advertise_url or _own_url(args, config)}
            )}
        )  # fmt: skip
    if args.processes > 1:
        from serving.pool import PoolSettings, WorkerPool

        settings = PoolSettings(
            processes=args.processes,
            model_root=args.model_root,
            config=config,
            host=args.host,
            grpc_port=args.grpc_port,
            rest_port=args.rest_port,
            worker_args=_worker_args(args),
        )
        return asyncio.run(WorkerPool(settings).run())
    from serving import heap
    from serving.pool_worker import PoolWorker
    from serving.server import GatewayServer, serve

    heap.manage()  # this process is the gateway's: its heap is frozen once loaded
    pool = None
    if args.pool_dir is not None:
        pool = PoolWorker(args.pool_dir, args.pool_index, args.pool_status_fd)
    server = GatewayServer(
        args.model_root,
        config,
        host=args.host,
        grpc_port=args.grpc_port,
        rest_port=args.rest_port,
        pool=pool,
    )
    return asyncio.run(serve(server))


def _worker_args(args: argparse.Namespace) -> list[str]:
    """The options every worker of a pool is started with, as the operator gave them."""
    options = {
        "--config": args.config,
        "--prediction-log-dir": args.prediction_log_dir,
        "--prediction-log-sample": args.prediction_log_sample,
        "--advertise-url": args.advertise_url,
        "--log-level": args.log_level,
    }
    return [
        part for name, value in options.items() if value is not None for part in (name, str(value))
    ]


def _own_url(args: argparse.Namespace, config: Any) -> str:
    import socket

    host = socket.gethostname() if args.host in ("0.0.0.0", "::", "") else args.host
    return f"{'https' if config.tls else 'http'}://{host}:{args.rest_port}"


def __getattr__(name: str) -> Any:
    """``USER_ERRORS``, imported only when asked for: the modules defining these errors
    import TensorFlow, and ``slipway --help`` must stay instant."""
    if name == "USER_ERRORS":
        from contracts.serving_contract import ContractChangeError
        from contracts.yaml_config import ConfigError
        from serving.errors import StartupError
        from serving.publish import PublishInputError

        return (ConfigError, StartupError, PublishInputError, ContractChangeError)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
