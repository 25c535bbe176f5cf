"""The experiment's view of its dataset: the manifest, and the model's named inputs and heads.

Derived from the experiment and the dataset manifest alone, with no TensorFlow import,
so that a mismatch between the two (a split or feature the dataset lacks, a head
without a label) is reported before anything loads. The experiment Task builds everything else
on this interface, so a config that tunes is a config that trains.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError

from contracts.dataset_manifest import DatasetError, Manifest, load_manifest
from contracts.yaml_config import ConfigError
from research.experiments.config import ExperimentConfig
from research.models.specs import (
    HeadSpec,
    InputSpec,
    ModelInterfaceError,
    check_names,
    head_spec_from_feature,
    input_spec_from_feature,
)


@dataclass(frozen=True)
class ModelIO:
    """The named inputs and heads an experiment's model has on its dataset."""

    inputs: dict[str, InputSpec]
    heads: dict[str, HeadSpec]

    @property
    def language_model(self) -> bool:
        return any(head.kind == "language_model" for head in self.heads.values())

    @property
    def lm_input(self) -> str:
        return next(iter(self.inputs))

    @property
    def lm_head(self) -> str:
        return next(iter(self.heads))


def model_io(config: ExperimentConfig, manifest: Manifest) -> ModelIO:
    """Inputs and heads derived from the manifest by the trainer's rules.

    Inputs are ``data.features`` (default: every feature that is not a label); heads are
    the experiment's ``heads`` or one per ``data.labels`` (default: every label),
    weighted by ``training.loss_weights``. A ConfigError names the experiment's source
    and the key.
    """
    source = config.source
    features = manifest.features
    inputs_available = [name for name, spec in features.items() if not spec.is_label]
    wanted = config.data.features or inputs_available
    unknown = [name for name in wanted if name not in inputs_available]
    if unknown:
        raise ConfigError(
            f"{source}: data.features: not input features of the dataset: {unknown} "
            f"(inputs: {inputs_available})"
        )
    try:
        inputs = {
            name: input_spec_from_feature(
                features[name], sequence_length=config.data.sequence_length
            )
            for name in wanted
        }
    except ValueError as exc:
        raise ConfigError(f"{source}: data.dataset: {_reason(exc)}") from None
    if config.heads is not None:
        heads = dict(config.heads)
    else:
        labels = config.data.labels or list(manifest.labels)
        unknown = [name for name in labels if name not in manifest.labels]
        if unknown:
            raise ConfigError(
                f"{source}: data.labels: not labels of the dataset: {unknown} "
                f"(labels: {manifest.labels})"
            )
        weights = config.training.loss_weights
        try:
            heads = {
                name: head_spec_from_feature(
                    features[name],
                    loss_weight=weights.get(name, 1.0),
                    statistics=manifest.feature_statistics(name),
                )
                for name in labels
            }
        except ValueError as exc:
            raise ConfigError(f"{source}: data.labels: {_reason(exc)}") from None
    if not heads:
        raise ConfigError(
            f"{source}: heads: the dataset has no labels; name heads in the experiment"
        )
    try:
        check_names(inputs, heads)
    except ModelInterfaceError as exc:
        # Heads are named in the experiment, inputs by the dataset's features.
        field = "" if str(exc).startswith("heads") else "data.features: "
        raise ConfigError(f"{source}: {field}{exc}") from None
    io = ModelIO(inputs=inputs, heads=heads)
    if io.language_model:
        if [spec.kind for spec in inputs.values()] != ["tokens"]:
            raise ConfigError(
                f"{source}: heads: a language_model head needs exactly one text input "
                "(data.features)"
            )
    else:
        missing = [name for name in heads if name not in manifest.labels]
        if missing:
            raise ConfigError(f"{source}: heads: the dataset has no labels {missing}")
    unknown = sorted(set(config.training.loss_weights) - set(heads))
    if unknown:
        raise ConfigError(f"{source}: training.loss_weights: no such heads: {unknown}")
    return io


def _reason(error: ValueError) -> str:
    """One line for a spec that cannot be made: pydantic's first error, or the message."""
    if isinstance(error, ValidationError):
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        return f"{where}: {first['msg']}" if where else first["msg"]
    return str(error)


def open_manifest(config: ExperimentConfig) -> Manifest:
    """The experiment's dataset manifest, with every split the experiment names checked:
    there, and holding records (training or evaluating on nothing is a mistake)."""
    try:
        manifest = load_manifest(config.resolve(config.data.dataset))
    except DatasetError as exc:
        raise ConfigError(f"{config.source}: data.dataset: {exc}") from None
    for key in ("train_split", "eval_split", "test_split"):
        split = getattr(config.data, key)
        if split is None:
            continue
        if split not in manifest.splits:
            raise ConfigError(
                f"{config.source}: data.{key}: the dataset has no split {split!r} "
                f"(it has {sorted(manifest.splits)})"
            )
        if manifest.splits[split].num_records == 0:
            raise ConfigError(
                f"{config.source}: data.{key}: the dataset's split {split!r} holds no records"
            )
    return manifest
