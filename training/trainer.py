"""The trainer: one experiment, from its dataset to a published SavedModel.

A run is a loop of compiled executions (``steps_per_execution`` updates each). Between
executions the host logs, checkpoints, answers preemption and recovers from non-finite
losses; nothing interrupts an update half-way. Everything a resumed run needs to make
bit-identical updates — weights, optimizer slots and step, the loss scale, the
learning-rate scale, dropout RNG state and each worker's input-iterator position — is
in the checkpoints, so a run killed at any moment continues exactly from its latest
committed checkpoint.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tensorflow as tf
import tf_keras as keras

from research.experiments.config import ExperimentConfig
from research.experiments.model_io import model_io
from research.models import build_model, compile_args
from training import data as training_data
from training.checkpoints import CheckpointKeeper
from training.distribution import WorkerRole, choose_strategy, worker_role
from training.errors import EXIT_DIVERGED, TrainingSetupError
from training.logs import RunLog
from training.optimization import build_optimizer
from training.precision import apply_precision, needs_loss_scaling, resolve_precision
from training.preemption import EXIT_PREEMPTED, PreemptionFlag
from training.steps import UpdateStep

EXIT_OK = 0


@dataclass
class TrainOutcome:
    exit_code: int
    step: int
    precision: str
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    examples_per_second: float = 0.0
    skipped_updates: int = 0  # by this process (restores do not roll the count back)
    restores: int = 0
    weights_sha256: str = ""


def configure_determinism(config: ExperimentConfig) -> None:
    """Seeds everywhere; op determinism when asked (slower, but bit-reproducible)."""
    keras.utils.set_random_seed(config.seed)
    if config.training.deterministic:
        tf.config.experimental.enable_op_determinism()
    # Dropout and friends draw from tf.random.Generator variables, which checkpoints keep.
    keras.backend.experimental.enable_tf_random_generator()


def random_generators(model: keras.Model) -> list[tf.random.Generator]:
    """The generators dropout-like layers draw from: not model variables, so a checkpoint
    must hold them explicitly for a resumed run to draw the same masks."""
    generators = []
    for layer in model.submodules:
        generator = getattr(getattr(layer, "_random_generator", None), "_generator", None)
        if isinstance(generator, tf.random.Generator):
            generators.append(generator)
    return generators


def weights_digest(model: keras.Model) -> str:
    """SHA-256 over every weight's bytes: equal digests mean bit-identical models."""
    digest = hashlib.sha256()
    for weight in model.weights:
        digest.update(weight.name.encode())
        digest.update(weight.numpy().tobytes())
    return digest.hexdigest()


def check_writable(directory: Path) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".write-probe-{time.monotonic_ns()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise TrainingSetupError(
            f"checkpoint.directory: cannot write to {directory}: {exc.strerror or exc}"
        ) from None


