"""Running N local workers as one training job that survives losing a worker.

Synchronous multi-worker training is all-or-nothing: when one worker dies, the others
block in their next collective waiting for it, so the only repair is to stop the whole
group and start it again, after which every worker resumes from the latest checkpoint by
itself. The supervisor does exactly that, a bounded number of times with exponential
back-off, and tells a hung group from a slow step by the heartbeat file each worker
rewrites after every step it completes.

Exit codes of :meth:`Supervisor.run`:

- ``0``: every worker finished.
- ``1``: a worker kept failing; the supervisor gave up after ``max_restarts`` restarts.
- ``143``: preempted. SIGTERM/SIGINT reached the supervisor, or a worker exited 143 on
  its own; the workers saved a checkpoint, and the same command resumes. The scheduler
  above decides whether to retry, so the supervisor does not.
- a worker's own exit code, when it is one of ``permanent_exit_codes``: a failure that a
  restart would only repeat (an invalid experiment, a diverging loss).

Workers run in their own sessions, so a Ctrl-C in the terminal reaches the supervisor
alone, which forwards it as SIGTERM to every process of every worker.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import IO

from rich.console import Console

from training.errors import EXIT_OK
from training.launcher import Heartbeat, free_ports, read_heartbeat, worker_env
from training.preemption import EXIT_PREEMPTED

EXIT_GAVE_UP = 1

# A worker that exits 143 saved a checkpoint after SIGTERM; one killed by an unhandled
# SIGTERM was stopped from outside just the same. Either way the group was preempted.
_PREEMPTION_CODES = frozenset({EXIT_PREEMPTED, -signal.SIGTERM})
# After SIGKILL only an uninterruptible kernel wait can delay an exit; never wait forever.
_KILL_WAIT_SECONDS = 10.0
_TAIL_LINES = 20
_TAIL_BYTES = 64 * 1024
_HEADER_PREFIX = "===== attempt "
_STYLES = {logging.WARNING: "yellow", logging.ERROR: "bold red"}

logger = logging.getLogger(__name__)
# Records reach whoever configures logging; without that, the console output is enough
# and logging's last-resort handler must not print every warning a second time.
logger.addHandler(logging.NullHandler())


def describe_exit(code: int) -> str:
    """``died (SIGKILL)`` or ``exited with code 1``, from a ``Popen.returncode``."""
    if code >= 0:
        return f"exited with code {code}"
    try:
        return f"died ({signal.Signals(-code).name})"
    except ValueError:
        return f"died (signal {-code})"


@dataclass(frozen=True)
class RestartPolicy:
    """How often and how patiently a failed group is restarted.

    The delay doubles with each restart up to ``backoff_max``. There is no jitter: jitter
    spreads many independent clients retrying one server, whereas here one supervisor
    restarts its own group and a predictable schedule is easier to reason about.
    """

    max_restarts: int = 3
    backoff_initial: float = 1.0
    backoff_max: float = 30.0

    def __post_init__(self) -> None:
        if self.max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {self.max_restarts}")
        if not 0 <= self.backoff_initial <= self.backoff_max:
            raise ValueError(
                f"need 0 <= backoff_initial <= backoff_max, got {self.backoff_initial} "
                f"and {self.backoff_max}"
            )

    def allows(self, restart: int) -> bool:
        """Whether restart number ``restart`` (1-based) may happen."""
        return restart <= self.max_restarts

    def delay(self, restart: int) -> float:
        """Seconds to wait before restart number ``restart`` (1-based)."""
        if restart < 1:
            raise ValueError(f"restarts are numbered from 1, got {restart}")
        return min(self.backoff_max, self.backoff_initial * 2 ** (restart - 1))


@dataclass
class RestartEvent:
    """One restart of the group, timed so a benchmark can report what losing a worker costs.

    Times are wall-clock seconds (``time.time()``), comparable with heartbeat times and
    with the clock of whoever killed the worker.
    """

    restart: int
    worker: int
    reason: str
    detected_at: float
    relaunched_at: float | None = None
    first_step_at: float | None = None

    @property
    def seconds_to_relaunch(self) -> float | None:
        """From noticing the failure to every worker running again."""
        return None if self.relaunched_at is None else self.relaunched_at - self.detected_at

    @property
    def seconds_to_first_step(self) -> float | None:
        """From noticing the failure to the restarted group completing a step."""
        return None if self.first_step_at is None else self.first_step_at - self.detected_at


@dataclass(frozen=True)
class _Failure:
    worker: int
    reason: str
    code: int | None  # None for a stall
    detected_at: float


class _Worker:
    """One worker process, in its own process group, and the thread copying its output."""

    def __init__(
        self,
        index: int,
        command: Sequence[str],
        env: dict[str, str],
        log_path: Path,
        header: str,
        *,
        echo: bool,
    ) -> None:
        self.index = index
        log = open(log_path, "ab")  # noqa: SIM115 - the copying thread closes it
        try:
            log.write(header.encode())
            log.flush()
            self.process = subprocess.Popen(
                list(command),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except BaseException:
            log.close()
            raise
        self._copier = threading.Thread(
            target=self._copy_output,
            args=(log, echo),
            name=f"worker-{index}-output",
            daemon=True,
        )
        self._copier.start()
        self._closed = False

    def _copy_output(self, log: IO[bytes], echo: bool) -> None:
        with log, self.process.stdout as output:
            for line in output:
                log.write(line)
                log.flush()
                if echo:
                    sys.stdout.write(line.decode("utf-8", errors="replace"))
                    sys.stdout.flush()

    @property
    def returncode(self) -> int | None:
        return self.process.poll()

    def signal(self, signum: int) -> None:
        """Signal the worker's whole process group, so the processes it started get it too."""
        with suppress(ProcessLookupError):
            os.killpg(self.process.pid, signum)

    def wait(self, timeout: float) -> int | None:
        try:
            return self.process.wait(timeout=max(timeout, 0.0))
        except subprocess.TimeoutExpired:
            return None

    def close(self) -> None:
        """Kill whatever is left of the process group and finish copying its output.

        Once only: after the group is gone its id may be reused by an unrelated process.
        """
        if self._closed:
            return
        self._closed = True
        self.signal(signal.SIGKILL)
        if self.wait(_KILL_WAIT_SECONDS) is None:
            logger.error("worker %d (pid %d) survived SIGKILL", self.index, self.process.pid)
        self._copier.join(timeout=_KILL_WAIT_SECONDS)


