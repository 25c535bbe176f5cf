"""Committed checkpoints: saved on schedule, pruned with their markers, and a crash or a
corrupted file never resumes training from bad state."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from tests.support.clocks import FakeClock
from training import checkpoints
from training.checkpoints import (
    CheckpointError,
    CheckpointKeeper,
    CheckpointMismatchError,
    CheckpointWarning,
    committed_steps,
    latest_committed_step,
)


class Training:
    """A small model, its optimizer and a step counter, as the trainer checkpoints them."""

    def __init__(self, seed: int = 0) -> None:
        keras.utils.set_random_seed(seed)
        inputs = keras.Input((4,), name="features")
        hidden = keras.layers.Dense(8, activation="relu")(inputs)
        self.model = keras.Model(inputs, keras.layers.Dense(2, name="score")(hidden))
        self.optimizer = keras.optimizers.Adam(0.01)
        self.optimizer.build(self.model.trainable_variables)
        self.step = tf.Variable(0, dtype=tf.int64, name="step")
        self.checkpoint = tf.train.Checkpoint(
            model=self.model, optimizer=self.optimizer, step=self.step
        )

    def train(self, steps: int = 1) -> None:
        x = tf.random.stateless_normal((16, 4), seed=(1, int(self.step.numpy())))
        for _ in range(steps):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(self.model(x) - 1.0))
            grads = tape.gradient(loss, self.model.trainable_variables)
            self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables, strict=True))
            self.step.assign_add(1)

    def state(self) -> list[np.ndarray]:
        return [v.numpy() for v in self.model.weights + self.optimizer.variables] + [
            self.step.numpy()
        ]


def keeper(directory: Path, training: Training, **kwargs) -> CheckpointKeeper:
    kwargs.setdefault("keep", 3)
    return CheckpointKeeper(directory, training.checkpoint, **kwargs)


def saved_at_step_one(directory: Path) -> tuple[Training, CheckpointKeeper]:
    """A training whose step 1 is committed, with a keeper of one checkpoint."""
    training = Training()
    kept = keeper(directory, training, keep=1)
    kept.save(1)
    return training, kept


def assert_same(left: list[np.ndarray], right: list[np.ndarray]) -> None:
    assert len(left) == len(right)
    for a, b in zip(left, right, strict=True):
        np.testing.assert_array_equal(a, b)


def data_files(directory: Path, step: int) -> list[str]:
    return sorted(path.name for path in directory.glob(f"ckpt-{step}.data-*"))


def data_file(directory: Path, step: int) -> Path:
    """The data file holding the variables' values (the largest one)."""
    return max(directory.glob(f"ckpt-{step}.data-*"), key=lambda path: path.stat().st_size)


def test_round_trip_restores_weights_optimizer_slots_and_step(tmp_path: Path) -> None:
    original = Training(seed=1)
    original.train(3)
    path = keeper(tmp_path, original).save(3)
    assert path == str(tmp_path / "ckpt-3")
    marker = json.loads((tmp_path / "ckpt-3.commit.json").read_text())
    assert marker["step"] == 3
    assert set(marker["files"]) == {"ckpt-3.index", *data_files(tmp_path, 3)}
    assert marker["files"]["ckpt-3.index"]["bytes"] == (tmp_path / "ckpt-3.index").stat().st_size

    fresh = Training(seed=2)
    assert not np.array_equal(fresh.state()[0], original.state()[0])
    assert keeper(tmp_path, fresh).restore_latest() == 3
    assert_same(fresh.state(), original.state())
    assert int(fresh.optimizer.iterations.numpy()) == 3


def test_every_steps_counts_from_the_last_save_and_tolerates_jumps(tmp_path: Path) -> None:
    training = Training()
    kept = keeper(tmp_path, training, every_steps=5)
    assert [s for s in range(0, 5) if kept.should_save(s)] == []
    assert kept.should_save(5)
    assert kept.maybe_save(5) == str(tmp_path / "ckpt-5")
    assert not kept.should_save(5)
    assert [s for s in range(6, 10) if kept.should_save(s)] == []
    assert kept.maybe_save(8) is None
    # Several steps per execution: 8 -> 12 passes 10 without landing on it.
    assert kept.should_save(12)
    assert committed_steps(tmp_path) == [5]


