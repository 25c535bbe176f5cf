"""The Controller: *when* a run trains, evaluates, checkpoints, stops and publishes.

As Orbit's ``Controller`` it holds no model code: it drives a Trainer in a loop of
compiled executions (``steps_per_execution`` updates each, cut short where an
evaluation or the end falls), and between executions it logs, checkpoints, answers
preemption and recovers from non-finite losses; nothing interrupts an update half-way.

Everything a resumed run needs to make bit-identical updates, the input position among
it, is what the Trainer lists as ``checkpointed``, saved as one checkpoint whose commit
marker makes a step resumable. So a run killed at any moment continues exactly from its
latest committed checkpoint, and a run that starts from another run's checkpoint
(``initialize_from``, how a Hyperband trial continues an earlier one) continues exactly
as that run would have.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import tensorflow as tf

from training.checkpoints import CheckpointKeeper
from training.errors import EXIT_DIVERGED, EXIT_OK, TrainingSetupError
from training.export import nonfinite_check
from training.logs import RunLog
from training.preemption import EXIT_PREEMPTED, PreemptionFlag
from training.publish import publish_model
from training.trainer import Execution, Trainer, weights_digest

# Called at every evaluation point: the step, the mean training loss of the updates
# since the previous point (in this process), and the evaluation split's results.
EvaluationCallback = Callable[[int, float, dict[str, float]], None]


@dataclass
class TrainOutcome:
    """How a run ended and what it produced.

    ``exit_code`` is 0 (trained), 3 (the loss kept diverging), 143 (preempted; a
    checkpoint was saved) or, for a supervisor of several workers, its own exit code.
    """

    exit_code: int
    step: int
    precision: str = ""
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    examples_per_second: float = 0.0
    skipped_updates: int = 0  # by this process (restores do not roll the count back)
    restores: int = 0
    weights_sha256: str = ""
    published: tuple[int, Path] | None = None  # (version, directory)


def check_writable(directory: Path) -> None:
    """Fail before any work when the run could not save a checkpoint."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".write-probe-{time.monotonic_ns()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise TrainingSetupError(
            f"checkpoint.directory: cannot write to {directory}: {exc.strerror or exc}"
        ) from None


class Controller:
    """Runs one Trainer: a context manager, since it holds the run's log open.

    ``eval_every_steps`` places evaluation points (None: only at the end, when asked);
    ``initialize_from`` is a checkpoint directory to start from when this run has no
    checkpoint of its own yet.
    """

    def __init__(
        self,
        trainer: Trainer,
        *,
        eval_every_steps: int | None,
        progress: bool = True,
        initialize_from: Path | None = None,
    ) -> None:
        self.trainer = trainer
        self.task = trainer.task
        config = self.task.config
        role = trainer.role
        self.eval_every_steps = eval_every_steps
        self.initialize_from = initialize_from
        with trainer.strategy.scope():
            self.epoch = tf.Variable(0, trainable=False, dtype=tf.int64, name="epoch")
            # The training loss since the last evaluation point: checkpointed, so the mean
            # reported there is the same whether or not the run was interrupted on the way.
            self.loss_sum = tf.Variable(0.0, trainable=False, dtype=tf.float64, name="loss_sum")
            self.loss_count = tf.Variable(0, trainable=False, dtype=tf.int64, name="loss_count")
        self.keeper = CheckpointKeeper(
            config.checkpoint_path,
            tf.train.Checkpoint(
                **trainer.checkpointed,
                epoch=self.epoch,
                loss_sum=self.loss_sum,
                loss_count=self.loss_count,
            ),
            keep=config.checkpoint.keep,
            keep_every_hours=config.checkpoint.keep_every_hours,
            every_steps=config.checkpoint.every_steps,
            every_seconds=config.checkpoint.every_seconds,
            is_chief=role.is_chief,
            worker_index=role.index,
            strategy=trainer.strategy,
        )
        self.log = RunLog(
            config.run_path, self.task.total_steps, is_chief=role.is_chief, progress=progress
        )
        self._evaluations: dict[tuple[str, int], dict[str, float]] = {}
        self._nonfinite = nonfinite_check([*trainer.model.weights, *trainer.optimizer.variables])

    def __enter__(self) -> Controller:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            self.keeper.close()  # a checkpoint still being committed is finished, not dropped
        finally:
            self.log.close()

    # -- the loop --------------------------------------------------------------------
    def train(
        self, *, until_step: int | None = None, on_evaluation: EvaluationCallback | None = None
    ) -> TrainOutcome:
        """Resume (or start), then train to the run's last step or ``until_step``.

        SIGTERM/SIGINT make every worker save after the same update and return 143.
        The last step is always checkpointed.
        """
        trainer = self.trainer
        total = self.task.total_steps
        end = total if until_step is None else min(until_step, total)
        batch_size = self.task.config.data.batch_size
        flag = PreemptionFlag().install()
        restores, examples, busy = 0, 0, 0.0
        try:
            self.restore()
            if self._evaluates_at(trainer.step) and self.loss_count.numpy() > 0:
                # Updates since the last evaluation, at an evaluation point: the run
                # resumed here may have been interrupted before it evaluated.
                self._evaluate_and_report(on_evaluation)
            while trainer.step < end:
                count = self._updates_until_next_stop(end)
                started = time.perf_counter()
                execution = trainer.train(count, stop_requested=flag.requested)
                busy += time.perf_counter() - started
                examples += count * batch_size
                if math.isfinite(execution.loss):  # skipped updates changed nothing
                    self.loss_sum.assign_add(execution.loss * count)
                    self.loss_count.assign_add(count)
                step = trainer.step
                if execution.note:
                    self.log.event(step, execution.note)
                self.epoch.assign(step // self.task.steps_per_epoch)
                self._log_execution(step, execution, examples / max(busy, 1e-9))
                if execution.stop_requested:
                    skipping = trainer.consecutive_nonfinite > 0
                    saved = self.save(force=True) and not skipping
                    what = "checkpoint saved" if saved else "no checkpoint saved (not finite)"
                    self.log.event(step, f"preempted ({flag.signal_name or 'peer'}); {what}")
                    return self._outcome(EXIT_PREEMPTED, examples, busy, restores)
                if not (self._finite_enough() and self.save() and self._sound_at_end(end)):
                    restores += 1
                    if restores > self.task.config.training.nonfinite.max_restores:
                        self.log.event(step, "loss keeps diverging; giving up")
                        return self._outcome(EXIT_DIVERGED, examples, busy, restores)
                    continue
                if self._evaluates_at(step):
                    self._evaluate_and_report(on_evaluation)
            self.save(force=True)
            outcome = self._outcome(EXIT_OK, examples, busy, restores)
            outcome.weights_sha256 = weights_digest(trainer.model)
            return outcome
        finally:
            flag.uninstall()

    def _log_execution(self, step: int, execution: Execution, examples_per_second: float) -> None:
        self.log.heartbeat(step)
        self.log.scalars(
            step,
            {
                "loss": execution.loss,
                "gradient_norm": execution.gradient_norm,
                "learning_rate": execution.learning_rate,
                "examples_per_second": examples_per_second,
            },
        )
        self.log.progress(step, {"loss": execution.loss})

    def _updates_until_next_stop(self, end: int) -> int:
        """Updates in the next execution: at most ``steps_per_execution``, never past the
        end or an evaluation point (the updates are the same however they are grouped)."""
        step = self.trainer.step
        count = min(self.task.config.training.steps_per_execution, end - step)
        if self.eval_every_steps:
            count = min(count, self.eval_every_steps - step % self.eval_every_steps)
        return count

    def _evaluates_at(self, step: int) -> bool:
        return bool(self.eval_every_steps) and step % self.eval_every_steps == 0

    def _outcome(self, code: int, examples: int, busy: float, restores: int) -> TrainOutcome:
        return TrainOutcome(
            exit_code=code,
            step=self.trainer.step,
            precision=self.trainer.precision,
            examples_per_second=examples / max(busy, 1e-9),
            skipped_updates=self.trainer.skipped_updates,
            restores=restores,
        )

    # -- checkpoints -----------------------------------------------------------------
    def save(self, *, force: bool = False) -> bool:
        """Checkpoint when due; False when the state turned out poisoned and the run went
        back to its last checkpoint instead.

        Nothing is committed inside a run of skipped updates (the streak may yet end in
        a restore, and a resume must not land in the middle of it) nor with non-finite
        weights or optimizer state: a committed checkpoint is one worth resuming from.
        """
        step = self.trainer.step
        if not (force or self.keeper.should_save(step)):
            return True
        if self.trainer.consecutive_nonfinite:
            self.log.event(step, "checkpoint not saved: the last update was skipped")
            return True
        if not self._state_finite(step):
            return False
        # A scheduled save commits while training goes on; a forced one (the last step,
        # preemption) is committed before the run goes on to evaluate, publish or exit.
        self.keeper.save(step, wait=force)
        return True

    def _sound_at_end(self, end: int) -> bool:
        """At the last step the weights must be finite whether or not a save was due,
        since they are what is evaluated and published."""
        return self.trainer.step < end or self._state_finite(self.trainer.step)

    def _state_finite(self, step: int) -> bool:
        """Whether weights and optimizer state are finite; if not, go back to the last
        checkpoint (as after too many skipped updates)."""
        poisoned = self._nonfinite()
        if not poisoned:
            return True
        shown = ", ".join(poisoned[:3]) + (", ..." if len(poisoned) > 3 else "")
        self.log.event(step, f"not finite: {shown}; checkpoint not saved")
        self._recover(f"{len(poisoned)} variables not finite")
        return False

    def restore(self) -> int | None:
        """Resume from this run's newest committed checkpoint, else start from
        ``initialize_from``'s; the step restored, or None for a fresh start."""
        self._evaluations.clear()
        step = self.keeper.restore_latest()
        if step is not None:
            self.trainer.seek_input()
            self.log.event(step, f"resumed from checkpoint at step {step}")
            return step
        if self.initialize_from is None:
            return None
        source = self.initialize_from
        start = CheckpointKeeper(source, self.keeper.checkpoint, keep=1)
        step = start.restore_latest()
        if step is None:
            raise TrainingSetupError(f"{source}: no committed checkpoint to start from")
        self._forget_losses()  # that run's losses are not this run's
        self.trainer.seek_input()
        self.log.event(step, f"started from {source} at step {step}")
        return step

    def _finite_enough(self) -> bool:
        """After too many non-finite updates in a row, go back to the last checkpoint.

        Weights and optimizer return to the checkpoint, but the input keeps moving
        forward, so the batches that diverged are not replayed (as large-scale training
        does after a loss spike), and the learning rate is lowered.
        """
        trainer = self.trainer
        policy = self.task.config.training.nonfinite
        consecutive = trainer.consecutive_nonfinite
        if consecutive == 0:
            return True
        self.log.event(trainer.step, f"non-finite loss: update skipped ({consecutive} in a row)")
        if consecutive < policy.max_consecutive:
            return True
        self._recover(f"{consecutive} non-finite updates in a row")
        return False

    def _recover(self, reason: str) -> None:
        """Back to the last checkpoint with a lower learning rate; the input moves on."""
        trainer = self.trainer
        factor = self.task.config.training.nonfinite.learning_rate_factor
        # Lowered from the rate in use, not from the checkpoint's, which the restore brings back.
        scale = float(trainer.lr_scale.numpy()) * factor
        position = int(trainer.input_position.numpy())
        restored = self.keeper.restore_latest()
        trainer.input_position.assign(position)
        self._evaluations.clear()
        trainer.lr_scale.assign(scale)
        trainer.forget_nonfinite()
        where = f"checkpoint {restored}" if restored is not None else "no checkpoint yet"
        self.log.event(
            trainer.step,
            f"{reason}: restored {where}; learning rate now {scale:g} x schedule",
        )

    # -- evaluation and publishing ---------------------------------------------------
    def evaluate(self, split: str) -> dict[str, float]:
        """The current weights' results on ``split``, logged; computed once per step."""
        step = self.trainer.step
        if (split, step) not in self._evaluations:
            results = self.trainer.evaluate(split)
            self.log.scalars(step, results, kind=split)
            self._evaluations[(split, step)] = results
        return self._evaluations[(split, step)]

    def _evaluate_and_report(self, on_evaluation: EvaluationCallback | None) -> None:
        """Evaluate at an evaluation point; the callback gets the mean training loss since
        the previous one (NaN when no update was made in between)."""
        results = self._evaluate_eval_split()
        if on_evaluation is not None:
            count = int(self.loss_count.numpy())
            loss = float(self.loss_sum.numpy()) / count if count else float("nan")
            on_evaluation(self.trainer.step, loss, results)
        self._forget_losses()

    def _forget_losses(self) -> None:
        self.loss_sum.assign(0.0)
        self.loss_count.assign(0)

    def _evaluate_eval_split(self) -> dict[str, float]:
        split = self.task.config.data.eval_split
        return {} if split is None else self.evaluate(split)

    def evaluate_held_out(self) -> dict[str, dict[str, float]]:
        """Results on the evaluation and test splits: what a published model reports."""
        data = self.task.config.data
        return {
            split: self.evaluate(split)
            for split in (data.eval_split, data.test_split)
            if split is not None
        }

    def publish(
        self, metrics: dict[str, dict[str, float]], *, extra: dict[str, object] | None = None
    ) -> tuple[int, Path] | None:
        """Publish the current weights as the experiment's next model version.

        Every worker must call it (saving reads replicated variables collectively); the
        chief's call returns ``(version, directory)``, the others' None.
        """
        return publish_model(
            self.trainer.model,
            self.task,
            metrics=metrics,
            method=self.trainer.precision,
            extra=extra,
            is_chief=self.trainer.role.is_chief,
        )
