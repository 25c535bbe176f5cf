"""The local launcher and supervisor, driven with a fake worker that starts in milliseconds."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.waiting import wait_until
from training.launcher import cluster_spec, free_ports, read_heartbeat, tf_config
from training.supervisor import RestartPolicy, Supervisor, describe_exit

pytestmark = pytest.mark.timeout(60)  # run() cleans up its workers when interrupted

FAKE_WORKER = Path(__file__).parents[1] / "support" / "workers" / "fake_worker.py"
FAST = {
    "max_restarts": 3,
    "backoff_initial": 0.05,
    "backoff_max": 0.2,
    "hang_timeout": 2.0,
    "startup_timeout": 10.0,
    "grace_period": 2.0,
    "poll_interval": 0.02,
}
# Runs the supervisor as its own process, so that a real SIGTERM can be sent to it.
SUPERVISOR_PROGRAM = """
import json, sys
from pathlib import Path
from training.supervisor import Supervisor
spec = json.loads(sys.argv[1])
sys.exit(Supervisor(spec["command"], 2, log_dir=Path(spec["log_dir"]), **spec["settings"]).run())
"""


def worker_command(state: Path, flags: str) -> list[str]:
    return [sys.executable, str(FAKE_WORKER), "--state", str(state), *flags.split()]


def make_supervisor(state: Path, flags: str, **settings) -> Supervisor:
    """Two fake workers run with ``flags``, under the fast test settings (or ``settings``)."""
    return Supervisor(
        worker_command(state, flags), 2, log_dir=state / "workers", **{**FAST, **settings}
    )


def worker_state(state: Path, index: int) -> dict:
    return json.loads((state / f"state-{index}.json").read_text())


def worker_configs(state: Path, index: int) -> list[dict]:
    return [
        json.loads(line) for line in (state / f"tf_config-{index}.jsonl").read_text().splitlines()
    ]


def reached_step(supervisor: Supervisor, index: int, step: int) -> bool:
    beat = read_heartbeat(supervisor.heartbeat_file(index))
    return beat is not None and beat.step >= step


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class Background:
    """``Supervisor.run`` on a thread, so the test can act on the workers meanwhile."""

    def __init__(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor
        self.code: int | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.code = self.supervisor.run()

    def result(self, timeout: float = 30.0) -> int | None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the supervisor did not return"
        return self.code


@pytest.fixture
def in_background() -> Iterator[Callable[[Supervisor], Background]]:
    started: list[Background] = []

    def start(supervisor: Supervisor) -> Background:
        started.append(Background(supervisor))
        return started[-1]

    yield start
    for run in started:
        run.supervisor.request_stop("test teardown")
        run.thread.join(30)


# -- launcher ------------------------------------------------------------------------
def test_free_ports_are_distinct_and_bindable():
    ports = free_ports(12)
    assert len(set(ports)) == 12
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))
    with pytest.raises(ValueError):
        free_ports(0)


def test_tf_config_names_every_worker_and_this_task():
    ports = [41001, 41002, 41003]
    config = json.loads(tf_config(ports, 2))
    assert config == {
        "cluster": {"worker": ["127.0.0.1:41001", "127.0.0.1:41002", "127.0.0.1:41003"]},
        "task": {"type": "worker", "index": 2},
    }
    assert cluster_spec(ports) == config["cluster"]
    with pytest.raises(ValueError, match="outside a cluster of 3"):
        tf_config(ports, 3)


# -- policy ---------------------------------------------------------------------------
def test_backoff_doubles_up_to_its_cap_and_restarts_are_bounded():
    policy = RestartPolicy(max_restarts=3, backoff_initial=1.0, backoff_max=5.0)
    assert [policy.delay(restart) for restart in range(1, 6)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert policy.allows(3) and not policy.allows(4)
    assert not RestartPolicy(max_restarts=0).allows(1)
    with pytest.raises(ValueError):
        policy.delay(0)
    with pytest.raises(ValueError):
        RestartPolicy(backoff_initial=2.0, backoff_max=1.0)


def test_exits_are_described_by_code_or_signal():
    assert describe_exit(1) == "exited with code 1"
    assert describe_exit(-signal.SIGKILL) == "died (SIGKILL)"


# -- supervision ----------------------------------------------------------------------
@pytest.mark.process
def test_workers_that_all_finish_give_exit_code_0(tmp_path, capsys):
    supervisor = make_supervisor(tmp_path, "--steps 5")

    assert supervisor.run() == 0

    assert [worker_state(tmp_path, i)["step"] for i in (0, 1)] == [5, 5]
    assert supervisor.restarts == []
    first, second = worker_configs(tmp_path, 0)[0], worker_configs(tmp_path, 1)[0]
    assert first["cluster"] == second["cluster"]
    assert len(set(first["cluster"]["worker"])) == 2
    out = capsys.readouterr().out
    assert "worker 0 step 5/5" in out  # the chief's progress reaches the user
    assert "worker 1" not in out
    log = (tmp_path / "workers" / "worker-1.log").read_text()
    assert log.startswith("===== attempt 1 ") and "worker 1 step 5/5" in log


@pytest.mark.process
def test_a_sigkilled_worker_restarts_the_whole_group_which_resumes(tmp_path, capsys, in_background):
    supervisor = make_supervisor(tmp_path, "--steps 40")
    run = in_background(supervisor)
    wait_until(lambda: reached_step(supervisor, 1, 3), "worker 1 to complete 3 steps")
    killed_at = time.time()
    os.kill(supervisor.pids[1], signal.SIGKILL)

    assert run.result() == 0

    [event] = supervisor.restarts
    assert (event.worker, event.reason) == (1, "died (SIGKILL)")
    assert event.detected_at >= killed_at
    assert 0 <= event.seconds_to_relaunch <= event.seconds_to_first_step
    for index in (0, 1):
        assert worker_state(tmp_path, index)["step"] == 40  # resumed, not restarted from 0
        assert worker_state(tmp_path, index)["attempts"] == 2  # the survivor restarted too
        configs = worker_configs(tmp_path, index)
        assert configs[0]["cluster"] != configs[1]["cluster"]  # fresh ports
    log = (tmp_path / "workers" / "worker-1.log").read_text()
    assert log.count("===== attempt ") == 2
    assert "worker 1 died (SIGKILL); restarting group in 0.1s (restart 1/3)" in (
        capsys.readouterr().err
    )


@pytest.mark.process
def test_a_crash_loop_gives_up_after_max_restarts_naming_the_worker(tmp_path, capsys):
    supervisor = make_supervisor(
        tmp_path, "--steps 10 --crash-at 2 --only-worker 1 --always", max_restarts=2
    )

    assert supervisor.run() == 1

    assert [event.worker for event in supervisor.restarts] == [1, 1]
    assert worker_state(tmp_path, 1)["attempts"] == 3
    err = capsys.readouterr().err
    assert "giving up after 2 restart(s): worker 1 exited with code 1" in err
    assert str(tmp_path / "workers" / "worker-1.log") in err
    assert "worker 1 attempt 3 from step 1\n    worker 1 crashing at step 2" in err  # its log's end
    assert "worker 1 attempt 2" not in err  # only the last attempt is shown


@pytest.mark.process
def test_a_permanent_exit_code_is_returned_without_restarting(tmp_path, capsys):
    supervisor = make_supervisor(
        tmp_path, "--steps 10 --crash-at 2 --exit-code 3 --only-worker 1", permanent_exit_codes={3}
    )

    assert supervisor.run() == 3

    assert supervisor.restarts == []
    assert "worker 1 exited with code 3; a restart would not help" in capsys.readouterr().err


@pytest.mark.process
def test_a_stalled_group_is_killed_and_restarted(tmp_path, capsys):
    supervisor = make_supervisor(
        tmp_path, "--steps 8 --hang-at 4", hang_timeout=1.5, grace_period=30, failure_grace=0.5
    )

    assert supervisor.run() == 0

    [event] = supervisor.restarts
    assert event.reason == "stalled: no step completed for 1.5s (after step 3)"
    assert [worker_state(tmp_path, i)["step"] for i in (0, 1)] == [8, 8]
    # Stalled workers ignore SIGTERM, like a collective waiting on a dead peer: they get the
    # short failure grace, not the preemption grace period.
    assert "did not exit within 0.5s of SIGTERM; killing" in capsys.readouterr().err
    assert event.seconds_to_relaunch < 10


@pytest.mark.process
def test_a_group_that_never_completes_a_step_hits_the_startup_timeout(tmp_path):
    supervisor = make_supervisor(
        tmp_path, "--steps 3 --hang-at 1", startup_timeout=1.0, hang_timeout=60.0, grace_period=0.5
    )

    assert supervisor.run() == 0

    [event] = supervisor.restarts
    assert event.reason == "stalled: no step completed within 1s of start"
    assert [worker_state(tmp_path, i)["step"] for i in (0, 1)] == [3, 3]


@pytest.mark.process
def test_sigterm_to_the_supervisor_reaches_every_worker_and_gives_143(tmp_path):
    spec = {
        "command": worker_command(tmp_path, "--steps 500"),
        "log_dir": str(tmp_path / "workers"),
        "settings": {"grace_period": 10.0, "poll_interval": 0.02},
    }
    with open(tmp_path / "supervisor.out", "wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-c", SUPERVISOR_PROGRAM, json.dumps(spec)],
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        for index in (0, 1):
            wait_until(
                lambda i=index: (tmp_path / "workers" / f"heartbeat-{i}").exists(),
                f"worker {index} to complete a step",
            )
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 143
    finally:
        if process.poll() is None:
            process.terminate()  # the supervisor forwards it: no orphaned workers
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    for index in (0, 1):
        saved_at = int((tmp_path / f"sigterm-{index}").read_text())
        assert 0 < saved_at < 500
        pid = worker_state(tmp_path, index)["pid"]
        wait_until(lambda pid=pid: not alive(pid), f"worker {index} (pid {pid}) to be gone")


@pytest.mark.process
def test_a_worker_preempted_on_its_own_stops_the_group_without_restart(tmp_path, capsys):
    supervisor = make_supervisor(tmp_path, "--steps 500 --preempt-at 3 --only-worker 1")

    assert supervisor.run() == 143

    assert supervisor.restarts == []
    assert (tmp_path / "sigterm-0").exists()  # the peer was told to save and stop
    assert not (tmp_path / "sigterm-1").exists()
    assert "worker 1 was preempted; stopping all" in capsys.readouterr().err


@pytest.mark.process
def test_a_stop_during_back_off_returns_143_without_relaunching(tmp_path, in_background):
    supervisor = make_supervisor(
        tmp_path, "--steps 10 --crash-at 1 --only-worker 0", backoff_initial=60.0, backoff_max=60.0
    )
    run = in_background(supervisor)
    wait_until(lambda: supervisor.restarts, "the first failure")
    supervisor.request_stop("test stop")

    assert run.result(timeout=10) == 143
    assert supervisor.restarts[0].relaunched_at is None
    assert worker_state(tmp_path, 0)["attempts"] == 1