class _Progress:
    """When each worker of the current attempt last completed a step."""

    def __init__(self, paths: list[Path], started: float) -> None:
        self._paths = paths
        self._seen: list[Heartbeat | None] = [None] * len(paths)
        self._changed_at = [started] * len(paths)
        self.first_step_time: float | None = None

    def poll(self, now: float) -> None:
        for index, path in enumerate(self._paths):
            beat = read_heartbeat(path)
            if beat is not None and beat != self._seen[index]:
                self._seen[index] = beat
                self._changed_at[index] = now
                if self.first_step_time is None:
                    self.first_step_time = beat.time

    def stalled(
        self, live: list[int], now: float, *, hang_timeout: float, startup_timeout: float
    ) -> tuple[int, str] | None:
        """The stalest live worker, when no live worker has completed a step for too long.

        Workers that already finished are not expected to beat any more, so only the live
        ones count; before the first step the (longer) start-up limit applies, because
        importing TensorFlow, reading data and compiling the step all come first.
        """
        if not live or now - max(self._changed_at[i] for i in live) <= (
            hang_timeout if self.first_step_time is not None else startup_timeout
        ):
            return None
        worker = min(live, key=lambda i: self._changed_at[i])
        if self.first_step_time is None:
            return worker, f"stalled: no step completed within {startup_timeout:g}s of start"
        last = self._seen[worker]
        since = "since start" if last is None else f"after step {last.step}"
        return worker, f"stalled: no step completed for {hang_timeout:g}s ({since})"


def _log_excerpt(path: Path, lines: int = _TAIL_LINES) -> str:
    """The end of a worker's log since its last attempt began, for an error message."""
    try:
        with open(path, "rb") as file:
            file.seek(max(0, file.seek(0, os.SEEK_END) - _TAIL_BYTES))
            text = file.read().decode("utf-8", errors="replace")
    except OSError as exc:
        return f"Its log {path} is unreadable: {exc}"
    # Skip the header line or, when the attempt wrote more than was read, a partial line.
    last_attempt = text.rpartition(_HEADER_PREFIX)[2].partition("\n")[2]
    shown = "\n".join(f"    {line}" for line in last_attempt.splitlines()[-lines:])
    return f"Last lines of {path}:\n{shown}"


