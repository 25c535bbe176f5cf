"""Serving peers benchmark: ``python -m benchmarks.serving_peers [--quick]``.

The gateway side by side with the servers a team would otherwise pick, from one run, on
the same SavedModel (the MLP of ``benchmarks.serving``), each batching up to 64 rows for
at most 5 ms, each measured alone under the same load:

- Slipway's gateway (``slipway serve``) over TF Serving's REST API and over gRPC, as one
  process and as a pool of two (``--processes 2``, the machine's cores);
- MLServer with adaptive batching and a custom runtime over its V2 (Open Inference
  Protocol) REST API (``benchmarks.peer_mlserver``);
- Ray Serve, one replica with ``@serve.batch``, over HTTP (``benchmarks.peer_ray``).

The REST load comes from one generator for all of them: a separate process running 64
concurrent ``aiohttp`` clients, each sending one request after the other for a fixed time
after a warm-up, its request body built once per protocol; a non-200 answer is an error.
gRPC uses ``benchmarks.serving``'s generator. Before any load, every server answers the
same row, and the answers must agree, so the figures compare the same computation.

Goals: Slipway >= 3x the best peer's QPS, and Slipway's p99 <= 2x its p50, over REST and
gRPC. MLServer and Ray Serve run from ``.venv-peers`` (``make peers``); without it the
benchmark says so and exits 2. Results are printed as a table and written to
``benchmarks/results/serving-peers.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import benchmark_parser, machine_info, write_results
from benchmarks.peer_servers import (
    PeersVenvMissing,
    Server,
    mlserver,
    ray_serve,
    require_peers_venv,
    slipway_gateway,
)
from benchmarks.serving import (
    BATCHING,
    DEPTH,
    FEATURES,
    FULL,
    MANY_CLIENTS,
    MODEL,
    POOL_PROCESSES,
    QUICK,
    WIDTH,
    Sizes,
    freeze_heap,
    load_figures,
    measure,
    publish_model,
    request_row,
    run_load_generator,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_FILE = REPO_ROOT / "benchmarks" / "results" / "serving-peers.json"
QPS_GOAL = 3.0  # Slipway's QPS over the best peer's
TAIL_GOAL = 2.0  # Slipway's p99 over its p50
REQUEST_TIMEOUT_S = 10.0
PROTOCOLS = ("tfserving", "v2", "ray")
# The peers batch as the gateway does: up to this many rows, waiting at most this long.
PEER_MAX_BATCH_SIZE = BATCHING["max_batch_size"]
PEER_MAX_BATCH_TIME_S = BATCHING["batch_timeout_micros"] / 1e6
SLIPWAY, MLSERVER, RAY = "Slipway", "MLServer", "Ray Serve"
SLIPWAY_POOL = f"Slipway, {POOL_PROCESSES} processes"
GOAL_KEYS = {"tfserving": "rest", "grpc": "grpc"}  # Slipway's rows, as the goals name them
PROTOCOL_LABELS = {
    "tfserving": "REST (TF Serving)",
    "grpc": "gRPC (TF Serving)",
    "v2": "REST (V2)",
    "ray": "HTTP (JSON rows)",
}


# --- the wire formats -----------------------------------------------------------------------


def request_body(protocol: str, rows: np.ndarray) -> bytes:
    """The JSON body ``protocol`` sends ``rows`` as: TF Serving's row format (which the
    Ray Serve route takes too) or V2's tensor format."""
    if protocol in ("tfserving", "ray"):
        return json.dumps({"instances": rows.tolist()}).encode()
    if protocol == "v2":
        tensor = {"name": "features", "shape": list(rows.shape), "datatype": "FP32"}
        return json.dumps({"inputs": [{**tensor, "data": rows.ravel().tolist()}]}).encode()
    raise ValueError(f"unknown protocol {protocol!r}; expected one of {', '.join(PROTOCOLS)}")


def answer_scores(protocol: str, answer: Mapping[str, Any]) -> np.ndarray:
    """The scores in an answer to ``request_body(protocol, ...)``."""
    if protocol == "v2":
        (output,) = answer["outputs"]
        return np.asarray(output["data"], np.float32).reshape(output["shape"])
    return np.asarray(answer["predictions"], np.float32)


