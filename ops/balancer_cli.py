"""``slipway balancer nginx``: the configuration of a per-call balancer in front of the
gateway replicas (see ``ops.balancer``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    balancer = subparsers.add_parser(
        "balancer",
        help="write the configuration of a gRPC balancer in front of gateway replicas",
        description="A gRPC client sends every call over one connection, which an L4 "
        "balancer pins to one replica; these configurations spread the calls themselves.",
    )
    kinds = balancer.add_subparsers(dest="balancer_kind", metavar="KIND", required=True)
    nginx = kinds.add_parser(
        "nginx",
        help="a standalone nginx.conf (run it with: nginx -p PREFIX -c FILE)",
        description="Write an nginx.conf that balances each gRPC call (and REST request) "
        "round robin over the replicas, and retries a call on the next replica when one "
        "refuses the connection.",
    )
    nginx.add_argument(
        "--grpc-listen", default="8500", metavar="[HOST:]PORT",
        help="where nginx takes gRPC calls (default 8500)",
    )  # fmt: skip
    nginx.add_argument(
        "--grpc-replica", action="append", required=True, metavar="HOST:PORT",
        help="a replica's gRPC address (repeat for each replica)",
    )  # fmt: skip
    nginx.add_argument("--rest-listen", metavar="[HOST:]PORT", help="also balance REST here")
    nginx.add_argument(
        "--rest-replica", action="append", default=[], metavar="HOST:PORT",
        help="a replica's REST address (repeat; with --rest-listen)",
    )  # fmt: skip
    nginx.add_argument("--prefix", type=Path, help="directory for nginx's pid and temp files")
    nginx.add_argument("--user", help="run nginx's workers as this user (nginx started as root)")
    nginx.add_argument("-o", "--output", type=Path, help="file to write (default: stdout)")
    nginx.set_defaults(handler=_write_nginx)


def _write_nginx(args: argparse.Namespace) -> int:
    from ops.balancer import Listen, nginx_config

    if bool(args.rest_listen) != bool(args.rest_replica):
        raise ValueError("give --rest-listen and --rest-replica together")
    rest = Listen(args.rest_listen, tuple(args.rest_replica)) if args.rest_listen else None
    text = nginx_config(
        Listen(args.grpc_listen, tuple(args.grpc_replica)),
        rest,
        prefix=args.prefix.absolute() if args.prefix else None,
        user=args.user,
    )
    if args.output is None:
        sys.stdout.write(text)
    else:
        args.output.write_text(text, encoding="utf-8")
    return 0


USER_ERRORS = (ValueError,)
