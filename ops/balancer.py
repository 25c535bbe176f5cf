"""Per-request balancing of gRPC (and REST) over gateway replicas: nginx configuration.

A gRPC client keeps one HTTP/2 connection and sends every call over it, so an L4 balancer
(a Kubernetes Service) pins each client to one replica for the connection's life: one
busy client loads one replica while the others idle, and a canary's weight is applied by
whichever replica the client happened to reach. A proxy that speaks HTTP/2 spreads the
*calls*: nginx's ``grpc_pass`` picks a replica for every call (round robin here), and
retries a call on the next replica when the one it picked refuses the connection (a
replica that died or restarts), marking it failed for ``fail_timeout``. Routing stays
consistent across replicas on its own: every replica reads the same routing config, and a
sticky key hashes to the same side of a split on all of them.

``nginx_config`` writes a whole ``nginx.conf`` (``slipway balancer nginx``); Kubernetes
deployments use Envoy instead (``ops/deploy/kubernetes/grpc-balancer.yaml``), which
re-resolves a headless Service as pods come and go and health-checks them over gRPC.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# TF Serving's clients send up to 64 MiB (the gateway's default max_message_bytes).
MAX_BODY = "64m"
# A replica that refused a connection gets no calls for this long.
FAIL_TIMEOUT_S = 5
# Long enough for a Predict the gateway queues for batching, or a slow model.
CALL_TIMEOUT_S = 300


@dataclass(frozen=True)
class Listen:
    """Where nginx listens for one protocol, and the replicas' ``host:port`` for it."""

    address: str  # ``port`` or ``host:port``
    replicas: tuple[str, ...]


def _check_address(address: str) -> str:
    host, _, port = address.rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536 or (":" in address and not host):
        raise ValueError(f"expected HOST:PORT or PORT, got {address!r}")
    return address


def _upstream(name: str, replicas: Sequence[str]) -> list[str]:
    if not replicas:
        raise ValueError(f"{name}: give at least one replica")
    servers = [
        f"        server {_check_address(replica)} max_fails=1 fail_timeout={FAIL_TIMEOUT_S}s;"
        for replica in replicas
    ]
    return [f"    upstream {name} {{", *servers, "        keepalive 32;", "    }"]


def nginx_config(
    grpc: Listen,
    rest: Listen | None = None,
    *,
    prefix: Path | None = None,
    user: str | None = None,
) -> str:
    """A standalone ``nginx.conf`` balancing gRPC calls (and REST requests, with
    ``rest``) over the replicas, run in the foreground (``nginx -p PREFIX -c FILE``).

    ``prefix`` keeps the pid file and nginx's buffers of large bodies in a directory of
    its own (the default is nginx's, which needs root); ``user`` runs the workers as
    that user when nginx starts as root.
    """
    _check_address(grpc.address)
    lines = [
        "# Written by `slipway balancer nginx`: per-call balancing of the gateway replicas.",
        "daemon off;",
        "worker_processes auto;",
        "error_log stderr warn;",
    ]
    if user:
        lines.append(f"user {user};")
    if prefix is not None:
        lines.append(f"pid {prefix / 'nginx.pid'};")
    lines += ["events {", "    worker_connections 4096;", "}", "http {", "    access_log off;"]
    if prefix is not None:
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
            lines.append(f"    {kind}_temp_path {prefix / (kind + '_temp')};")
    lines += [
        f"    client_max_body_size {MAX_BODY};",
        *_upstream("slipway_grpc", grpc.replicas),
        "    server {",
        f"        listen {grpc.address} http2;",
        "        location / {",
        "            grpc_pass grpc://slipway_grpc;",
        # A refused connection or a reset before any answer: the call never reached a
        # model, so it goes to the next replica.
        "            grpc_next_upstream error timeout;",
        "            grpc_next_upstream_tries 3;",
        f"            grpc_read_timeout {CALL_TIMEOUT_S}s;",
        f"            grpc_send_timeout {CALL_TIMEOUT_S}s;",
        "        }",
        "    }",
    ]
    if rest is not None:
        _check_address(rest.address)
        lines += [
            *_upstream("slipway_rest", rest.replicas),
            "    server {",
            f"        listen {rest.address};",
            "        location / {",
            "            proxy_pass http://slipway_rest;",
            "            proxy_http_version 1.1;",
            '            proxy_set_header Connection "";',
            "            proxy_set_header Host $host;",
            "            proxy_next_upstream error timeout;",
            f"            proxy_read_timeout {CALL_TIMEOUT_S}s;",
            "        }",
            "    }",
        ]
    lines.append("}")
    return "\n".join(lines) + "\n"
