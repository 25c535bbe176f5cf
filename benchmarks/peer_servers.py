"""Start and stop the servers ``benchmarks.serving_peers`` compares, as child processes on
free loopback ports: Slipway's gateway from this venv, MLServer and Ray Serve from
``.venv-peers`` (``make peers``), whose pins clash with the project's.

Every server is started first and waited for after (``Server.wait_ready``), so their
start-ups overlap; each wait polls a readiness endpoint against a deadline. Stopping is
SIGTERM, then a kill after a grace period; for Ray, also every process left in its
session (found by its own process group and session directory, never by name).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.serving import MODEL, free_port, serve_command, stop_process, wait_http_ready

REPO_ROOT = Path(__file__).resolve().parent.parent
PEERS_VENV = REPO_ROOT / ".venv-peers"
PEERS_PYTHON = PEERS_VENV / "bin" / "python"
PEER_PACKAGES = ("mlserver", "ray", "tensorflow")
SLIPWAY_START_TIMEOUT_S = 120.0
MLSERVER_START_TIMEOUT_S = 180.0
RAY_START_TIMEOUT_S = 300.0  # a cluster, a controller, a proxy and a replica, on 2 cores
POLL_INTERVAL_S = 0.25
RAY_ROUTE = f"/{MODEL}"


class PeersVenvMissing(RuntimeError):
    """``.venv-peers`` is not there: MLServer and Ray Serve cannot be started."""


def require_peers_venv() -> dict[str, str]:
    """The peers' installed versions; raises ``PeersVenvMissing`` (saying how to create
    the venv) when it is missing or broken."""
    if not PEERS_PYTHON.exists():
        raise PeersVenvMissing(
            f"{PEERS_VENV.relative_to(REPO_ROOT)} is missing: run 'make peers' to create it "
            "(MLServer and Ray Serve in a venv of their own)"
        )
    script = (
        "import importlib.metadata as m, json; "
        f"print(json.dumps({{p: m.version(p) for p in {PEER_PACKAGES!r}}}))"
    )
    result = subprocess.run(
        [str(PEERS_PYTHON), "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    if result.returncode != 0:
        raise PeersVenvMissing(
            f"{PEERS_VENV.relative_to(REPO_ROOT)} lacks a peer ({result.stderr.strip()[-500:]}): "
            "run 'rm -rf .venv-peers && make peers' to recreate it"
        )
    return json.loads(result.stdout)


@dataclass
class Server:
    """A server process being started: ``endpoints`` maps a protocol to where it is
    served. It is ready once a GET of ``ready_url`` answers 200 with a body that
    ``ready_when`` accepts (any body by default)."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path
    ready_url: str
    start_timeout_s: float
    endpoints: dict[str, str]
    ready_when: Callable[[bytes], bool] = lambda body: True
    started_at: float = field(default_factory=time.monotonic)

    def wait_ready(self) -> None:
        wait_http_ready(
            self.ready_url,
            self.process,
            self.log,
            name=self.name,
            timeout_s=self.start_timeout_s,
            since=self.started_at,
            ready_when=self.ready_when,
        )


@contextlib.contextmanager
def _child(
    name: str,
    command: list[str],
    log: Path,
    env: Mapping[str, str] | None = None,
    new_session: bool = False,
) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as output:
        process = subprocess.Popen(
            command,
            cwd=REPO_ROOT,
            env={**os.environ, **(env or {})},
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=new_session,
        )
        try:
            yield process
        finally:
            stop_process(process)


@contextlib.contextmanager
def slipway_gateway(
    workdir: Path, model_root: Path, batching: Mapping[str, Any], processes: int = 1
) -> Iterator[Server]:
    """``slipway serve`` with ``batching`` (``processes`` of them on the same ports): TF
    Serving's REST predict URL and gRPC target."""
    name = "Slipway" if processes == 1 else f"Slipway, {processes} processes"
    config = workdir / f"slipway-{processes}.yaml"
    config.write_text(json.dumps({"batching": dict(batching)}))
    grpc_port, rest_port = free_port(), free_port()
    command = serve_command(model_root, config, grpc_port, rest_port, processes)
    log = workdir / f"slipway-{processes}.log"
    with _child(name, command, log) as process:
        yield Server(
            name=name,
            process=process,
            log=log,
            ready_url=f"http://127.0.0.1:{rest_port}/readyz",
            start_timeout_s=SLIPWAY_START_TIMEOUT_S,
            endpoints={
                "tfserving": f"http://127.0.0.1:{rest_port}/v1/models/{MODEL}:predict",
                "grpc": f"127.0.0.1:{grpc_port}",
            },
        )


