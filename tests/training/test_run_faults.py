"""`slipway train` as real processes under faults that used to fork or break a run: a
killed supervisor, a second run in the same run or checkpoint directory, an experiment
edited after its checkpoints were written."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time

import pytest

from contracts.ownership import try_lock
from tests.support.experiments import write_experiment
from tests.support.training_processes import finish, slipway, wait_for_step, worker_pid
from training.checkpoints import latest_committed_step
from training.run_lock import LOCK_FILE, RunInUseError, exclusive_run

TIMEOUT = 120


def await_exit(pids: list[int]) -> None:
    """Block until every process in ``pids`` has exited (they are not this process's
    children, so their exit is awaited through pidfds)."""
    deadline = time.monotonic() + TIMEOUT
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        finally:
            os.close(fd)
        if not ready:
            for survivor in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(survivor, signal.SIGKILL)
            pytest.fail(f"workers {pids} outlived their supervisor")


@pytest.mark.process
def test_workers_die_with_a_killed_supervisor_and_a_live_run_is_never_joined(
    tmp_path, digits_dataset
):
    path = write_experiment(
        tmp_path, digits_dataset, training__steps=100_000, checkpoint__every_steps=5
    )
    supervisor = slipway("train", str(path), "--workers", "2", "--quiet", "--no-export")
    wait_for_step(tmp_path / "run" / "workers" / "heartbeat-1", supervisor, 2)
    workers = [worker_pid(index, str(path)) for index in (0, 1)]
    assert None not in workers

    second = slipway("train", str(path), "--quiet", "--no-export")
    code, output = finish(second)
    assert code == 2, output
    flat = " ".join(output.split())
    assert f"another slipway train is running in this directory (pid {supervisor.pid})" in flat
    assert "Traceback" not in output

    supervisor.send_signal(signal.SIGKILL)
    supervisor.wait(timeout=TIMEOUT)
    await_exit(workers)
    lock = try_lock(tmp_path / "run" / LOCK_FILE)
    assert lock is not None, "the killed supervisor's lock was not freed"
    lock.release()


@pytest.mark.process
def test_an_experiment_edited_after_its_checkpoints_is_a_user_error_never_retried(
    tmp_path, digits_dataset
):
    path = write_experiment(tmp_path, digits_dataset, training__steps=10)
    code, output = finish(slipway("train", str(path), "--quiet", "--no-export"))
    assert code == 0, output
    assert latest_committed_step(tmp_path / "run" / "checkpoints") == 10

    edited = write_experiment(
        tmp_path, digits_dataset, training__steps=20, model__hidden_units=[48]
    )
    wide = {"COLUMNS": "1000"}  # one message on one line
    code, output = finish(slipway("train", str(edited), "--quiet", "--no-export", env=wide))
    assert code == 2, output
    [message] = [line for line in output.splitlines() if line.startswith("error: ")]
    assert "checkpoints/ckpt-10 does not fit the experiment as it is now" in message
    assert "variable with shape (48,) and name mlp_dense_0/bias" in message
    assert "Traceback" not in output
    assert "unrestored values" not in output

    code, output = finish(slipway("train", str(edited), "--workers", "2", "--quiet", "--no-export"))
    assert code == 2, output
    assert "a restart would not help" in output
    log = (tmp_path / "run" / "workers" / "worker-0.log").read_text()
    assert log.count("===== attempt ") == 1
    assert latest_committed_step(tmp_path / "run" / "checkpoints") == 10


@pytest.mark.process
def test_two_experiments_never_train_into_one_checkpoint_directory_at_once(
    tmp_path, digits_dataset
):
    shared = tmp_path / "shared-checkpoints"
    common = dict(checkpoint__directory=str(shared), checkpoint__every_steps=5)
    first = write_experiment(tmp_path / "a", digits_dataset, training__steps=100_000, **common)
    second = write_experiment(tmp_path / "b", digits_dataset, training__steps=10, **common)
    heartbeat = tmp_path / "heartbeat"
    holder = slipway(
        "train",
        str(first),
        "--quiet",
        "--no-export",
        env={"SLIPWAY_HEARTBEAT_FILE": str(heartbeat)},
    )
    try:
        wait_for_step(heartbeat, holder, 2)
        wide = {"COLUMNS": "1000"}
        code, output = finish(slipway("train", str(second), "--quiet", "--no-export", env=wide))
    finally:
        holder.kill()
        holder.wait(timeout=TIMEOUT)
    assert code == 2, output
    flat = " ".join(output.split())
    assert (
        f"{shared}: another slipway train is writing its checkpoints to this checkpoint "
        f"directory (pid {holder.pid}, run directory {tmp_path / 'a' / 'run'})"
    ) in flat
    assert "Traceback" not in output
    assert not (tmp_path / "b" / "run" / "metrics.jsonl").exists()


def test_the_checkpoint_lock_is_the_run_lock_held_on_a_second_directory(tmp_path):
    shared = tmp_path / "checkpoints"
    with exclusive_run(tmp_path / "a", shared):
        with pytest.raises(RunInUseError) as refused, exclusive_run(tmp_path / "b", shared):
            pass
        assert f"(pid {os.getpid()}, run directory {tmp_path / 'a'})" in str(refused.value)
        released = try_lock(tmp_path / "b" / LOCK_FILE)  # b's own lock was let go
        assert released is not None
        released.release()
    with exclusive_run(tmp_path / "b", shared), exclusive_run(tmp_path / "c", tmp_path / "c"):
        pass  # one directory as both is locked once
