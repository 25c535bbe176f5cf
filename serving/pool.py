"""A pool of gateway processes on the same ports: ``slipway serve --processes N``.

One Python process holds the GIL for most of a request's work, so one gateway uses about
one core whatever the machine has. A pool runs N whole gateways (workers) that listen on
the same ports with ``SO_REUSEPORT``; the kernel spreads new connections over them. This
module is the supervisor; it imports no TensorFlow and loads no model. What keeps N
processes one gateway:

- **Ports.** The supervisor binds both ports (``SO_REUSEPORT``, without listening) before
  any worker starts and holds them: port 0 becomes one real port for every worker, a
  port in use is refused at once, and no other program can take the ports meanwhile.
- **Models: one watcher.** Workers never poll the model root. The supervisor compares a
  cheap fingerprint of it (and of the routing file) every ``poll_interval_s`` and, on a
  change, sends every worker SIGHUP: all rescan and load the same versions.
- **Routing.** Workers share one routing file (gateway.yaml's, or one in the pool's
  directory) or one routing source. An admin change made through a worker is written
  there; the worker tells the supervisor, which has every worker re-read it at once.
- **Metrics.** prometheus_client's multiprocess mode: ``/metrics`` on any worker adds up
  every worker's series (``serving.metrics``).
- **Labels.** A label for an answer another worker gave is relayed to it
  (``serving.feedback_relay``).
- **Cores.** Each worker's TensorFlow gets its share of the cores for its thread pools
  (``TF_NUM_INTRAOP_THREADS`` / ``TF_NUM_INTEROP_THREADS``, unless the operator set them):
  N workers each sized for the whole machine oversubscribe it, and the tail shows it.
- **Lifecycle.** A worker loads its models before it listens. SIGTERM reaches every
  worker, and each drains as a gateway alone does; a worker that dies is replaced; one
  that cannot start stops the pool with its exit code. Workers die with the supervisor.
- **Liveness.** A worker whose event loop stops turning (stuck, or the process stopped)
  keeps its listening sockets, and the kernel keeps handing it connections it will never
  answer. The supervisor asks each worker on its private socket every
  ``pool.probe_interval_s`` and kills one silent for ``pool.unresponsive_after_s``; it is
  then replaced like any worker that died.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import logging
import os
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import multiprocess

from serving.config import GatewayConfig
from serving.errors import StartupError
from serving.metrics import MULTIPROCESS_DIR_ENV
from serving.pool_worker import (
    ALIVE_PATH,
    CHANGED,
    METRICS_DIR,
    READY,
    pool_routing_file,
    private_socket,
)
from serving.repository import disk_fingerprint, path_identity

logger = logging.getLogger(__name__)

# A replaced worker is started this long after its predecessor died, so a worker that
# dies at once cannot spin the machine.
RESTART_DELAY_S = 1.0
# Beyond the grace period: time for listeners to close and models to unload.
STOP_MARGIN_S = 15.0
_PR_SET_PDEATHSIG = 1
# TensorFlow reads its thread pools' sizes from these when its runtime starts.
TENSORFLOW_THREAD_VARIABLES = ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")


@dataclass(frozen=True)
class PoolSettings:
    """How to start the workers: ``slipway serve``'s own arguments, shared by all."""

    processes: int
    model_root: Path
    config: GatewayConfig
    host: str
    grpc_port: int
    rest_port: int
    # Passed through to every worker (--config, --log-level, prediction log options...).
    worker_args: list[str] = field(default_factory=list)


@dataclass(eq=False)
class _Worker:
    index: int
    process: asyncio.subprocess.Process
    ready: bool = False
    monitor: asyncio.Task[None] | None = None
    answered_at: float = 0.0  # the last liveness answer (time.monotonic)


