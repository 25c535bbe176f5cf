"""``slipway canary``: progressive delivery of a model version, judged on live metrics.

``start`` runs the controller in the foreground until the rollout is promoted or rolled
back (Ctrl-C leaves it where it is; ``start`` or ``resume`` picks it up again from its
state file). The other commands steer a rollout: they hand the command to the running
controller, or apply it themselves when no controller is running.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

console = Console()

DEFAULT_STEPS = "1,5,25,50,100"
# Chosen on the simulated rollouts of benchmarks/rollout.py: analysing every 2 s rolls a
# bad canary back within 10 s of 1 s scrapes at the default failure limit.
DEFAULT_INTERVAL_S = 2.0
DEFAULT_BAKE_S = 30.0
DEFAULT_TOKEN_ENV = "SLIPWAY_ADMIN_TOKEN"
ACK_TIMEOUT_S = 30.0
OUTCOME_STYLES = {"pass": "green", "fail": "bold red", "inconclusive": "yellow", "no_data": "dim"}
PHASE_STYLES = {
    "succeeded": "bold green",
    "rolled_back": "bold red",
    "rolling_back": "red",
    "paused": "yellow",
    "inconclusive": "yellow",
}


# ---------------------------------------------------------------------------------------
# Arguments


def _duration(text: str) -> float:
    from ops.analysis import parse_duration

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _steps(text: str) -> list[float]:
    try:
        steps = [float(part.strip().removesuffix("%")) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected weights in percent like 1,5,25,50,100, got {text!r}"
        ) from None
    if any(not 0 < step <= 100 for step in steps) or any(
        later <= earlier for earlier, later in zip(steps, steps[1:], strict=False)
    ):
        raise argparse.ArgumentTypeError(f"steps must increase within (0, 100]: {text!r}")
    return steps


def _percent(text: str) -> float:
    try:
        value = float(text.strip().removesuffix("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a percentage like 5%, got {text!r}") from None
    if not 0 < value <= 100:
        raise argparse.ArgumentTypeError(f"a percentage must be in (0, 100], got {text!r}")
    return value


def _state_dir_argument(parser: argparse.ArgumentParser) -> None:
    from_env = os.environ.get("SLIPWAY_ROLLOUT_DIR")
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=Path(from_env) if from_env else Path("~/.slipway/rollouts"),
        help="where rollouts are recorded (default: $SLIPWAY_ROLLOUT_DIR or ~/.slipway/rollouts)",
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    canary = subparsers.add_parser(
        "canary",
        help="roll a model version out progressively, judged on live metrics",
        description="Canary rollouts: shift traffic to a new version step by step, compare it "
        "with stable on error rate, latency, shadow agreement and failovers, and promote it "
        "or roll it back on its own.",
    )
    commands = canary.add_subparsers(dest="canary_command", metavar="COMMAND", required=True)

    start = commands.add_parser(
        "start",
        help="start (or pick up) a rollout and drive it until it finishes",
        description="Start a rollout of MODEL to --version and run the controller in the "
        "foreground until it is promoted or rolled back. An unfinished rollout of the same "
        "version is picked up where it stopped.",
    )
    start.add_argument("model", help="the served model to roll out")
    start.add_argument("--version", type=int, required=True, help="the canary version")
    start.add_argument(
        "--stable", type=int, help="the stable version (default: the model's 'stable' label)"
    )
    start.add_argument(
        "--gateway",
        action="append",
        required=True,
        metavar="URL",
        help="REST URL of a gateway replica (repeat for each replica)",
    )
    start.add_argument("--steps", type=_steps, default=_steps(DEFAULT_STEPS),
                       help=f"canary weights in percent (default {DEFAULT_STEPS})")  # fmt: skip
    start.add_argument("--bake", type=_duration, default=DEFAULT_BAKE_S,
                       help="time each step must pass analysis without a break before the "
                       f"next (default {DEFAULT_BAKE_S:g}s)")  # fmt: skip
    start.add_argument("--interval", type=_duration, default=DEFAULT_INTERVAL_S,
                       help=f"time between two analyses (default {DEFAULT_INTERVAL_S:g}s)")  # fmt: skip
    start.add_argument(
        "--analysis", type=Path, help="analysis file (YAML); default checks if omitted"
    )
    start.add_argument("--shadow", type=_percent, metavar="PERCENT",
                       help="first mirror this share of traffic to the canary for one bake")  # fmt: skip
    metrics = start.add_mutually_exclusive_group()
    metrics.add_argument("--prometheus", metavar="URL", help="query this Prometheus server")
    metrics.add_argument(
        "--metrics-from",
        action="append",
        metavar="URL",
        help="scrape these gateways' /metrics directly (default: the --gateway URLs)",
    )
    start.add_argument("--token-env", default=DEFAULT_TOKEN_ENV, metavar="VAR",
                       help=f"environment variable holding the admin token (default {DEFAULT_TOKEN_ENV})")  # fmt: skip
    start.add_argument("--routing-file", type=Path, help="also write this shared routing file")
    start.add_argument("--pause-after", type=int, metavar="N",
                       help="halt (inconclusive) after N analyses in a row without a verdict")  # fmt: skip
    failover = start.add_mutually_exclusive_group()
    failover.add_argument("--failover", dest="failover", action="store_true", default=None,
                          help="retry failed canary requests on stable")  # fmt: skip
    failover.add_argument("--no-failover", dest="failover", action="store_false",
                          help="do not retry failed canary requests")  # fmt: skip
    start.add_argument("--rollback-window", type=_duration, default=3600.0,
                       help="how long after promotion 'rollback' may restore stable (default 1h)")  # fmt: skip
    start.add_argument("--metrics-port", type=int,
                       help="export the controller's Prometheus metrics on this port")  # fmt: skip
    _state_dir_argument(start)
    start.set_defaults(handler=run_start)

    status = commands.add_parser(
        "status",
        help="where rollouts stand",
        description="Show where each rollout stands: step, canary weight, last verdict.",
    )
    status.add_argument("model", nargs="?", help="one model (default: every model on record)")
    status.add_argument("--watch", action="store_true", help="refresh until interrupted")
    _state_dir_argument(status)
    status.set_defaults(handler=run_status)

    for action, text in (
        ("pause", "stop advancing (the canary keeps its weight and is still analysed)"),
        ("resume", "continue a paused or halted rollout, or pick up a stopped controller"),
        ("promote", "skip the remaining steps and make the canary stable now"),
        ("abort", "stop the rollout: canary weight 0, canary label removed"),
        ("rollback", "abort, or restore the previous stable version after a promotion"),
    ):
        command = commands.add_parser(action, help=text, description=f"{text.capitalize()}.")
        command.add_argument("model", help="the model whose rollout this acts on")
        command.add_argument("--reason", help="recorded with the command")
        _state_dir_argument(command)
        command.set_defaults(handler=run_command, action=action)

    history = commands.add_parser(
        "history",
        help="past rollouts of a model and their events",
        description="List a model's past rollouts, or one rollout's events and timeline.",
    )
    history.add_argument("model", help="the model whose rollouts are listed")
    history.add_argument("--rollout", metavar="ID", help="show this rollout's events")
    history.add_argument("--timeline", type=Path, metavar="PNG",
                         help="draw the rollout's timeline (the latest unless --rollout)")  # fmt: skip
    _state_dir_argument(history)
    history.set_defaults(handler=run_history)


def __getattr__(name: str) -> Any:
    """``USER_ERRORS``, imported only when asked for so ``slipway --help`` stays instant."""
    if name == "USER_ERRORS":
        from contracts.yaml_config import ConfigError
        from ops.gateway_admin import GatewayAdminError, UnknownModelError
        from ops.measurement import MetricsUnavailable
        from ops.state import RolloutLocked, StateError

        return (
            ConfigError,
            GatewayAdminError,
            MetricsUnavailable,
            RolloutLocked,
            StateError,
            UnknownModelError,
        )
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---------------------------------------------------------------------------------------
# start / resume


def run_start(args: argparse.Namespace) -> int:
    """Validate everything (analysis file, targets, the model and versions on the gateways,
    the PromQL) before taking the model's lock, so a mistake leaves nothing behind; the
    lock is released on every path out."""
    from ops.controller import start_rollout
    from ops.state import StateError, StateStore

    store = StateStore(args.state_dir)
    spec, admin = _new_spec(args)
    with store.lock(args.model):
        existing = store.load(args.model)
        if existing is not None and not existing.terminal:
            if existing.spec.canary_version != args.version:
                raise StateError(
                    f"the rollout {existing.id} of {args.model} to version "
                    f"{existing.spec.canary_version} is {existing.phase.value}; abort it first"
                )
            console.print(f"picking up rollout {existing.id} ({existing.phase.value}) from "
                          f"{store.state_path(args.model)}")  # fmt: skip
            return _drive(store, existing)
        state = start_rollout(store, spec, admin)
        console.print(
            f"rollout {state.id}: {args.model} version {spec.stable_version} -> {args.version}"
        )
        return _drive(store, state)


def _new_spec(args: argparse.Namespace) -> tuple[Any, Any]:
    """The rollout the arguments ask for and the admin client of its gateways; a model the
    gateways do not serve, or a canary version they have not loaded, is an error here."""
    import pydantic

    from ops.analysis import load_analysis
    from ops.gateway_admin import UnknownModelError
    from ops.state import RolloutSpec, StateError, Targets, validate_model_name

    validate_model_name(args.model)
    analysis = load_analysis(args.analysis)
    try:
        targets = Targets(
            gateways=args.gateway,
            token_env=args.token_env,
            routing_file=str(args.routing_file) if args.routing_file else None,
            prometheus=args.prometheus,
            metrics_from=args.metrics_from or [],
            metrics_port=args.metrics_port,
        )
        admin = _admin(targets)
        routing = admin.checked(args.model, [args.version])
        stable = args.stable if args.stable is not None else routing.labels.get("stable")
        if stable is None:
            raise StateError(
                f"model {args.model} has no 'stable' label: pass --stable with the "
                "version serving now"
            )
        spec = RolloutSpec(
            model=args.model,
            stable_version=stable,
            canary_version=args.version,
            steps=args.steps,
            bake_seconds=args.bake,
            interval_seconds=args.interval,
            shadow_percent=args.shadow,
            max_held=args.pause_after,
            failover=args.failover,
            rollback_window_seconds=args.rollback_window,
            analysis=analysis.model_dump(mode="json"),
            targets=targets,
        )
    except (pydantic.ValidationError, ValueError) as exc:
        if isinstance(exc, StateError | UnknownModelError):
            raise
        raise StateError(f"cannot start the rollout of {args.model}: {_problems(exc)}") from None
    if args.prometheus:
        from ops.prometheus import PrometheusClient, validate_queries

        validate_queries(PrometheusClient(args.prometheus), analysis)
    return spec, admin


def _problems(exc: Exception) -> str:
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return str(exc)
    return "; ".join(
        f"{'.'.join(map(str, error['loc'])) or 'spec'}: {error['msg'].removeprefix('Value error, ')}"
        for error in errors()
    )


def _drive(store: Any, state: Any) -> int:
    """Run the controller in the foreground (lock held) until the rollout finishes or a
    signal stops it; then draw its timeline."""
    from ops.controller import Controller, ControllerMetrics
    from ops.events import EventLog
    from ops.timeline import render_timeline

    targets = state.spec.targets
    metrics = ControllerMetrics()
    if targets.metrics_port is not None:
        from prometheus_client import start_http_server

        start_http_server(targets.metrics_port, registry=metrics.registry)
    controller = Controller(state, store, _admin(targets), metrics=metrics, on_event=_print_event)
    provider = _provider(state.spec, controller.analysis)
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        final = controller.run(provider, stop=stop)
    except KeyboardInterrupt:
        final = controller.state
    finally:
        signal.signal(signal.SIGTERM, previous)
        provider.close()
    events = EventLog(store.events_path(final.model)).read()
    picture = render_timeline(events, store.model_dir(final.model) / "timeline.png",
                              title=_title(final))  # fmt: skip
    style = PHASE_STYLES.get(final.phase.value, "bold")
    console.print(f"[{style}]{final.phase.value}[/]: {escape(final.reason or '')}")
    console.print(f"timeline: {picture}")
    if not final.terminal:
        console.print(f"resume with: slipway canary resume {final.model}")
        return 1
    return 0 if final.phase.value == "succeeded" else 1


def _admin(targets: Any) -> Any:
    from ops.gateway_admin import GatewayAdmin
    from ops.state import StateError

    token = None
    if targets.token_env:
        token = os.environ.get(targets.token_env, "").strip() or None
        if token is None:
            raise StateError(f"the admin token variable {targets.token_env} is not set")
    routing_file = Path(targets.routing_file) if targets.routing_file else None
    return GatewayAdmin(targets.gateways, token, routing_file=routing_file)


def _provider(spec: Any, analysis: Any) -> Any:
    if spec.targets.prometheus:
        from ops.prometheus import PrometheusClient, PrometheusProvider

        return PrometheusProvider(PrometheusClient(spec.targets.prometheus), analysis)
    from ops.scrape import ScrapeProvider

    return ScrapeProvider(spec.targets.metrics_from or spec.targets.gateways)


def _title(state: Any) -> str:
    spec = state.spec
    return (
        f"{spec.model}: version {spec.stable_version} -> {spec.canary_version} "
        f"({state.phase.value})"
    )


def _print_event(event: Any) -> None:
    clock = time.strftime("%H:%M:%S", time.localtime(event.at))
    detail = escape(event.message)
    if event.kind == "analysis":
        style = OUTCOME_STYLES.get(event.outcome or "", "")
        verdict = f"[{style}]{event.outcome}[/]" if style else str(event.outcome)
        line = f"{event.weight:>5.0%}  {verdict:<12} {event.decision}: {detail}"
    elif event.kind == "transition":
        style = PHASE_STYLES.get(event.phase, "bold cyan")
        line = f"[{style}]{detail}[/]"
    elif event.kind == "routing_error":
        line = f"[red]{detail}[/]"
    else:
        line = detail
    console.print(f"[dim]{clock}[/] {line}", highlight=False)


# ---------------------------------------------------------------------------------------
# steering


def run_command(args: argparse.Namespace) -> int:
    from ops.controller import Controller, ControllerMetrics
    from ops.state import HALTED, RolloutLocked, StateError, StateStore

    store = StateStore(args.state_dir)
    state = store.load(args.model)
    if state is None:
        raise StateError(f"no rollout of {args.model} on record in {store.root}")
    lock = store.lock(args.model)
    try:
        lock.acquire()
    except RolloutLocked:
        return _ask_controller(store, args)
    try:
        state = store.load(args.model)  # the controller may have moved it before it let go
        controller = Controller(state, store, _admin(state.spec.targets),
                                metrics=ControllerMetrics(), on_event=_print_event)  # fmt: skip
        if args.action == "resume" and state.phase not in HALTED:
            if state.terminal:
                raise StateError(
                    f"cannot resume: the rollout of {args.model} is {state.phase.value}"
                )
            console.print(f"picking up rollout {state.id} ({state.phase.value})")
            return _drive(store, state)
        if not controller.command(args.action, reason=args.reason).accepted:
            return 1
        if args.action == "resume":
            return _drive(store, controller.state)
        return 0
    finally:
        lock.release()


def _ask_controller(store: Any, args: argparse.Namespace) -> int:
    """Hand the command to the running controller and wait for its answer."""
    from ops.events import EventLog

    request = store.post(args.model, args.action, args.reason)
    log = EventLog(store.events_path(args.model))
    deadline = time.monotonic() + ACK_TIMEOUT_S
    with console.status(f"waiting for the controller to {args.action} {args.model}…"):
        while time.monotonic() < deadline:
            answer = next((e for e in log.read() if e.request == request.id), None)
            if answer is not None:
                style = "green" if answer.accepted else "red"
                console.print(f"[{style}]{escape(answer.message)}[/]")
                return 0 if answer.accepted else 1
            time.sleep(0.2)  # the controller answers through its event log; poll it
    console.print(f"the controller has not answered within {ACK_TIMEOUT_S:g}s; the request "
                  "stays queued and is applied when it next looks")  # fmt: skip
    return 1


# ---------------------------------------------------------------------------------------
# status / history


def run_status(args: argparse.Namespace) -> int:
    from rich.live import Live

    from ops.state import StateError, StateStore

    store = StateStore(args.state_dir)
    models = [args.model] if args.model else store.models()
    if not models or (args.model and store.load(args.model) is None):
        raise StateError(f"no rollout {'of ' + args.model + ' ' if args.model else ''}on record "
                         f"in {store.root}")  # fmt: skip
    if not args.watch:
        console.print(_status_table(store, models))
        return 0
    try:
        with Live(_status_table(store, models), console=console, auto_refresh=False) as live:
            while True:
                time.sleep(1.0)  # refresh period of the live view
                live.update(_status_table(store, models), refresh=True)
    except KeyboardInterrupt:
        return 0


def _status_table(store: Any, models: list[str]) -> Table:

    table = Table(title="canary rollouts")
    for column in ("model", "versions", "phase", "step", "weight", "controller", "why"):
        table.add_column(column)
    for model in models:
        state = store.load(model)
        if state is None:
            continue
        spec = state.spec
        step = f"{state.step + 1}/{len(spec.steps)}" if state.step >= 0 else "-"
        style = PHASE_STYLES.get(state.phase.value, "cyan")
        table.add_row(
            model,
            f"{spec.stable_version} -> {spec.canary_version}",
            f"[{style}]{state.phase.value}[/]",
            step,
            f"{state.weight:.0%}",
            "running" if store.is_locked(model) else "-",
            escape(_why(store, state)),
        )
    return table


def _why(store: Any, state: Any) -> str:
    """Why a finished or halted rollout is where it is; else what the last analysis said."""
    if state.terminal or state.resume_to is not None:
        return state.reason or ""
    from ops.events import EventLog

    events = EventLog(store.events_path(state.model)).read()
    last = next((e for e in reversed(events) if e.kind == "analysis"), None)
    return (state.reason or "") if last is None else f"{last.outcome}: {last.message}"


def run_history(args: argparse.Namespace) -> int:
    from ops.events import EventLog
    from ops.state import StateError, StateStore
    from ops.timeline import render_timeline

    store = StateStore(args.state_dir)
    rollouts = store.history(args.model)
    if not rollouts:
        raise StateError(f"no rollout of {args.model} on record in {store.root}")
    if args.rollout is None and args.timeline is None:
        table = Table(title=f"rollouts of {args.model}")
        for column in ("rollout", "versions", "started", "finished", "outcome"):
            table.add_column(column)
        for state in rollouts:
            table.add_row(
                state.id,
                f"{state.spec.stable_version} -> {state.spec.canary_version}",
                _when(state.created_at),
                _when(state.finished_at),
                escape(f"{state.phase.value}: {state.reason or ''}"),
            )
        console.print(table)
        return 0
    chosen = args.rollout or rollouts[-1].id
    state = next((s for s in rollouts if s.id == chosen), None)
    if state is None:
        raise StateError(f"no rollout {chosen!r} of {args.model} on record")
    events = EventLog(store.history_events_path(args.model, chosen)).read()
    if args.timeline is not None:
        console.print(f"timeline: {render_timeline(events, args.timeline, title=_title(state))}")
        return 0
    for event in events:
        _print_event(event)
    return 0


def _when(timestamp: float | None) -> str:
    return (
        "-" if timestamp is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp))
    )
