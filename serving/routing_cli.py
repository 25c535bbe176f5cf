"""The ``routing serve`` sub-command: run the routing source every gateway replica watches.

Only argparse is imported at registration, so ``slipway --help`` stays instant. The source
never imports TensorFlow: it holds one table and starts in well under a second.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from serving.log_options import add_log_level, configure_logging

DEFAULT_PORT = 8600
DEFAULT_TOKEN_ENV = "SLIPWAY_ADMIN_TOKEN"


def register(subparsers: argparse._SubParsersAction) -> None:
    routing = subparsers.add_parser(
        "routing",
        help="the routing source: one revisioned routing table every gateway replica watches",
    )
    commands = routing.add_subparsers(dest="routing_command", metavar="COMMAND", required=True)
    serve = commands.add_parser(
        "serve",
        help="serve the routing table to gateway replicas and the rollout controller",
        description="Hold every model's routing (labels, canary weight, shadow, failover) "
        "at a revision, persisted atomically in STATE; gateways started with "
        "`routing_source: {url: …}` in gateway.yaml watch it and apply each change within "
        "a second. Writes are per model, optionally compare-and-swap with If-Match. SIGTERM "
        "answers every watching replica and exits.",
    )
    serve.add_argument("--state", type=Path, required=True, metavar="STATE",
                       help="JSON file holding the table (created if absent)")  # fmt: skip
    serve.add_argument("--seed", type=Path, metavar="ROUTING_YAML",
                       help="routing file to start from when STATE does not exist yet")  # fmt: skip
    serve.add_argument("--host", default="0.0.0.0",
                       help="address to listen on (default: %(default)s)")  # fmt: skip
    serve.add_argument("--port", type=int, default=DEFAULT_PORT,
                       help="port to listen on (default: %(default)s)")  # fmt: skip
    serve.add_argument("--token-env", default=DEFAULT_TOKEN_ENV, metavar="VAR",
                       help="environment variable holding the admin bearer token, the "
                       "gateways' own (default: %(default)s)")  # fmt: skip
    add_log_level(serve)
    serve.set_defaults(handler=run_routing_serve)


def run_routing_serve(args: argparse.Namespace) -> int:
    import asyncio

    from contracts.yaml_config import ConfigError
    from serving.routing import load_routing
    from serving.routing_service import serve_source

    configure_logging(args.log_level)
    token = os.environ.get(args.token_env, "").strip()
    if not token:
        raise ConfigError(f"--token-env: environment variable {args.token_env} is not set")
    seed = load_routing(args.seed) if args.seed is not None else None
    return asyncio.run(serve_source(args.state, seed, token, args.host, args.port))


def __getattr__(name: str) -> Any:
    """``USER_ERRORS``, imported only when asked for, as ``serving.cli`` does."""
    if name == "USER_ERRORS":
        from contracts.yaml_config import ConfigError
        from serving.routing_table import RoutingTableError

        return (ConfigError, RoutingTableError)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
