"""``slipway serve``: the TensorFlow Serving-compatible gateway."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

DEFAULT_GRPC_PORT = 8500
DEFAULT_REST_PORT = 8501


def register(subparsers: argparse._SubParsersAction) -> None:
    serve = subparsers.add_parser(
        "serve",
        help="serve a model repository over TensorFlow Serving's gRPC and REST APIs",
        description="Serve <model-root>/<model>/<version>/ (SavedModel or TFLite) with "
        "TensorFlow Serving's gRPC and REST APIs, dynamic batching, canary routing, "
        "Prometheus metrics and an admin API. Stops gracefully on SIGTERM.",
    )
    serve.add_argument("--model-root", type=Path, required=True, help="model repository")
    serve.add_argument("--grpc-port", type=int, default=DEFAULT_GRPC_PORT)
    serve.add_argument("--rest-port", type=int, default=DEFAULT_REST_PORT)
    serve.add_argument("--host", default="0.0.0.0", help="address to listen on")
    serve.add_argument(
        "--config", type=Path, help="gateway.yaml: routing file, batching, backends, TLS, admin"
    )
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    serve.set_defaults(handler=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    import asyncio

    from serving.config import load_config
    from serving.server import GatewayServer, serve

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    config = load_config(args.config)
    server = GatewayServer(
        args.model_root,
        config,
        host=args.host,
        grpc_port=args.grpc_port,
        rest_port=args.rest_port,
    )
    return asyncio.run(serve(server))


def __getattr__(name: str) -> Any:
    """``USER_ERRORS``, imported only when asked for: the modules defining these errors
    import TensorFlow, and ``slipway --help`` must stay instant."""
    if name == "USER_ERRORS":
        from serving.config import ConfigError
        from serving.routing import RoutingConfigError
        from serving.server import StartupError

        return (ConfigError, RoutingConfigError, StartupError)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
