"""Routing propagation benchmark: ``python -m benchmarks.routing [--quick]``.

Three real gateway replicas take a run of canary-weight changes, and the time from each
write to the moment every replica serves the new weight (``GET /admin/routing/<model>`` on
each) is measured, side by side in one run for:

1. ``source``: the replicas watch a routing source (``slipway routing serve``); the
   change is one ``PUT /v1/routing/<model>`` (goal: median and max <= 2 s);
2. ``file``: the replicas poll one shared routing file, rewritten per model under its
   lock (``serving.routing.update_routing_file``), as before the source existed.

Results are printed as a table and written to ``benchmarks/results/routing.json``.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from benchmarks.common import benchmark_parser, machine_info, write_results
from serving.routing_process import admin_call

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_FILE = REPO_ROOT / "benchmarks" / "results" / "routing.json"
MODEL = "bench"
REPLICAS = 3
TOKEN = "benchmark-admin-token"
CHANGES, QUICK_CHANGES = 50, 10
GOAL_S = 2.0
APPLY_TIMEOUT_S = 30.0
POLL_S = 0.002


def routing_body(weight: float) -> dict[str, Any]:
    return {"labels": {"stable": 1, "canary": 2}, "canary_weight": weight}


def wait_until_served(urls: list[str], weight: float, started: float) -> float:
    """Seconds from ``started`` until every replica serves ``weight`` (polling each)."""
    waiting = set(urls)
    deadline = started + APPLY_TIMEOUT_S
    while waiting:
        waiting = {
            url
            for url in waiting
            if admin_call(f"{url}/admin/routing/{MODEL}", TOKEN).get("canary_weight") != weight
        }
        if time.monotonic() > deadline:
            raise RuntimeError(f"weight {weight} not served by {sorted(waiting)}")
        time.sleep(POLL_S)  # measuring other processes: polling is the measurement
    return time.monotonic() - started


def measure(urls: list[str], write: Callable[[float], None], changes: int) -> list[float]:
    seconds = []
    for index in range(changes):
        weight = round(0.01 + index / (changes * 2), 4)
        started = time.monotonic()
        write(weight)
        seconds.append(wait_until_served(urls, weight, started))
    return seconds


@contextmanager
def replicas(work: Path, configs: list[Path]) -> Iterator[list[str]]:
    from serving.process import GatewayProcess

    root = work / "models"
    root.mkdir(exist_ok=True)  # routing needs no model: an empty repository serves
    env = {**os.environ, "SLIPWAY_ADMIN_TOKEN": TOKEN}
    gateways = [GatewayProcess(root, config=config, env=env) for config in configs]
    with ExitStack() as stack:
        with ThreadPoolExecutor(len(gateways)) as pool:
            list(pool.map(lambda g: stack.enter_context(g), gateways))
        yield [gateway.rest_url for gateway in gateways]


def run_source(work: Path, changes: int) -> list[float]:
    from serving.routing_process import RoutingSourceProcess, write_replica_config

    with RoutingSourceProcess(work / "routing-state.json", TOKEN) as source:
        configs = [
            write_replica_config(work / f"r{i}", source.url, ready_without_models=True)
            for i in range(REPLICAS)
        ]
        with replicas(work, configs) as urls:
            path = f"{source.url}/v1/routing/{MODEL}"
            return measure(urls, lambda w: admin_call(path, TOKEN, "PUT", routing_body(w)), changes)


def run_file(work: Path, changes: int) -> list[float]:
    from serving.routing import ModelRouting, update_routing_file

    routing_file = work / "routing.yaml"
    configs = []
    for index in range(REPLICAS):
        directory = work / f"f{index}"
        directory.mkdir()
        config = {
            "routing_file": str(routing_file),
            "admin": {"token_env": "SLIPWAY_ADMIN_TOKEN"},
            "ready_without_models": True,  # routing needs no model
        }
        (directory / "gateway.yaml").write_text(json.dumps(config))
        configs.append(directory / "gateway.yaml")
    update_routing_file(routing_file, {MODEL: ModelRouting.model_validate(routing_body(0.0))})
    with replicas(work, configs) as urls:

        def write(weight: float) -> None:
            update_routing_file(
                routing_file, {MODEL: ModelRouting.model_validate(routing_body(weight))}
            )

        return measure(urls, write, changes)


def summary(seconds: list[float]) -> dict[str, float]:
    return {
        "changes": len(seconds),
        "median_s": statistics.median(seconds),
        "p90_s": statistics.quantiles(seconds, n=10)[-1] if len(seconds) > 1 else seconds[0],
        "max_s": max(seconds),
    }


def print_table(results: dict[str, Any]) -> None:
    print(f"\nwrite -> all {REPLICAS} replicas serve it (goal <= {GOAL_S:g} s)")
    print(f"{'mode':<8}{'changes':>9}{'median s':>11}{'p90 s':>9}{'max s':>9}")
    for mode, row in results["modes"].items():
        print(f"{mode:<8}{row['changes']:>9}{row['median_s']:>11.3f}{row['p90_s']:>9.3f}"
              f"{row['max_s']:>9.3f}")  # fmt: skip
    print(f"file / source median ratio: {results['file_over_source_median']:.1f}x")


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(
        "benchmarks.routing", __doc__, f"{QUICK_CHANGES} changes instead of {CHANGES}",
        RESULTS_FILE,
    )  # fmt: skip
    args = parser.parse_args(argv)
    changes = QUICK_CHANGES if args.quick else CHANGES
    with tempfile.TemporaryDirectory(prefix="slipway-routing-bench-") as tmp:
        work = Path(tmp)
        (work / "source").mkdir()
        (work / "file").mkdir()
        modes = {
            "source": summary(run_source(work / "source", changes)),
            "file": summary(run_file(work / "file", changes)),
        }
    results = {
        "quick": args.quick,
        "machine": machine_info(),
        "replicas": REPLICAS,
        "goal_s": GOAL_S,
        "modes": modes,
        "file_over_source_median": modes["file"]["median_s"] / modes["source"]["median_s"],
        "goal_met": modes["source"]["max_s"] <= GOAL_S,
    }
    write_results(args.output, results, print_table)
    return 0 if results["goal_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