class WorkerPool:
    """Starts, watches, replaces and stops the workers; ``run`` until SIGTERM."""

    def __init__(self, settings: PoolSettings) -> None:
        self.settings = settings
        self.grpc_port = settings.grpc_port
        self.rest_port = settings.rest_port
        self._workers: dict[int, _Worker] = {}
        self._stop = asyncio.Event()
        self._stopping = False
        self._all_ready = asyncio.Event()
        self._failure: int | None = None  # a worker's exit code when it could not start
        self._directory: Path | None = None

    async def run(self) -> int:
        """Serve until SIGTERM or SIGINT; the exit code (a worker's, if one could not start)."""
        settings = self.settings
        if not settings.model_root.is_dir():
            raise StartupError(f"--model-root {settings.model_root}: not a directory")
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._stop.set)
        loop.add_signal_handler(signal.SIGHUP, self._tell_workers_to_sync)
        with self._ports_held(), tempfile.TemporaryDirectory(prefix="slipway-pool-") as tmp:
            self._directory = Path(tmp)
            (self._directory / METRICS_DIR).mkdir()
            watch = loop.create_task(self._watch_disk())
            probe = loop.create_task(self._probe_workers())
            try:
                for index in range(settings.processes):
                    await self._start_worker(index)
                await self._until_ready_or_stopped()
                await self._stop.wait()
            finally:
                watch.cancel()
                probe.cancel()
                await self._stop_workers()
        if self._failure is not None:
            return self._failure
        logger.info("stopped")
        return 0

    # -- ports ------------------------------------------------------------------------

    @contextlib.contextmanager
    def _ports_held(self) -> Iterator[None]:
        with (
            hold_port(self.settings.host, self.grpc_port, "gRPC") as grpc_socket,
            hold_port(self.settings.host, self.rest_port, "REST") as rest_socket,
        ):
            self.grpc_port = grpc_socket.getsockname()[1]
            self.rest_port = rest_socket.getsockname()[1]
            yield

    # -- workers ----------------------------------------------------------------------

    def _command(self, index: int, status_fd: int) -> list[str]:
        settings = self.settings
        assert self._directory is not None
        return [
            sys.executable, "-m", "slipway", "serve",
            "--model-root", str(settings.model_root),
            "--host", settings.host,
            "--grpc-port", str(self.grpc_port),
            "--rest-port", str(self.rest_port),
            *settings.worker_args,
            "--pool-dir", str(self._directory),
            "--pool-index", str(index),
            "--pool-status-fd", str(status_fd),
        ]  # fmt: skip

    async def _start_worker(self, index: int) -> None:
        assert self._directory is not None
        read_fd, write_fd = os.pipe()
        env = {
            **os.environ,
            **tensorflow_threads(self.settings.processes),
            MULTIPROCESS_DIR_ENV: str(self._directory / METRICS_DIR),
        }
        try:
            process = await asyncio.create_subprocess_exec(
                *self._command(index, write_fd),
                env=env,
                pass_fds=(write_fd,),
                stderr=_own_stderr(),
                preexec_fn=functools.partial(_die_with, os.getpid()),
                start_new_session=True,  # a terminal's Ctrl-C reaches the supervisor only
            )
        finally:
            os.close(write_fd)
        worker = _Worker(index, process)
        worker.monitor = asyncio.get_running_loop().create_task(self._monitor(worker, read_fd))
        self._workers[index] = worker
        logger.info("worker %d started (pid %d)", index, process.pid)

    async def _monitor(self, worker: _Worker, read_fd: int) -> None:
        """Follow a worker's status lines until it exits, then replace it (or stop)."""
        reading = asyncio.get_running_loop().create_task(self._follow(worker, read_fd))
        code = await worker.process.wait()
        reading.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reading
        if self._stopping:
            return
        self._forget(worker)
        if not worker.ready:
            logger.error(
                "worker %d exited with %d before it was ready: stopping", worker.index, code
            )
            self._failure = code if code > 0 else 1  # a signal is no exit code
            self._stop.set()
            return
        logger.error("worker %d (pid %d) exited with %d: replacing it", worker.index,
                     worker.process.pid, code)  # fmt: skip
        await asyncio.sleep(RESTART_DELAY_S)
        if not self._stopping:
            await self._start_worker(worker.index)

    async def _follow(self, worker: _Worker, read_fd: int) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_fd, "rb")
        )
        try:
            while line := await reader.readline():
                if line == READY:
                    worker.ready = True
                    worker.answered_at = time.monotonic()
                    logger.info("worker %d ready (pid %d)", worker.index, worker.process.pid)
                    _signal(worker, signal.SIGHUP)  # what changed while it loaded, it reads
                    if all(w.ready for w in self._workers.values()):
                        self._all_ready.set()
                elif line == CHANGED:
                    self._tell_workers_to_sync()
        finally:
            transport.close()

    def _forget(self, worker: _Worker) -> None:
        """Its live gauges (queue depth, requests in flight) stop counting."""
        assert self._directory is not None
        multiprocess.mark_process_dead(worker.process.pid, str(self._directory / METRICS_DIR))

    async def _until_ready_or_stopped(self) -> None:
        ready = asyncio.create_task(self._all_ready.wait())
        stopped = asyncio.create_task(self._stop.wait())
        await asyncio.wait({ready, stopped}, return_when=asyncio.FIRST_COMPLETED)
        ready.cancel()
        stopped.cancel()
        if self._all_ready.is_set() and not self._stop.is_set():
            logger.info(
                "pool of %d workers serving %s: gRPC on %s:%d, REST on %s:%d",
                self.settings.processes, self.settings.model_root, self.settings.host,
                self.grpc_port, self.settings.host, self.rest_port,
            )  # fmt: skip

    def _tell_workers_to_sync(self) -> None:
        for worker in self._workers.values():
            if worker.ready:
                _signal(worker, signal.SIGHUP)

    async def _watch_disk(self) -> None:
        """The pool's one repository watcher: workers rescan when the disk changed."""
        settings = self.settings
        assert self._directory is not None
        routing_file = pool_routing_file(settings.config, self._directory)

        def fingerprint() -> tuple[object, ...]:
            routing = None if routing_file is None else path_identity(routing_file)
            return (routing, disk_fingerprint(settings.model_root))

        seen = await asyncio.to_thread(fingerprint)
        while True:
            await asyncio.sleep(settings.config.poll_interval_s)
            now = await asyncio.to_thread(fingerprint)
            if now != seen:
                seen = now
                self._tell_workers_to_sync()

    async def _probe_workers(self) -> None:
        """Kill the workers whose event loop has not answered for a while (see Liveness)."""
        settings = self.settings.config.pool
        while True:
            await asyncio.sleep(settings.probe_interval_s)
            workers = [worker for worker in self._workers.values() if worker.ready]
            answers = await asyncio.gather(
                *(self._alive(worker, settings.probe_interval_s) for worker in workers)
            )
            now = time.monotonic()
            for worker, answered in zip(workers, answers, strict=True):
                if answered:
                    worker.answered_at = now
                elif (
                    now - worker.answered_at > settings.unresponsive_after_s and not self._stopping
                ):
                    logger.error(
                        "worker %d (pid %d) has not answered for %.0f s: killing it",
                        worker.index, worker.process.pid, now - worker.answered_at,
                    )  # fmt: skip
                    _signal(worker, signal.SIGKILL)

    async def _alive(self, worker: _Worker, timeout: float) -> bool:
        """Whether the worker's event loop answers its liveness probe within ``timeout``."""
        assert self._directory is not None
        path = private_socket(self._directory, worker.index)
        writer = None
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_unix_connection(str(path))
                writer.write(f"GET {ALIVE_PATH} HTTP/1.0\r\nHost: worker\r\n\r\n".encode())
                status_line = await reader.readline()
        except (OSError, TimeoutError):
            return False
        finally:
            if writer is not None:
                writer.close()
        return status_line.split()[1:2] == [b"200"]

    async def _stop_workers(self) -> None:
        """SIGTERM to every worker; each drains within the grace period, or is killed."""
        self._stopping = True
        workers = list(self._workers.values())
        for worker in workers:
            _signal(worker, signal.SIGTERM)
        timeout = self.settings.config.grace_period_s + STOP_MARGIN_S
        for worker in workers:
            try:
                async with asyncio.timeout(timeout):
                    await worker.process.wait()
            except TimeoutError:
                logger.error("worker %d did not stop within %.0f s: killing it",
                             worker.index, timeout)  # fmt: skip
                _signal(worker, signal.SIGKILL)
                await worker.process.wait()
            if worker.monitor is not None:
                await worker.monitor