class Supervisor:
    """Runs ``command`` as ``num_workers`` local workers until they finish, fail or stop.

    Each (re)start gives every worker fresh loopback ports in ``TF_CONFIG``,
    ``SLIPWAY_WORKER_INDEX`` and ``SLIPWAY_HEARTBEAT_FILE=<log_dir>/heartbeat-<i>``. Worker
    ``i`` logs to ``<log_dir>/worker-<i>.log`` (appended, a header per attempt); worker
    0's output is echoed to stdout as well, since it is the one reporting progress.

    ``hang_timeout`` must exceed the longest pause between two steps (an evaluation, a
    checkpoint); ``grace_period`` is how long workers get to save a checkpoint and exit
    after SIGTERM before they are killed; ``failure_grace`` is the (short) time survivors
    of a failed attempt get, since a collective with a dead peer never returns.
    """

    def __init__(
        self,
        command: Sequence[str],
        num_workers: int,
        *,
        max_restarts: int = 3,
        backoff_initial: float = 1.0,
        backoff_max: float = 30.0,
        hang_timeout: float = 120.0,
        startup_timeout: float = 300.0,
        grace_period: float = 30.0,
        failure_grace: float = 1.0,
        log_dir: Path,
        env: dict[str, str] | None = None,
        permanent_exit_codes: Collection[int] = (),
        poll_interval: float = 0.1,
        console: Console | None = None,
    ) -> None:
        if not command:
            raise ValueError("the worker command is empty")
        if num_workers < 1:
            raise ValueError(f"need at least one worker, got {num_workers}")
        for name, value in (
            ("hang_timeout", hang_timeout),
            ("startup_timeout", startup_timeout),
            ("poll_interval", poll_interval),
        ):
            if value <= 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        if grace_period < 0:
            raise ValueError(f"grace_period must be >= 0, got {grace_period}")
        self.command = list(command)
        self.num_workers = num_workers
        self.policy = RestartPolicy(max_restarts, backoff_initial, backoff_max)
        self.hang_timeout = hang_timeout
        self.startup_timeout = startup_timeout
        self.grace_period = grace_period
        self.failure_grace = failure_grace
        self.log_dir = Path(log_dir)
        self.env = dict(env or {})
        self.permanent_exit_codes = frozenset(permanent_exit_codes)
        self.poll_interval = poll_interval
        self.console = console or Console(stderr=True)
        self.restarts: list[RestartEvent] = []
        self._workers: list[_Worker] = []
        self._progress = _Progress([], time.monotonic())
        self._stop_reason: str | None = None

    # -- public ----------------------------------------------------------------------
    @property
    def pids(self) -> list[int]:
        """Process ids of the current attempt's workers, by worker index."""
        return [worker.process.pid for worker in self._workers]

    def heartbeat_file(self, index: int) -> Path:
        return self.log_dir / f"heartbeat-{index}"

    def log_file(self, index: int) -> Path:
        return self.log_dir / f"worker-{index}.log"

    def request_stop(self, reason: str = "stop requested") -> None:
        """Stop as on preemption: workers save a checkpoint and exit, ``run`` returns 143.

        Only assigns an attribute, so it is safe from a signal handler and other threads.
        """
        self._stop_reason = reason

    def run(self) -> int:
        """Supervise until done; returns the exit code (see the module documentation)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with self._signals_forwarded():
            try:
                return self._supervise()
            finally:
                for worker in self._workers:
                    worker.close()

    # -- the loop --------------------------------------------------------------------
    def _supervise(self) -> int:
        self._say(
            logging.INFO,
            f"starting {self.num_workers} workers (logs: {self.log_dir}/worker-<i>.log)",
        )
        self._launch(attempt=1)
        while True:
            outcome = self._watch()
            if isinstance(outcome, int):
                return outcome
            # Survivors of a failure are usually blocked in a collective waiting for the dead
            # peer and cannot save anyway: their last committed checkpoint is the resume point.
            self._terminate(grace=self.failure_grace)
            restart = len(self.restarts) + 1
            culprit = f"worker {outcome.worker} {outcome.reason}"
            permanent = outcome.code in self.permanent_exit_codes
            if permanent or not self.policy.allows(restart):
                verdict = (
                    f"{culprit}; a restart would not help"
                    if permanent
                    else f"giving up after {self.policy.max_restarts} restart(s): {culprit}"
                )
                excerpt = _log_excerpt(self.log_file(outcome.worker))
                self._say(logging.ERROR, f"{verdict}. {excerpt}")
                return outcome.code if permanent and outcome.code else EXIT_GAVE_UP
            delay = self.policy.delay(restart)
            self._say(
                logging.WARNING,
                f"{culprit}; restarting group in {delay:.1f}s "
                f"(restart {restart}/{self.policy.max_restarts})",
            )
            event = RestartEvent(restart, outcome.worker, outcome.reason, outcome.detected_at)
            self.restarts.append(event)
            if self._pause(delay):
                self._say(logging.WARNING, f"{self._stop_reason}; not restarting")
                return EXIT_PREEMPTED
            # Stamped as the launch begins: a fast worker's first step may come before
            # the last of the group's processes has even been started.
            event.relaunched_at = time.time()
            self._launch(attempt=restart + 1)

    def _launch(self, attempt: int) -> None:
        ports = free_ports(self.num_workers)
        base_env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        stamp = datetime.now().isoformat(timespec="seconds")
        header = (
            f"{_HEADER_PREFIX}{attempt} at {stamp} on ports {ports}: {shlex.join(self.command)}\n"
        )
        self._workers = []
        for index in range(self.num_workers):
            heartbeat = self.heartbeat_file(index)
            heartbeat.unlink(missing_ok=True)  # an old beat is not progress of this attempt
            env = {**base_env, **worker_env(ports, index, heartbeat)}
            self._workers.append(
                _Worker(index, self.command, env, self.log_file(index), header, echo=index == 0)
            )
        self._progress = _Progress(
            [self.heartbeat_file(i) for i in range(self.num_workers)], time.monotonic()
        )
        logger.info("attempt %d: workers started with pids %s", attempt, self.pids)

    def _watch(self) -> int | _Failure:
        """Wait for the current attempt to finish, fail, stall or be stopped."""
        while True:
            if self._stop_reason:
                self._say(logging.WARNING, f"{self._stop_reason}: workers save and stop")
                return self._stop_group()
            codes = [worker.returncode for worker in self._workers]
            preempted = [i for i, code in enumerate(codes) if code in _PREEMPTION_CODES]
            if preempted:
                self._say(logging.WARNING, f"worker {preempted[0]} was preempted; stopping all")
                return self._stop_group()
            failed = [i for i, code in enumerate(codes) if code not in (None, 0)]
            if failed:
                code = codes[failed[0]]
                return _Failure(failed[0], describe_exit(code), code, time.time())
            if all(code == 0 for code in codes):
                self._say(logging.INFO, f"all {self.num_workers} workers finished")
                return EXIT_OK
            now = time.monotonic()
            self._progress.poll(now)
            if self.restarts and self.restarts[-1].first_step_at is None:
                self.restarts[-1].first_step_at = self._progress.first_step_time
            live = [i for i, code in enumerate(codes) if code is None]
            stalled = self._progress.stalled(
                live, now, hang_timeout=self.hang_timeout, startup_timeout=self.startup_timeout
            )
            if stalled is not None:
                return _Failure(stalled[0], stalled[1], None, time.time())
            self._pause(self.poll_interval)

    def _stop_group(self) -> int:
        codes = self._terminate()
        return EXIT_OK if all(code == 0 for code in codes) else EXIT_PREEMPTED

    def _terminate(self, grace: float | None = None) -> list[int | None]:
        """SIGTERM every live worker, give them the grace period to save and exit, then kill."""
        grace = self.grace_period if grace is None else grace
        live = [worker for worker in self._workers if worker.returncode is None]
        for worker in live:
            worker.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for worker in live:
            worker.wait(deadline - time.monotonic())
        stragglers = [worker.index for worker in live if worker.returncode is None]
        if stragglers:
            self._say(
                logging.WARNING,
                f"worker(s) {', '.join(map(str, stragglers))} did not exit within "
                f"{grace:g}s of SIGTERM; killing",
            )
        codes = []
        for worker in self._workers:
            worker.close()
            codes.append(worker.returncode)
        return codes

    # -- plumbing --------------------------------------------------------------------
    def _pause(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True as soon as a stop is requested."""
        deadline = time.monotonic() + seconds
        while not self._stop_reason:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            time.sleep(min(remaining, self.poll_interval))
        return True

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.request_stop(f"received {signal.Signals(signum).name}")

    @contextmanager
    def _signals_forwarded(self) -> Iterator[None]:
        """Turn SIGTERM/SIGINT into a stop request (Python allows handlers in the main thread only)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {
            signum: signal.signal(signum, self._on_signal)
            for signum in (signal.SIGTERM, signal.SIGINT)
        }
        try:
            yield
        finally:
            for signum, handler in previous.items():
                if handler is not None:
                    signal.signal(signum, handler)

    def _say(self, level: int, message: str) -> None:
        logger.log(level, message)
        self.console.print(
            message, style=_STYLES.get(level), markup=False, highlight=False, soft_wrap=True
        )
