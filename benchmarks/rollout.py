"""Rollout benchmark: ``python -m benchmarks.rollout [--quick]``.

A bad canary (a version failing 20 % of its requests) is rolled out at 10 % against a real
gateway process under steady client load, and the controller takes it back out. Measured
side by side in one run, for a real Prometheus scraping every second and for the
embedded scraper of the gateway's ``/metrics``, each with failover on and off:

1. seconds from the canary receiving traffic to its weight being 0 on the gateway
   (goal <= 10 s with 1 s scrapes and a 2 s analysis interval);
2. errors the clients saw while the canary was live: with failover (goal 0) and without
   (goal: at most the canary's weight x the requests sent before the rollback).

Results are printed as a table and written to ``benchmarks/results/rollout.json``.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from benchmarks.common import benchmark_parser, machine_info, write_results

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_FILE = REPO_ROOT / "benchmarks" / "results" / "rollout.json"
MODEL = "bench"
FEATURES = 16
STABLE, CANARY = 1, 2
ERROR_PERCENT = 20
CANARY_PERCENT = 10
RATE = 100.0
INTERVAL_S = 2.0
SCRAPE_INTERVAL = "1s"
ANALYSIS = {"window": "6s", "min_requests": 20}
TOKEN = "benchmark-admin-token"
ROLLOUT_TIMEOUT_S = 60.0
DRAIN_TIMEOUT_S = 30.0
SECONDS_GOAL = 10.0
PROVIDERS = ("prometheus", "scrape")


def publish_models(root: Path) -> dict[str, Any]:
    """A small dense model as training exports it (version 1), and version 2 wrapping it
    to fail the 20 % of requests whose inputs hash low; returns the signature."""
    import tf_keras as keras

    from contracts.model_manifest import write_model_manifest
    from contracts.model_repository import publish_version
    from slipway.demo_rollout import publish_faulty_version
    from training.export import save_serving_model

    keras.utils.set_random_seed(0)
    features = keras.Input((FEATURES,), name="features")
    hidden = keras.layers.Dense(32, activation="relu")(features)
    model = keras.Model(
        features, keras.layers.Dense(4, activation="softmax", name="scores")(hidden)
    )
    signature: dict[str, Any] = {}

    def write(directory: Path) -> None:
        signature.update(save_serving_model(model, directory))
        write_model_manifest(directory, {"name": MODEL, "signature": signature})

    _, stable = publish_version(root, MODEL, write, version=STABLE)
    publish_faulty_version(stable, root, MODEL, CANARY, error_percent=ERROR_PERCENT)
    return signature


def one_rollout(
    work: Path, url: str, provider: Any, load: Any, *, failover: bool, name: str
) -> dict[str, Any]:
    """Roll the bad canary out once and measure how long it stayed and what clients saw."""
    from ops.analysis import AnalysisConfig
    from ops.controller import Controller, start_rollout
    from ops.events import EventLog
    from ops.gateway_admin import GatewayAdmin
    from ops.state import RolloutSpec, StateStore, Targets

    store = StateStore(work / "state" / name)
    admin = GatewayAdmin([url], TOKEN)
    spec = RolloutSpec(
        model=MODEL,
        stable_version=STABLE,
        canary_version=CANARY,
        steps=[CANARY_PERCENT, 50, 100],
        bake_seconds=30,
        interval_seconds=INTERVAL_S,
        failover=failover,
        analysis=AnalysisConfig.model_validate(ANALYSIS).model_dump(mode="json"),
        targets=Targets(gateways=[url]),
    )
    before = load.counts()
    with store.lock(MODEL):
        controller = Controller(start_rollout(store, spec, admin), store, admin)
        stop = threading.Event()
        guard = threading.Timer(ROLLOUT_TIMEOUT_S, stop.set)
        guard.start()
        try:
            final = controller.run(provider, stop=stop)
        finally:
            guard.cancel()
    after = load.counts()
    if final.phase.value != "rolled_back":
        raise RuntimeError(f"{name}: the bad canary ended {final.phase.value}: {final.reason}")
    events = EventLog(store.events_path(MODEL)).read()
    live = next(e.at for e in events if e.kind == "transition" and e.phase == "progressing")
    failed = next(e for e in events if e.kind == "analysis" and e.outcome == "fail")
    zero = next(e.at for e in events if e.kind == "transition" and e.phase == "rolled_back")
    sent = after.sent - before.sent
    return {
        "failover": failover,
        "seconds_to_weight_zero": round(zero - live, 2),
        "seconds_to_failing_verdict": round(failed.at - live, 2),
        "analyses": sum(1 for e in events if e.kind == "analysis"),
        "requests_sent": sent,
        "client_errors": after.errors - before.errors,
        "error_bound": round(CANARY_PERCENT / 100 * sent, 1),
        "canary_requests_judged": failed.numbers["canary"]["requests"],
        "canary_errors_judged": failed.numbers["canary"]["errors"],
        "reason": final.reason,
    }


def wait_for_quiet_canary(provider: Any, window: float) -> None:
    """Wait until the window holds no canary traffic, so one run's errors never count
    toward the next run's first verdict."""
    from ops.measurement import MetricsUnavailable

    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            if provider.measure(MODEL, STABLE, CANARY, window).canary.requests == 0:
                return
        except MetricsUnavailable:  # the metrics source may be briefly away; keep waiting
            pass
        time.sleep(0.5)  # the window drains with time; nothing to wait on but the clock
    raise RuntimeError(f"canary traffic still in the {window:g}s window after {DRAIN_TIMEOUT_S}s")