def tensorflow_threads(processes: int) -> dict[str, str]:
    """Each worker's TensorFlow thread pools: its share of the cores this process may use,
    or what the operator's environment already says."""
    share = str(max(1, len(os.sched_getaffinity(0)) // processes))
    return {name: os.environ.get(name, share) for name in TENSORFLOW_THREAD_VARIABLES}


def hold_port(host: str, port: int, name: str) -> socket.socket:
    """A socket bound to ``host:port`` with ``SO_REUSEPORT`` and not listening: workers that
    set the option too can listen there, nothing else can bind it."""
    try:
        family, kind, _, _, address = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        raise StartupError(f"{name}: cannot resolve --host {host}: {exc}") from None
    held = socket.socket(family, kind)
    held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        held.bind(address)
    except OSError as exc:
        held.close()
        raise StartupError(f"{name}: cannot listen on {host}:{port}: {exc.strerror}") from None
    return held


def _own_stderr() -> int | None:
    """Where Python's standard error goes, for the workers' own. The command line routes
    descriptor 2 through a filter thread of this process (``slipway.start_up_noise``):
    inherited, it would die with the supervisor and take the workers' drain logs with it.
    Each worker filters its own start-up noise."""
    with contextlib.suppress(AttributeError, OSError, ValueError):
        return sys.stderr.fileno()
    return None


def _signal(worker: _Worker, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        worker.process.send_signal(signum)


def _die_with(supervisor: int) -> None:
    """In the worker, before exec: SIGTERM (a drain) when the supervisor dies, even by
    SIGKILL, so that no worker outlives it holding the ports; and an exit now if it died
    before this could be asked."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != supervisor:
        os._exit(1)