def predict_rest(url: str, protocol: str, rows: np.ndarray) -> np.ndarray:
    request = urllib.request.Request(
        url, request_body(protocol, rows), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
        return answer_scores(protocol, json.load(response))


def predict_grpc(target: str, rows: np.ndarray) -> np.ndarray:
    import grpc
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    from serving.tensors import numpy_to_tensor_proto, tensor_proto_to_numpy

    request = predict_pb2.PredictRequest()
    request.model_spec.name = MODEL
    request.inputs["features"].CopyFrom(numpy_to_tensor_proto(rows))
    with grpc.insecure_channel(target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        response = stub.Predict(request, timeout=REQUEST_TIMEOUT_S)
    (output,) = response.outputs.values()
    return tensor_proto_to_numpy(output)


def check_agreement(servers: Mapping[str, Server]) -> dict[str, Any]:
    """Every server's and protocol's scores for the same row, against Slipway's REST
    answer; raises when one differs beyond float32 rounding."""
    rows = request_row()
    scores = {}
    for server in servers.values():
        for protocol, endpoint in server.endpoints.items():
            label = f"{server.name} {PROTOCOL_LABELS[protocol]}"
            if protocol == "grpc":
                scores[label] = predict_grpc(endpoint, rows)
            else:
                scores[label] = predict_rest(endpoint, protocol, rows)
    reference_label, reference = next(iter(scores.items()))
    differences = {
        label: float(np.max(np.abs(value - reference))) if value.shape == reference.shape else None
        for label, value in scores.items()
    }
    disagreeing = [
        label
        for label, value in scores.items()
        if value.shape != reference.shape or not np.allclose(value, reference)
    ]
    if disagreeing:
        raise RuntimeError(
            f"the servers' answers differ from {reference_label}'s: "
            + "; ".join(f"{label}: {scores[label].tolist()}" for label in disagreeing)
            + f" (reference {reference.tolist()})"
        )
    return {"reference": reference_label, "max_abs_difference": differences, "agree": True}


# --- load -----------------------------------------------------------------------------------


def measure_rest(url: str, protocol: str, clients: int, sizes: Sizes) -> dict[str, Any]:
    """Run the REST load generator in its own process and return its figures."""
    arguments = ["--load-rest", url, "--protocol", protocol, "--clients", str(clients)]
    return run_load_generator("benchmarks.serving_peers", arguments, sizes)


async def generate_rest_load(
    url: str, protocol: str, clients: int, seconds: float, warmup: float
) -> dict[str, Any]:
    """``clients`` concurrent callers, each POSTing one request after the other; only
    answers completed after the warm-up are timed, errors are counted throughout. The
    generator's own CPU use is reported too: on two cores, what it takes the server has
    not, so a generator near 100 % means the figures are the client's limit."""
    import aiohttp

    body = request_body(protocol, request_row())
    latencies: list[float] = []
    errors: dict[str, int] = {}
    freeze_heap()  # the generator's own collections would show up as server latency
    connector = aiohttp.TCPConnector(limit=clients)  # one kept-alive connection per caller
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        started, cpu_started = time.monotonic(), time.process_time()
        recording_from = started + warmup
        stop_at = recording_from + seconds

        async def caller() -> None:
            while (now := time.monotonic()) < stop_at:
                try:
                    async with session.post(url, data=body, headers=headers) as response:
                        await response.read()
                        status = response.status
                except (aiohttp.ClientError, TimeoutError) as exc:
                    errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                    continue
                if status != 200:
                    errors[f"HTTP {status}"] = errors.get(f"HTTP {status}", 0) + 1
                    continue
                if now >= recording_from:
                    latencies.append(time.monotonic() - now)

        await asyncio.gather(*(caller() for _ in range(clients)))
        cpu_percent = 100 * (time.process_time() - cpu_started) / (time.monotonic() - started)
    figures = load_figures(clients, seconds, latencies, errors)
    return {**figures, "generator_cpu_percent": round(cpu_percent, 1)}


# --- the benchmark --------------------------------------------------------------------------


@contextlib.contextmanager
def started(
    workdir: Path, model_root: Path, version_dir: Path
) -> Iterator[tuple[dict[str, Server], Callable[[str], None]]]:
    """The three servers, started together (their start-ups overlap) and all ready;
    yields them by name with a ``stop(name)`` that stops one early (every one is stopped
    on the way out in any case)."""
    launchers = {
        SLIPWAY: slipway_gateway(workdir, model_root, BATCHING),
        SLIPWAY_POOL: slipway_gateway(workdir, model_root, BATCHING, POOL_PROCESSES),
        MLSERVER: mlserver(workdir, version_dir, PEER_MAX_BATCH_SIZE, PEER_MAX_BATCH_TIME_S),
        RAY: ray_serve(workdir, version_dir, PEER_MAX_BATCH_SIZE, PEER_MAX_BATCH_TIME_S),
    }
    with contextlib.ExitStack() as everything:
        stacks = {name: everything.enter_context(contextlib.ExitStack()) for name in launchers}
        servers = {name: stacks[name].enter_context(cm) for name, cm in launchers.items()}
        for server in servers.values():
            server.wait_ready()
        yield servers, lambda name: stacks[name].close()


def bench(workdir: Path, sizes: Sizes) -> dict[str, Any]:
    """Start all three, check they agree, then measure the peers first and Slipway last,
    stopping each peer once measured: a server under load shares the 2 cores only with the
    load generator and idle servers, never with Ray's background work."""
    model_root = workdir / "models"
    version_dir = publish_model(model_root)
    with started(workdir, model_root, version_dir) as (servers, stop):
        agreement = check_agreement(servers)
        rows = []
        for name in (RAY, MLSERVER):
            ((protocol, url),) = servers[name].endpoints.items()
            rows.append(_row(name, protocol, measure_rest(url, protocol, MANY_CLIENTS, sizes)))
            stop(name)
        for name in (SLIPWAY, SLIPWAY_POOL):
            endpoints = servers[name].endpoints
            rest = measure_rest(endpoints["tfserving"], "tfserving", MANY_CLIENTS, sizes)
            rows.append(_row(name, "tfserving", rest))
            rows.append(_row(name, "grpc", measure(endpoints["grpc"], MANY_CLIENTS, sizes)))
            stop(name)
    return {"agreement": agreement, **summarize(rows)}


def _row(server: str, protocol: str, figures: Mapping[str, Any]) -> dict[str, Any]:
    p50, p99 = figures["p50_ms"], figures["p99_ms"]
    tail = round(p99 / p50, 2) if p50 and p99 else None
    return {
        "server": server,
        "protocol": protocol,
        "api": PROTOCOL_LABELS[protocol],
        **figures,
        "p99_over_p50": tail,
    }


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Each row's QPS against the best peer's, and Slipway's goals per protocol."""
    peers = [row for row in rows if not _is_slipway(row)]
    best = max(peers, key=lambda row: row["qps"])
    for row in rows:
        row["qps_vs_best_peer"] = round(row["qps"] / best["qps"], 2) if best["qps"] else None
    goals: dict[str, Any] = {
        "qps_vs_best_peer": {"goal": f">= {QPS_GOAL:g}x", "target": QPS_GOAL},
        "p99_over_p50": {"goal": f"<= {TAIL_GOAL:g}x", "target": TAIL_GOAL},
    }
    for row in filter(_is_slipway, rows):
        ratio, tail = row["qps_vs_best_peer"], row["p99_over_p50"]
        key = _goal_key(row)
        goals["qps_vs_best_peer"][key] = {
            "value": ratio,
            "met": ratio is not None and ratio >= QPS_GOAL and not row["errors"],
        }
        goals["p99_over_p50"][key] = {
            "value": tail,
            "met": tail is not None and tail <= TAIL_GOAL and not row["errors"],
        }
    return {
        "rows": rows,
        "best_peer": {"server": best["server"], "api": best["api"], "qps": best["qps"]},
        "goals": goals,
    }


# --- report ---------------------------------------------------------------------------------


def _is_slipway(row: Mapping[str, Any]) -> bool:
    return row["server"] in (SLIPWAY, SLIPWAY_POOL)


def _goal_key(row: Mapping[str, Any]) -> str:
    """``rest`` / ``grpc`` for one process, with ``_pool`` for the pool's rows."""
    return GOAL_KEYS[row["protocol"]] + ("_pool" if row["server"] == SLIPWAY_POOL else "")


def _status(ok: bool) -> str:
    return "[green]met[/]" if ok else "[red]missed[/]"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def print_table(results: Mapping[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    goals = results["goals"]
    table = Table(
        title=f"Slipway vs MLServer and Ray Serve, {MANY_CLIENTS} clients, batching <= "
        f"{PEER_MAX_BATCH_SIZE} rows / {PEER_MAX_BATCH_TIME_S * 1000:g} ms"
        f"{' (quick)' if results['quick'] else ''}",
        caption=f"goals for Slipway: QPS {goals['qps_vs_best_peer']['goal']} the best peer's "
        f"({results['best_peer']['server']}), p99 {goals['p99_over_p50']['goal']} p50",
    )
    for column in ("server", "protocol", "QPS", "p50 ms", "p99 ms", "p99/p50", "errors"):
        table.add_column(column, justify="left" if column in ("server", "protocol") else "right")
    table.add_column("QPS vs best peer", justify="right")
    for row in results["rows"]:
        tail = "-" if row["p99_over_p50"] is None else f"{row['p99_over_p50']:.2f}"
        ratio = "-" if row["qps_vs_best_peer"] is None else f"{row['qps_vs_best_peer']:.2f}x"
        if _is_slipway(row):
            key = _goal_key(row)
            tail += f" {_status(goals['p99_over_p50'][key]['met'])}"
            ratio += f" {_status(goals['qps_vs_best_peer'][key]['met'])}"
        errors = sum(row["errors"].values())
        table.add_row(
            row["server"], row["api"], f"{row['qps']:,.0f}", _ms(row["p50_ms"]),
            _ms(row["p99_ms"]), tail, f"[red]{errors}[/]" if errors else "0", ratio,
        )  # fmt: skip
    Console(width=160).print(table)


def run_peers(quick: bool, output: Path) -> dict[str, Any]:
    """Measure Slipway, MLServer and Ray Serve, write ``output`` and print the table.
    Raises ``PeersVenvMissing`` (its message says how to create ``.venv-peers``) before
    starting anything when the peers are not installed."""
    versions = require_peers_venv()
    sizes = QUICK if quick else FULL
    with tempfile.TemporaryDirectory(prefix="slipway-bench-peers-") as tmp:
        results: dict[str, Any] = {
            "quick": quick,
            "machine": machine_info(),
            "peers": versions,
            "model": {"name": MODEL, "features": FEATURES, "width": WIDTH, "depth": DEPTH},
            "clients": MANY_CLIENTS,
            "seconds": sizes.seconds,
            "warmup_seconds": sizes.warmup_seconds,
            "batching": {
                "slipway": BATCHING,
                "peers": {
                    "max_batch_size": PEER_MAX_BATCH_SIZE,
                    "max_wait_s": PEER_MAX_BATCH_TIME_S,
                },
            },
            **bench(Path(tmp), sizes),
        }
    write_results(output, results, print_table)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(
        "benchmarks.serving_peers", __doc__, "3 s per measurement", RESULTS_FILE
    )
    parser.add_argument("--load-rest", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--protocol", choices=PROTOCOLS, help=argparse.SUPPRESS)
    parser.add_argument("--clients", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, default=3.0, help=argparse.SUPPRESS)
    parser.add_argument("--warmup", type=float, default=1.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.load_rest:
        if args.protocol is None:
            parser.error("--load-rest needs --protocol")
        figures = asyncio.run(
            generate_rest_load(
                args.load_rest, args.protocol, args.clients, args.seconds, args.warmup
            )
        )
        print(json.dumps(figures))
        return 0
    try:
        run_peers(args.quick, args.output)
    except PeersVenvMissing as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