def test_every_seconds_uses_the_clock_since_the_last_save(tmp_path: Path) -> None:
    clock = FakeClock()
    kept = keeper(tmp_path, Training(), every_seconds=60, clock=clock)
    clock.now += 59
    assert not kept.should_save(1)
    clock.now += 1
    assert kept.should_save(1)
    kept.save(1)
    clock.now += 30
    assert not kept.should_save(2)
    clock.now += 30
    assert kept.should_save(2)
    assert not kept.should_save(1)  # the step just saved is never saved twice


def test_time_based_votes_go_through_the_strategy(tmp_path: Path) -> None:
    clock = FakeClock()
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    kept = keeper(tmp_path, Training(), every_seconds=10, clock=clock, strategy=strategy)
    assert not kept.should_save(1)
    clock.now += 10
    assert kept.should_save(1)


def test_keep_prunes_checkpoints_and_their_markers(tmp_path: Path) -> None:
    training = Training()
    kept = keeper(tmp_path, training, keep=2)
    for step in range(1, 6):
        training.train()
        kept.save(step)
    assert committed_steps(tmp_path) == [5, 4]
    names = sorted(os.listdir(tmp_path))
    assert names == sorted(
        ["ckpt-4.commit.json", "ckpt-5.commit.json", "ckpt-4.index", "ckpt-5.index"]
        + data_files(tmp_path, 4)
        + data_files(tmp_path, 5)
    )
    # A new keeper on the same directory (a restarted run) honours the same count.
    again = keeper(tmp_path, training, keep=2)
    again.save(6)
    assert committed_steps(tmp_path) == [6, 5]
    assert not (tmp_path / "ckpt-4.index").exists()


def test_checkpoints_preserved_by_age_keep_their_markers(tmp_path: Path) -> None:
    training = Training()
    # Every checkpoint leaving the active set is older than the (tiny) preservation age.
    kept = keeper(tmp_path, training, keep=1, keep_every_hours=1e-9)
    for step in (1, 2, 3):
        kept.save(step)
    assert committed_steps(tmp_path) == [3, 2, 1]
    (tmp_path / "ckpt-3.commit.json").unlink()
    (tmp_path / "ckpt-2.commit.json").unlink()
    assert keeper(tmp_path, Training()).restore_latest() == 1


