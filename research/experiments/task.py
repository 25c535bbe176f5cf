"""The experiment Task: *what* is trained — the model, the batches it reads, its losses
and metrics — built from one experiment config and its dataset.

As in the Model Garden's ``base_task.Task``, a Task knows nothing of loops, steps,
devices or files: ``training`` runs it. ``slipway train``, every trial of
``slipway tune`` and a researcher's own script all build this same Task, so a
configuration trains the same way whichever of them runs it.

A researcher's own model plugs in as a function of the dataset's named inputs and
heads::

    def build(inputs: dict[str, InputSpec], heads: dict[str, HeadSpec]) -> keras.Model:
        ...

    task = ExperimentTask(load_experiment("experiment.yaml"), model_fn=build)

Without ``model_fn`` the experiment's ``model`` section is built by the zoo. Either way
the model is then conformed to the dataset (input and output names, dtypes, shapes),
so a model that would not fit fails here, naming what differs, rather than in the
middle of a run or at export.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import tensorflow as tf
import tf_keras as keras

from contracts.dataset_manifest import Manifest
from contracts.yaml_config import ConfigError, located
from research.data.input_pipeline import ImageAugmentation, Verify, make_dataset
from research.experiments.config import ExperimentConfig
from research.experiments.model_io import ModelIO, model_io, open_manifest
from research.models.configs import ModelConfig, without_recompute
from research.models.endpoints import compile_args
from research.models.gpt import next_token_pairs
from research.models.interface import conform_model
from research.models.placement import is_placed
from research.models.recompute import has_recomputation
from research.models.registry import build_model
from research.models.specs import HeadSpec, InputSpec, ModelInterfaceError
from research.models.weights import copy_weights, trained_on_mesh
from research.preprocessing.preprocessor import FeaturePreprocessor

ModelFn = Callable[[dict[str, InputSpec], dict[str, HeadSpec]], keras.Model]


class ExperimentTask:
    """One experiment on its dataset: builds its model, inputs, losses and metrics.

    Construction reads only the dataset manifest, so a mismatch between experiment and
    dataset is a ConfigError before any model exists. ``model_fn`` replaces the
    experiment's ``model`` section (which may then be left out). ``verify`` is how far
    training reads check the shards against the manifest (``size`` when the caller
    verified their SHA-256 already; evaluation reads always check sizes).
    """

    def __init__(
        self,
        config: ExperimentConfig,
        *,
        model_fn: ModelFn | None = None,
        verify: Verify = "sha256",
    ) -> None:
        if config.model is None and model_fn is None:
            raise ConfigError(
                f"{config.source}: model: required key is missing (a script may pass "
                "model_fn to ExperimentTask instead)"
            )
        self.config = config
        self.model_fn = model_fn
        self.manifest: Manifest = open_manifest(config)
        self.io: ModelIO = model_io(config, self.manifest)
        self.verify = verify

    # -- the interface -----------------------------------------------------------------
    @property
    def inputs(self) -> dict[str, InputSpec]:
        return self.io.inputs

    @property
    def heads(self) -> dict[str, HeadSpec]:
        return self.io.heads

    @property
    def steps_per_epoch(self) -> int:
        """Updates per pass over the train split (the last batch of a pass may wrap)."""
        records = self.manifest.splits[self.config.data.train_split].num_records
        return max(1, math.ceil(records / self.config.data.batch_size))

    @property
    def total_steps(self) -> int:
        """The run's length in updates: ``training.steps``, else epochs of the train split."""
        training = self.config.training
        return training.steps or training.epochs * self.steps_per_epoch

    @property
    def model_fn_name(self) -> str | None:
        """``module:function`` of ``model_fn`` (None for the experiment's own model)."""
        if self.model_fn is None:
            return None
        name = getattr(self.model_fn, "__qualname__", type(self.model_fn).__qualname__)
        return f"{getattr(self.model_fn, '__module__', '?')}:{name}"

    # -- what is built -----------------------------------------------------------------
    def build_model(self) -> keras.Model:
        """The experiment's model, conformed to the dataset's names, dtypes and shapes."""
        if self.model_fn is not None:
            model = self.model_fn(dict(self.inputs), dict(self.heads))
            return conform_model(
                model, self.inputs, self.heads, source=f"model_fn {self.model_fn_name}"
            )
        assert self.config.model is not None  # the config requires it without model_fn
        return self._build_zoo_model(self.config.model)

    def _build_zoo_model(self, model_config: ModelConfig) -> keras.Model:
        config = self.config
        try:
            model = build_model(
                model_config,
                self.inputs,
                self.heads,
                base_dir=config.base_dir,
                source=config.source,
            )
        except (ConfigError, ModelInterfaceError):  # they name their file and key already
            raise
        except ValueError as exc:  # a family refusing the inputs or sizes it was given
            raise ConfigError(located(_under_model(str(exc)), config.source)) from None
        return conform_model(model, self.inputs, self.heads, source=f"{config.source}: model")

    def serving_model(self, trained: keras.Model) -> keras.Model:
        """What is published of ``trained``: the model itself, or, when the zoo built its
        blocks recomputed or in pipeline stages, or its weights sharded over a device
        mesh, the plain architecture on one device holding the same weights, so that the
        artifact, the gateway and compression (which rewrites each Dense) never meet a
        way of taking gradients, a mesh or a training machine's devices."""
        on_mesh = trained_on_mesh(trained)
        if not (on_mesh or has_recomputation(trained) or is_placed(trained)):
            return trained
        if self.model_fn is not None:
            if not on_mesh:
                return trained  # a researcher's own recomputation is theirs to keep
            plain = self.build_model()
        else:
            assert self.config.model is not None
            plain = self._build_zoo_model(without_recompute(self.config.model))
        copy_weights(trained, plain)
        return plain

    def build_inputs(
        self,
        split: str,
        *,
        batch_size: int,
        training: bool = False,
        input_context: tf.distribute.InputContext | None = None,
        start_batch: int = 0,
        verify: Verify | None = None,
    ) -> tf.data.Dataset:
        """Batches of ``(features, {head: labels})`` from ``split``.

        ``training``: the endless, shuffled and augmented stream in full batches of
        ``batch_size`` (per replica), beginning at batch ``start_batch`` of the whole
        stream; with ``input_context`` only the batches of that pipeline's replicas, each
        global batch split across every replica (see ``make_dataset``'s
        ``split_global_batches``), its shards checked as far as ``verify`` says (default:
        the task's ``verify``). Otherwise one ordered pass, split the same way with
        ``input_context``, its last global batch completed by padding records that
        follow the split's ``num_records``. A language model gets next-token pairs of
        its text input: ``sequence_length`` tokens and the same shifted by one.
        """
        data = self.config.data
        options: dict[str, Any] = {
            "verify": "size",
            "shuffle": False,
            "input_context": input_context,
            "split_global_batches": input_context is not None,
        }
        if training:
            augment = None
            if data.augment is not None:
                augment = ImageAugmentation(
                    flip=data.augment.flip,
                    crop_padding=data.augment.crop_padding,
                    brightness_delta=data.augment.brightness,
                )
            options = {
                "verify": self.verify if verify is None else verify,
                "shuffle": True,
                "seed": self.config.seed,
                "repeat": True,
                "cache": data.cache,
                "shuffle_buffer": data.shuffle_buffer,
                "input_context": input_context,
                "split_global_batches": input_context is not None,
                "start_batch": start_batch,
                "augment": augment,
                "token_dropout": data.token_dropout,
                "drop_remainder": True,
            }
        length = data.sequence_length
        if self.io.language_model and length is not None:
            length += 1  # the model's context and, for its last position, the next token
        dataset = make_dataset(
            self.config.resolve(data.dataset),
            split,
            batch_size=batch_size,
            sequence_length=length,
            features=[self.io.lm_input] if self.io.language_model else list(self.inputs),
            **options,
        )
        return dataset.map(as_head_labels(self.io), num_parallel_calls=tf.data.AUTOTUNE)

    def build_preprocessor(self) -> FeaturePreprocessor:
        """The model inputs' in-graph preprocessing, as the input pipeline runs it: the
        exported serving graph runs it on the raw features clients send."""
        lengths = {
            name: spec.shape[0] for name, spec in self.inputs.items() if spec.kind == "tokens"
        }
        return FeaturePreprocessor.for_inputs(
            self.manifest,
            self.inputs,
            dataset_dir=self.config.resolve(self.config.data.dataset),
            sequence_lengths=lengths,
        )

    def build_losses(self) -> dict[str, keras.losses.Loss]:
        """Each head's loss (batch mean), keyed by head; weigh them by ``loss_weights``."""
        return compile_args(self.heads)["loss"]

    @property
    def loss_weights(self) -> dict[str, float]:
        return {name: head.loss_weight for name, head in self.heads.items()}

    def build_metrics(self) -> dict[str, list[keras.metrics.Metric]]:
        """Fresh metrics per head (accuracy for classification, MAE for regression)."""
        return compile_args(self.heads)["metrics"]


def as_head_labels(io: ModelIO) -> Callable[..., Any]:
    """Batch elements -> ``(features, {head: labels})``; next-token pairs for a language model."""
    heads = list(io.heads)
    first_input = next(iter(io.inputs))

    def convert(features: Mapping[str, tf.Tensor], labels: Any = None) -> Any:
        if io.language_model:
            inputs, targets = next_token_pairs(features[first_input])
            return {first_input: inputs}, {heads[0]: targets}
        if not isinstance(labels, Mapping):
            labels = {heads[0]: labels}
        return features, {name: labels[name] for name in heads}

    return convert


def _under_model(message: str) -> str:
    """A model family's refusal as a key of the experiment: ``max_length: …`` is
    ``model.max_length: …``, and one naming no key (``transformer models read exactly one
    input``) is pinned on ``model.type``, the line that chose the family."""
    key, colon, rest = message.partition(": ")
    if colon and key.isidentifier():
        return f"model.{key}: {rest}"
    return f"model.type: {message}"