@contextlib.contextmanager
def mlserver(
    workdir: Path, version_dir: Path, max_batch_size: int, max_batch_time_s: float
) -> Iterator[Server]:
    """MLServer serving ``version_dir`` with ``benchmarks.peer_mlserver``'s runtime and
    adaptive batching; its V2 REST infer URL. Settings are MLServer's defaults but for
    ports, debug, metrics and ``parallel_workers``: 0 runs the model in the server process,
    which on two cores answers 15-20 % more requests than the default separate inference
    worker, so MLServer is measured at its best here."""
    repository = workdir / "mlserver"
    (repository / MODEL).mkdir(parents=True)
    http_port = free_port()
    settings = {
        "debug": False,
        "host": "127.0.0.1",
        "http_port": http_port,
        "grpc_port": free_port(),
        "metrics_endpoint": None,  # no third port; the gateway's /metrics is off the path too
        "parallel_workers": 0,
        "model_repository_root": str(repository),
        "load_models_at_startup": True,
    }
    model_settings = {
        "name": MODEL,
        "implementation": "benchmarks.peer_mlserver.SavedModelRuntime",
        "parameters": {"uri": str(version_dir)},
        "max_batch_size": max_batch_size,
        "max_batch_time": max_batch_time_s,
    }
    (repository / "settings.json").write_text(json.dumps(settings, indent=2))
    (repository / MODEL / "model-settings.json").write_text(json.dumps(model_settings, indent=2))
    command = [str(PEERS_VENV / "bin" / "mlserver"), "start", str(repository)]
    log = workdir / "mlserver.log"
    with _child("mlserver", command, log, env={"PYTHONPATH": str(REPO_ROOT)}) as process:
        yield Server(
            name="MLServer",
            process=process,
            log=log,
            ready_url=f"http://127.0.0.1:{http_port}/v2/models/{MODEL}/ready",
            start_timeout_s=MLSERVER_START_TIMEOUT_S,
            endpoints={"v2": f"http://127.0.0.1:{http_port}/v2/models/{MODEL}/infer"},
        )


@contextlib.contextmanager
def ray_serve(
    workdir: Path, version_dir: Path, max_batch_size: int, batch_wait_timeout_s: float
) -> Iterator[Server]:
    """Ray Serve (``benchmarks.peer_ray``) serving ``version_dir``; its HTTP route. The
    driver runs in a session of its own and keeps Ray's files in a directory of its own
    (short, under /tmp: Ray's socket paths must fit 107 bytes); once it has stopped, any
    process still in that session or naming that directory is killed."""
    ray_dir = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    port = free_port()
    command = [
        str(PEERS_PYTHON), "-m", "benchmarks.peer_ray", "--model-dir", str(version_dir),
        "--port", str(port), "--temp-dir", str(ray_dir), "--max-batch-size", str(max_batch_size),
        "--batch-wait-timeout-s", str(batch_wait_timeout_s), "--route", RAY_ROUTE,
    ]  # fmt: skip
    env = {"PYTHONPATH": str(REPO_ROOT), "RAY_USAGE_STATS_ENABLED": "0"}
    log = workdir / "ray.log"
    session: int | None = None
    try:
        with _child("ray", command, log, env=env, new_session=True) as process:
            session = process.pid
            yield Server(
                name="Ray Serve",
                process=process,
                log=log,
                ready_url=f"http://127.0.0.1:{port}/-/routes",
                start_timeout_s=RAY_START_TIMEOUT_S,
                endpoints={"ray": f"http://127.0.0.1:{port}{RAY_ROUTE}"},
                ready_when=lambda body: RAY_ROUTE.encode() in body,
            )
    finally:
        if session is not None:
            _kill_leftovers(session, ray_dir)
        shutil.rmtree(ray_dir, ignore_errors=True)


def _kill_leftovers(session: int, ray_dir: Path, grace_s: float = 10.0) -> None:
    """Processes of the Ray driver's session, or naming its directory, that are still
    there after it exited: given ``grace_s`` to finish their own shutdown, then killed."""
    deadline = time.monotonic() + grace_s
    while (left := _ray_processes(session, ray_dir)) and time.monotonic() < deadline:
        time.sleep(POLL_INTERVAL_S)  # Ray's processes exit after their driver: wait for them
    names = []
    for pid in left:
        with contextlib.suppress(OSError):
            names.append(Path(f"/proc/{pid}/comm").read_text().strip())
            os.kill(pid, signal.SIGKILL)
    if names:
        print(
            f"note: killed Ray processes still running {grace_s:g} s after its shutdown: {', '.join(names)}",
            file=sys.stderr,
        )


def _ray_processes(session: int, ray_dir: Path) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            in_session = os.getsid(int(entry.name)) == session
            command = (entry / "cmdline").read_bytes()
        except (OSError, ProcessLookupError):
            continue  # gone meanwhile
        if in_session or str(ray_dir).encode() in command:
            found.append(int(entry.name))
    return found