class Trainer:
    """Trains one experiment on this worker (of ``role.count``)."""

    def __init__(
        self,
        config: ExperimentConfig,
        *,
        role: WorkerRole | None = None,
        verbose: bool = True,
    ) -> None:
        self.config = config
        self.role = role or worker_role()
        self.verbose = verbose
        training = config.training
        self.manifest = training_data.open_manifest(config)
        self.io = model_io(config, self.manifest)
        if config.data.batch_size % (training.gradient_accumulation * self.role.count):
            raise TrainingSetupError(
                f"data.batch_size: {config.data.batch_size} is not divisible by "
                f"gradient_accumulation x workers = {training.gradient_accumulation * self.role.count}"
            )
        self.global_micro_batch = config.data.batch_size // training.gradient_accumulation
        self.steps_per_epoch = training_data.steps_per_epoch(
            self.manifest, config.data.train_split, config.data.batch_size
        )
        self.total_steps = training.steps or training.epochs * self.steps_per_epoch
        check_writable(config.checkpoint_path)
        self.precision = resolve_precision(training.precision)

    # -- construction --------------------------------------------------------------
    def prepare(self) -> None:
        """Build strategy, data, model, optimizer and checkpoints (no step is taken)."""
        config, training = self.config, self.config.training
        configure_determinism(config)
        apply_precision(self.precision)
        self.strategy = choose_strategy(self.role)
        context = tf.distribute.InputContext(
            num_input_pipelines=self.role.count,
            input_pipeline_id=self.role.index,
            num_replicas_in_sync=self.strategy.num_replicas_in_sync,
        )
        per_worker = self.global_micro_batch // self.role.count
        self.dataset = training_data.training_dataset(
            config, self.io, micro_batch=per_worker, input_context=context
        )
        with self.strategy.scope():
            self.model = build_model(config.model, self.io.inputs, self.io.heads)
            self.lr_scale = tf.Variable(1.0, trainable=False, dtype=tf.float32, name="lr_scale")
            self.optimizer, self.schedule = build_optimizer(
                training.optimizer,
                training.schedule,
                self.total_steps,
                self.lr_scale,
                loss_scaling=needs_loss_scaling(self.precision),
            )
            self.optimizer.build(self.model.trainable_variables)
            self.epoch = tf.Variable(0, trainable=False, dtype=tf.int64, name="epoch")
        compiled = compile_args(self.io.heads)
        self.update_step = UpdateStep(
            self.strategy,
            self.model,
            self.optimizer,
            compiled["loss"],
            compiled["loss_weights"],
            global_micro_batch=self.global_micro_batch,
            accumulation=training.gradient_accumulation,
            loss_only_finiteness=needs_loss_scaling(self.precision),
        )
        self.iterator = iter(self.dataset)
        self.keeper = CheckpointKeeper(
            config.checkpoint_path,
            tf.train.Checkpoint(
                model=self.model,
                optimizer=self.optimizer,
                epoch=self.epoch,
                lr_scale=self.lr_scale,
                random=random_generators(self.model),
            ),
            keep=config.checkpoint.keep,
            keep_every_hours=config.checkpoint.keep_every_hours,
            every_steps=config.checkpoint.every_steps,
            every_seconds=config.checkpoint.every_seconds,
            is_chief=self.role.is_chief,
            worker_index=self.role.index,
            strategy=self.strategy,
        )
        # Each worker reads its own part of the data, so each keeps its own position.
        self.input_keeper = CheckpointKeeper(
            config.checkpoint_path / "input" / f"worker-{self.role.index}",
            tf.train.Checkpoint(iterator=self.iterator),
            # One more than the main checkpoints: it is saved first, so a kill right after
            # it must still leave the position of the previous committed step.
            keep=config.checkpoint.keep + 1,
            keep_every_hours=config.checkpoint.keep_every_hours,
        )
        self._execution = self._compile_execution()
        # Traced once per run, not once per evaluation.
        self._predict = tf.function(lambda features: self.model(features, training=False))

    def _compile_execution(self) -> Any:
        update = self.update_step.update
        schedule = self.schedule

        @tf.function
        def execute(iterator: Any, num_updates: tf.Tensor, stop: tf.Tensor) -> Any:
            loss = tf.constant(0.0)
            norm = tf.constant(0.0)
            any_stop = tf.constant(0.0)
            for _ in tf.range(num_updates):
                loss, norm, any_stop = update(iterator, stop)
            return loss, norm, any_stop, schedule(self.optimizer.iterations)

        return execute

    # -- checkpoints -----------------------------------------------------------------
    @property
    def step(self) -> int:
        return int(self.optimizer.iterations.numpy())

    def _save(self, log: RunLog, *, force: bool = False) -> None:
        step = self.step
        if force or self.keeper.should_save(step):
            # The input position goes first: the main checkpoint's commit marker is what
            # makes step ``step`` resumable, so its input position must already be on disk
            # whenever that marker exists (a kill between the two leaves the previous step).
            self.input_keeper.save(step)
            self.keeper.save(step)

    def _restore(self, log: RunLog) -> int | None:
        step = self.keeper.restore_latest()
        if step is None:
            return None
        if self.input_keeper.restore(step) is None:
            log.event(step, "no saved input position for this worker; reading from the start")
        return step

    # -- the loop --------------------------------------------------------------------
    def run(self) -> TrainOutcome:
        self.prepare()
        config = self.config
        log = RunLog(
            config.run_path, self.total_steps, is_chief=self.role.is_chief, verbose=self.verbose
        )
        flag = PreemptionFlag().install()
        restores = 0
        try:
            resumed = self._restore(log)
            if resumed is not None:
                log.event(resumed, f"resumed from checkpoint at step {resumed}")
            per_execution = config.training.steps_per_execution
            examples_seen, busy = 0, 0.0
            while self.step < self.total_steps:
                count = min(per_execution, self.total_steps - self.step)
                started = time.perf_counter()
                loss, norm, stop, rate = self._execution(
                    self.iterator, tf.constant(count), tf.constant(float(flag.requested))
                )
                loss, norm, stop, rate = float(loss), float(norm), float(stop), float(rate)
                busy += time.perf_counter() - started
                examples_seen += count * config.data.batch_size
                step = self.step
                self.epoch.assign(step // self.steps_per_epoch)
                log.heartbeat(step)
                values = {
                    "loss": loss,
                    "gradient_norm": norm,
                    "learning_rate": rate,
                    "examples_per_second": examples_seen / max(busy, 1e-9),
                }
                log.scalars(step, values)
                log.progress(step, {"loss": loss})
                if stop > 0:
                    self._save(log, force=True)
                    log.event(step, f"preempted ({flag.signal_name or 'peer'}); checkpoint saved")
                    return self._outcome(EXIT_PREEMPTED, examples_seen, busy, restores)
                if not self._finite_enough(log):
                    restores += 1
                    if restores > config.training.nonfinite.max_restores:
                        log.event(step, "loss keeps diverging; giving up")
                        return self._outcome(EXIT_DIVERGED, examples_seen, busy, restores)
                    continue
                self._save(log)
                if (
                    config.training.eval_every_steps
                    and step % config.training.eval_every_steps == 0
                ):
                    self._log_evaluation(log, config.data.eval_split)
            self._save(log, force=True)
            outcome = self._outcome(EXIT_OK, examples_seen, busy, restores)
            outcome.weights_sha256 = weights_digest(self.model)
            outcome.metrics = self._final_metrics(log)
            return outcome
        finally:
            flag.uninstall()
            log.close()

    def _finite_enough(self, log: RunLog) -> bool:
        """After too many non-finite updates in a row, go back to the last checkpoint.

        Weights and optimizer return to the checkpoint, but the input keeps moving
        forward, so the batches that diverged are not replayed (as large-scale training
        does after a loss spike), and the learning rate is lowered.
        """
        state = self.update_step.state
        policy = self.config.training.nonfinite
        consecutive = int(state.consecutive_nonfinite.numpy())
        if consecutive == 0:
            return True
        log.event(self.step, f"non-finite loss: update skipped ({consecutive} in a row)")
        if consecutive < policy.max_consecutive:
            return True
        scale = float(self.lr_scale.numpy()) * policy.learning_rate_factor
        restored = self.keeper.restore_latest()
        self.lr_scale.assign(scale)
        state.consecutive_nonfinite.assign(0)
        where = f"checkpoint {restored}" if restored is not None else "no checkpoint yet"
        log.event(
            self.step,
            f"{consecutive} non-finite updates in a row: restored {where}; learning rate "
            f"now {scale:g} x schedule",
        )
        return False

    def _outcome(self, code: int, examples: int, busy: float, restores: int) -> TrainOutcome:
        return TrainOutcome(
            exit_code=code,
            step=self.step,
            precision=self.precision,
            examples_per_second=examples / max(busy, 1e-9),
            skipped_updates=int(self.update_step.state.skipped_updates.numpy()),
            restores=restores,
        )

    # -- evaluation ------------------------------------------------------------------
    def evaluate(self, split: str) -> dict[str, float]:
        """Loss and metrics of the current weights on one split.

        Every worker runs the same ordered pass: reading batch-norm statistics (kept per
        replica) averages them across workers, a collective all of them must join.
        """
        compiled = compile_args(self.io.heads)
        losses = compiled["loss"]
        weights = compiled["loss_weights"]
        metrics = {name: list(items) for name, items in compiled["metrics"].items()}
        total, count = 0.0, 0
        dataset = training_data.evaluation_dataset(
            self.config, self.io, split, self.config.data.batch_size
        )
        for features, labels in dataset:
            outputs = self._predict(features)
            batch = int(next(iter(labels.values())).shape[0])
            batch_loss = sum(
                float(loss(labels[name], outputs[name])) * weights[name]
                for name, loss in losses.items()
            )
            total += batch_loss * batch
            count += batch
            for name, items in metrics.items():
                for metric in items:
                    metric.update_state(labels[name], outputs[name])
        results = {"loss": total / max(count, 1), "examples": float(count)}
        for name, items in metrics.items():
            for metric in items:
                results[f"{name}_{metric.name}"] = float(metric.result())
        return results

    def _log_evaluation(self, log: RunLog, split: str | None) -> dict[str, float]:
        if split is None:
            return {}
        results = self.evaluate(split)
        log.scalars(self.step, results, kind=split)
        return results

    def _final_metrics(self, log: RunLog) -> dict[str, dict[str, float]]:
        metrics = {}
        for split in (self.config.data.eval_split, self.config.data.test_split):
            if split is not None:
                metrics[split] = self._log_evaluation(log, split)
        return metrics


def train(config: ExperimentConfig, *, verbose: bool = True) -> tuple[Trainer, TrainOutcome]:
    trainer = Trainer(config, verbose=verbose)
    return trainer, trainer.run()


def model_path(config: ExperimentConfig) -> Path:
    return config.resolve(config.export.model_root) / (config.export.model_name or config.name)