def bench(work: Path, repeats: int) -> dict[str, Any]:
    from ops.analysis import AnalysisConfig
    from ops.prometheus import PrometheusClient, PrometheusProvider
    from ops.scrape import ScrapeProvider
    from serving.process import GatewayProcess
    from slipway.demo_rollout import TOKEN_ENV, ClientLoad, request_pool, write_gateway_config
    from tests.ops.prometheus_process import PrometheusProcess

    root = work / "models"
    signature = publish_models(root)
    config = write_gateway_config(work / "gateway", routing={MODEL: {"labels": {"stable": STABLE}}})
    analysis = AnalysisConfig.model_validate(ANALYSIS)
    runs: list[dict[str, Any]] = []
    with (
        GatewayProcess(root, config=config, env={TOKEN_ENV: TOKEN}) as gateway,
        PrometheusProcess([gateway.rest_url.removeprefix("http://")],
                          scrape_interval=SCRAPE_INTERVAL) as prometheus,
        ClientLoad([gateway.rest_url], MODEL, request_pool(signature), rate=RATE) as load,
    ):  # fmt: skip
        prometheus.wait_for_targets()
        providers = {
            "prometheus": PrometheusProvider(PrometheusClient(prometheus.url), analysis),
            "scrape": ScrapeProvider([gateway.rest_url]),
        }
        try:
            for repeat in range(repeats):
                for name, provider in providers.items():
                    for failover in (False, True):
                        wait_for_quiet_canary(provider, analysis.window)
                        label = f"{name}-{'failover' if failover else 'plain'}-{repeat}"
                        result = one_rollout(
                            work, gateway.rest_url, provider, load, failover=failover, name=label
                        )
                        runs.append({"provider": name, **result})
                        print(f"{label}: {result['seconds_to_weight_zero']} s to weight 0, "
                              f"{result['client_errors']} client errors")  # fmt: skip
        finally:
            for provider in providers.values():
                provider.close()
    return {
        "settings": {
            "scrape_interval": SCRAPE_INTERVAL,
            "interval_s": INTERVAL_S,
            "analysis": ANALYSIS,
            "canary_percent": CANARY_PERCENT,
            "canary_error_percent": ERROR_PERCENT,
            "client_rate": RATE,
            "repeats": repeats,
        },
        "runs": runs,
        "summary": summarise(runs),
    }


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for provider in PROVIDERS:
        for failover in (False, True):
            chosen = [r for r in runs if r["provider"] == provider and r["failover"] == failover]
            if not chosen:
                continue
            seconds = [r["seconds_to_weight_zero"] for r in chosen]
            errors = sum(r["client_errors"] for r in chosen)
            bound = sum(r["error_bound"] for r in chosen)
            key = f"{provider}, failover {'on' if failover else 'off'}"
            summary[key] = {
                "median_seconds_to_weight_zero": round(statistics.median(seconds), 2),
                "max_seconds_to_weight_zero": max(seconds),
                "median_seconds_to_failing_verdict": round(
                    statistics.median(r["seconds_to_failing_verdict"] for r in chosen), 2
                ),
                "requests_sent": sum(r["requests_sent"] for r in chosen),
                "client_errors": errors,
                "error_goal": 0 if failover else round(bound, 1),
                "seconds_goal_met": max(seconds) <= SECONDS_GOAL,
                "errors_goal_met": errors == 0 if failover else errors <= bound,
            }
    return summary


def print_table(results: Mapping[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"Slipway rollout benchmark: a canary failing {ERROR_PERCENT}% at "
        f"{CANARY_PERCENT}%{' (quick)' if results['quick'] else ''}"
    )
    for column in (
        "metrics source", "failover", "s to weight 0 (median / max)", "s to fail verdict",
        "client errors / requests", "goal", "status",
    ):  # fmt: skip
        table.add_column(column)
    for key, row in results["summary"].items():
        provider, failover = key.split(", failover ")
        errors_goal = "0" if failover == "on" else f"<= {row['error_goal']:g}"
        goal = f"<= {SECONDS_GOAL:g} s, {errors_goal} errors"
        met = row["seconds_goal_met"] and row["errors_goal_met"]
        table.add_row(
            provider, failover,
            f"{row['median_seconds_to_weight_zero']:.1f} / {row['max_seconds_to_weight_zero']:.1f}",
            f"{row['median_seconds_to_failing_verdict']:.1f}",
            f"{row['client_errors']} / {row['requests_sent']}", goal,
            "[green]met" if met else "[red]missed",
        )  # fmt: skip
    Console().print(table)


def run(quick: bool, output: Path) -> dict[str, Any]:

    with tempfile.TemporaryDirectory(prefix="slipway-bench-rollout-") as tmp:
        results: dict[str, Any] = {
            "quick": quick,
            "machine": machine_info(),
            **bench(Path(tmp), repeats=1 if quick else 3),
        }
    write_results(output, results, print_table)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(
        "benchmarks.rollout", __doc__, "one rollout per configuration", RESULTS_FILE
    )
    args = parser.parse_args(argv)
    run(args.quick, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