def test_one_checkpoint_is_kept_every_keep_every_hours(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hours = iter([0.0, 0.5, 1.2, 1.5, 2.3])
    monkeypatch.setattr(
        checkpoints,
        "time",
        SimpleNamespace(time=lambda: next(hours) * 3600, monotonic=time.monotonic),
    )
    training = Training()
    kept = keeper(tmp_path, training, keep=1, keep_every_hours=1)
    for step in range(1, 6):
        kept.save(step)
    # The oldest, then the first one an hour younger than it; the newest as ``keep``.
    assert committed_steps(tmp_path) == [5, 3, 1]
    assert sorted(path.name for path in tmp_path.glob("ckpt-2*")) == []


def test_objects_added_after_a_save_are_in_the_next_checkpoint(tmp_path: Path) -> None:
    training = Training()
    kept = keeper(tmp_path, training)
    kept.save(1)
    # As optimizer slots appear with the first update after a save at step 0.
    training.checkpoint.extra = tf.Variable([3.0, 4.0], name="extra")
    kept.save(2)
    fresh = Training(seed=2)
    fresh.checkpoint.extra = tf.Variable([0.0, 0.0], name="extra")
    assert keeper(tmp_path, fresh).restore_latest() == 2
    np.testing.assert_array_equal(fresh.checkpoint.extra.numpy(), [3.0, 4.0])


class Counter(tf.train.experimental.PythonState):
    """Python-side state, as a researcher's own trackable may hold."""

    def __init__(self) -> None:
        self.count = 0

    def serialize(self) -> str:
        return str(self.count)

    def deserialize(self, string_value: str) -> None:
        self.count = int(string_value)


def test_python_state_is_saved_as_it_is_at_each_save(tmp_path: Path) -> None:
    training = Training()
    training.checkpoint.counter = Counter()
    kept = keeper(tmp_path, training)
    for step in (1, 2):
        training.checkpoint.counter.count = step * 10
        kept.save(step)
    fresh = Training(seed=2)
    fresh.checkpoint.counter = Counter()
    assert keeper(tmp_path, fresh).restore_latest() == 2
    assert fresh.checkpoint.counter.count == 20


def test_saving_the_same_step_twice_rewrites_nothing(tmp_path: Path) -> None:
    training = Training()
    kept = keeper(tmp_path, training)
    kept.save(2)
    before = (tmp_path / "ckpt-2.commit.json").stat().st_mtime_ns
    training.train()
    assert kept.save(2) == str(tmp_path / "ckpt-2")
    assert (tmp_path / "ckpt-2.commit.json").stat().st_mtime_ns == before


def test_checkpoint_without_commit_marker_is_ignored(tmp_path: Path) -> None:
    training = Training()
    kept = keeper(tmp_path, training)
    kept.save(1)
    expected = training.state()
    training.train()
    kept.save(2)
    (tmp_path / "ckpt-2.commit.json").unlink()  # the process died before committing
    assert latest_committed_step(tmp_path) == 1

    restored = Training(seed=5)
    resumed = keeper(tmp_path, restored)
    assert resumed.restore_latest() == 1
    assert_same(restored.state(), expected)
    # The next save clears what the interrupted one left behind.
    resumed.save(3)
    assert not list(tmp_path.glob("ckpt-2*"))


def disk_full(*_args: object, **_kwargs: object) -> None:
    raise OSError("disk full")


def test_crash_before_commit_keeps_the_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    training, kept = saved_at_step_one(tmp_path)
    expected = training.state()
    training.train()

    monkeypatch.setattr(checkpoints, "write_json_atomically", disk_full)
    with pytest.raises(OSError, match="disk full"):
        kept.save(2)
    monkeypatch.undo()
    # keep=1, yet step 1 survives: the manager deletes only after the commit.
    assert (tmp_path / "ckpt-1.index").exists()
    restored = Training(seed=3)
    assert keeper(tmp_path, restored, keep=1).restore_latest() == 1
    assert_same(restored.state(), expected)


def test_commit_off_the_training_thread_counts_once_its_marker_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    training, kept = saved_at_step_one(tmp_path)
    training.train()
    expected = training.state()
    release = threading.Event()
    write_marker = checkpoints.write_json_atomically

    def held_back(*args, **kwargs) -> None:
        assert release.wait(60)
        write_marker(*args, **kwargs)

    monkeypatch.setattr(checkpoints, "write_json_atomically", held_back)
    assert kept.save(2, wait=False) == str(tmp_path / "ckpt-2")
    training.train()  # training goes on while step 2 is committed
    # Not committed yet, and step 1 is not deleted until it is (keep=1).
    assert committed_steps(tmp_path) == [1]
    assert (tmp_path / "ckpt-1.index").exists()
    release.set()
    restored = Training(seed=3)
    kept.checkpoint = restored.checkpoint
    assert kept.restore_latest() == 2  # a restore finishes the commit first
    assert_same(restored.state(), expected)
    assert committed_steps(tmp_path) == [2]
    assert not (tmp_path / "ckpt-1.index").exists()


def test_a_commit_that_failed_off_the_training_thread_is_raised_and_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    training, kept = saved_at_step_one(tmp_path)
    training.train()

    monkeypatch.setattr(checkpoints, "write_json_atomically", disk_full)
    kept.save(2, wait=False)
    with pytest.raises(OSError, match="disk full"):
        kept.wait()
    monkeypatch.undo()
    assert committed_steps(tmp_path) == [1]
    assert (tmp_path / "ckpt-1.index").exists()
    kept.save(2)  # not taken for the step just saved: it never counted
    assert committed_steps(tmp_path) == [2]


def flip_bytes(path: Path) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 4] = bytes(b ^ 0xFF for b in data[middle : middle + 4])
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (flip_bytes, "SHA-256 does not match"),
        (truncate, "bytes, expected"),
        (Path.unlink, "missing"),
    ],
)
def test_damaged_latest_checkpoint_falls_back_to_the_previous_one(
    tmp_path: Path, damage, reason: str
) -> None:
    training = Training()
    kept = keeper(tmp_path, training)
    training.train()
    kept.save(1)
    expected = training.state()
    training.train()
    kept.save(2)
    damage(data_file(tmp_path, 2))

    restored = Training(seed=4)
    with pytest.warns(CheckpointWarning, match=rf"ckpt-2: .*{reason}") as caught:
        assert keeper(tmp_path, restored).restore_latest() == 1
    assert len(caught) == 1
    assert_same(restored.state(), expected)


