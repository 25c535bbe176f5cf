"""One fleet for every canary rollout test: two gateway processes and a real Prometheus.

Starting two gateways (a TensorFlow start-up each) and Prometheus costs more than most of
the rollouts they serve, so the ``rollout_fleet`` fixture starts them once per run. Its
model repository holds every version any rollout test rolls out, next to stable version
1. Each test module drives the fleet with its own client traffic and analysis file
(``Rollouts``), and each rollout runs ``slipway canary`` in the test process, the way the
rollout demo does, unless the test is about the controller's own process.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from ops.events import Event, EventLog
from ops.gateway_admin import GatewayAdmin
from ops.state import Phase, StateStore
from serving.process import GatewayProcess
from serving.routing import ModelRouting
from slipway.cli import main
from slipway.demo_rollout import (
    TOKEN_ENV,
    ClientLoad,
    publish_copy,
    publish_faulty_version,
    write_gateway_config,
)
from tests.support.prometheus import PrometheusProcess
from tests.support.serving_models import MODEL_NAME, ServingModel

MODEL = MODEL_NAME
TOKEN = "rollout-test-token"
RATE = 60  # client requests per second over both replicas
CONTROLLER_TIMEOUT_S = 60.0

# The versions in the fleet's repository.
STABLE = 1
# Unchanged copies of stable, one per rollout that must succeed, so no rollout finds its
# canary already promoted by another.
GOOD, GOOD_OUTAGE, GOOD_KILLED, EQUAL = 2, 5, 6, 7
FAILING = 3  # fails the 20 % of requests whose inputs hash low
SLOW = 4  # waits SLOW_DELAY_MS per call
LESS_ACCURATE = 8  # rotates the class scores of SWAP_PERCENT % of rows
SLOW_DELAY_MS = 100
SWAP_PERCENT = 40


@dataclass(frozen=True)
class Fleet:
    """Two gateway replicas serving the repository, and Prometheus scraping both."""

    gateways: list[GatewayProcess]
    prometheus: PrometheusProcess
    routing_file: Path
    env: dict[str, str]

    @property
    def urls(self) -> list[str]:
        return [gateway.rest_url for gateway in self.gateways]

    def admin(self) -> GatewayAdmin:
        return GatewayAdmin(self.urls, TOKEN)

    def traffic(self, pool: Sequence[dict], **options: Any) -> ClientLoad:
        """Steady client traffic over ``pool`` to both replicas (``options`` go to
        ``ClientLoad``: labels and their feedback delay)."""
        return ClientLoad(self.urls, MODEL, pool, rate=RATE, **options)


@dataclass(frozen=True)
class Rollouts(Fleet):
    """The fleet as one test module drives it: with its traffic and its analysis file."""

    load: ClientLoad
    analysis: Path

    @classmethod
    def on(cls, fleet: Fleet, load: ClientLoad, analysis: Path) -> Rollouts:
        shared = {field.name: getattr(fleet, field.name) for field in fields(Fleet)}
        return cls(**shared, load=load, analysis=analysis)


def publish_versions(root: Path, serving_model: ServingModel) -> None:
    """Stable and every canary the rollout tests roll out, under ``root``."""
    stable = serving_model.publish(root, STABLE)
    for version in (GOOD, GOOD_OUTAGE, GOOD_KILLED, EQUAL):
        publish_copy(stable, root, MODEL, version)
    publish_faulty_version(stable, root, MODEL, FAILING, error_percent=20)
    publish_faulty_version(stable, root, MODEL, SLOW, delay_ms=SLOW_DELAY_MS)
    publish_faulty_version(stable, root, MODEL, LESS_ACCURATE, swap_percent=SWAP_PERCENT)


@contextlib.contextmanager
def running_fleet(work: Path, serving_model: ServingModel) -> Iterator[Fleet]:
    """Publish the versions under ``work``, start both replicas and Prometheus, and wait
    until Prometheus has scraped both."""
    root = work / "models"
    publish_versions(root, serving_model)
    config = write_gateway_config(work / "gateway", routing={MODEL: {"labels": {"stable": STABLE}}})
    env = {**os.environ, TOKEN_ENV: TOKEN}
    gateways = [GatewayProcess(root, config=config, env=env) for _ in range(2)]
    try:
        with ThreadPoolExecutor(len(gateways)) as starting:
            list(starting.map(lambda gateway: gateway.start(), gateways))
        targets = [gateway.rest_url.removeprefix("http://") for gateway in gateways]
        with PrometheusProcess(targets) as prometheus:
            prometheus.wait_for_targets()
            yield Fleet(gateways, prometheus, config.parent / "routing.yaml", env)
    finally:
        for gateway in gateways:
            if gateway.process is not None:
                gateway.__exit__(None, None, None)


def reset(fleet: Fleet) -> None:
    """The model back on stable alone on every replica, as each rollout test starts."""
    fleet.admin().set_routing(MODEL, ModelRouting(labels={"stable": STABLE}))


# -- the controller -----------------------------------------------------------------------


def start_args(rollouts: Rollouts, version: int, *extra: str, prometheus: bool = True) -> list[str]:
    """``canary start`` of ``version`` in steps of 10, 50 and 100 %, baking 2 s each."""
    args = ["start", MODEL, "--version", str(version), "--steps", "10,50,100", "--bake", "2s",
            "--interval", "1s", "--analysis", str(rollouts.analysis), "--token-env", TOKEN_ENV,
            "--routing-file", str(rollouts.routing_file), *extra]  # fmt: skip
    for url in rollouts.urls:
        args += ["--gateway", url]
    if prometheus:
        args += ["--prometheus", rollouts.prometheus.url]
    return args


def canary(store: StateStore, *args: str) -> tuple[int, str]:
    """``slipway canary ARGS`` in this process (the admin token in the environment, as
    the ``store`` fixture sets it): its exit code and everything it printed."""
    output = io.StringIO()
    with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
        code = main(["canary", *args, "--state-dir", str(store.root)])
    return code, output.getvalue()


def spawn(rollouts: Rollouts, store: StateStore, *args: str) -> subprocess.Popen[str]:
    """``slipway canary ARGS`` as a process of its own, for a test that signals or outlives
    the controller."""
    return subprocess.Popen(
        [sys.executable, "-m", "slipway", "canary", *args, "--state-dir", str(store.root)],
        env=rollouts.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(
    process: subprocess.Popen[str], timeout: float = CONTROLLER_TIMEOUT_S
) -> tuple[int, str]:
    """A spawned controller's exit code and output, killing it after ``timeout`` s."""
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
        raise AssertionError(
            f"the controller did not finish within {timeout}s:\n{output}"
        ) from None
    return process.returncode, output


def rollout(
    rollouts: Rollouts, store: StateStore, version: int, *extra: str, prometheus: bool = True
) -> str:
    """Run a rollout to its end; the controller's output."""
    code, output = canary(store, *start_args(rollouts, version, *extra, prometheus=prometheus))
    state = store.load(MODEL)
    assert state is not None, output
    assert code == (0 if state.phase is Phase.SUCCEEDED else 1), output
    return output


def events(store: StateStore) -> list[Event]:
    return EventLog(store.events_path(MODEL)).read()


def replica_routing(fleet: Fleet) -> ModelRouting:
    """The routing every replica agrees on (the admin client refuses a disagreement)."""
    return fleet.admin().routing(MODEL)