def test_no_usable_checkpoint_is_an_error_not_a_fresh_start(tmp_path: Path) -> None:
    training = Training()
    keeper(tmp_path, training).save(1)
    flip_bytes(data_file(tmp_path, 1))
    with pytest.warns(CheckpointWarning), pytest.raises(CheckpointError, match="step 1"):
        keeper(tmp_path, Training()).restore_latest()


def test_checkpoint_of_another_model_is_not_half_restored(tmp_path: Path) -> None:
    keeper(tmp_path, Training()).save(1)
    other = keras.Sequential([keras.Input((3,)), keras.layers.Dense(5, name="wider")])
    mismatched = tf.train.Checkpoint(model=other)
    with pytest.raises(CheckpointMismatchError, match=r"ckpt-1 does not fit.*wider/"):
        CheckpointKeeper(tmp_path, mismatched, keep=1).restore_latest()


def test_no_checkpoint_means_a_fresh_start(tmp_path: Path) -> None:
    training = Training()
    assert keeper(tmp_path / "missing", training).restore_latest() is None
    assert keeper(tmp_path, training).restore_latest() is None
    assert latest_committed_step(tmp_path) is None


def test_restore_of_one_step(tmp_path: Path) -> None:
    training = Training()
    kept = keeper(tmp_path, training)
    kept.save(1)
    expected = training.state()
    training.train()
    kept.save(2)
    restored = Training(seed=7)
    assert keeper(tmp_path, restored).restore(1) == 1
    assert_same(restored.state(), expected)
    assert keeper(tmp_path, restored).restore(9) is None


def test_dataset_iterator_resumes_at_the_same_element(tmp_path: Path) -> None:
    dataset = tf.data.Dataset.range(100).shuffle(100, seed=3).batch(4)
    iterator = iter(dataset)
    kept = CheckpointKeeper(tmp_path, tf.train.Checkpoint(iterator=iterator), keep=1)
    for _ in range(3):
        next(iterator)
    kept.save(3)
    expected = [next(iterator).numpy() for _ in range(2)]

    resumed_iterator = iter(dataset)
    resumed = CheckpointKeeper(tmp_path, tf.train.Checkpoint(iterator=resumed_iterator), keep=1)
    assert resumed.restore_latest() == 3
    assert_same([next(resumed_iterator).numpy() for _ in range(2)], expected)


def test_non_chief_saves_outside_the_directory_and_restores_from_it(tmp_path: Path) -> None:
    directory = tmp_path / "checkpoints"
    chief_training, worker_training = Training(seed=1), Training(seed=2)
    chief = keeper(directory, chief_training, is_chief=True)
    worker = keeper(directory, worker_training, is_chief=False, worker_index=1)
    assert worker.save(1) is None
    assert not directory.exists()
    assert sorted(os.listdir(tmp_path)) == []  # the per-worker directory is gone again
    chief.save(1)
    assert worker.restore_latest() == 1
    assert_same(worker_training.state(), chief_training.state())


def test_invalid_settings_are_refused(tmp_path: Path) -> None:
    training = Training()
    with pytest.raises(ValueError, match="keep"):
        keeper(tmp_path, training, keep=0)
    with pytest.raises(ValueError, match="every_steps"):
        keeper(tmp_path, training, every_steps=0)
    with pytest.raises(ValueError, match="every_seconds"):
        keeper(tmp_path, training, every_seconds=0)
