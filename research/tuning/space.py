"""Search spaces: which keys of an experiment a search varies, over which values.

A space file names experiment keys by their dotted path and gives each a distribution::

    tuner: {type: random, max_trials: 8, objective: val_loss}
    parameters:
      training.optimizer.learning_rate: {type: log_uniform, min: 1.0e-4, max: 1.0e-2}
      model.stages: {type: choice, values: [[16, 32], [32, 64]]}

A sampled set of values is written into the experiment's own YAML mapping and the result
is validated as an :class:`ExperimentConfig`, so a search can only ever train
experiments that ``slipway train`` would accept. :meth:`SearchSpace.check` does that for
each parameter's extreme values before any trial runs, so a misspelt path or an
impossible range fails at once, naming the space file, line and parameter.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationInfo,
    field_validator,
)

from contracts.yaml_config import ConfigError, StrictModel, load_yaml_model, parse_model
from research.experiments.config import ExperimentConfig
from research.models.config_types import tagged_union

_PATH = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")


def _above_min(value: float, info: ValidationInfo) -> float:
    low = info.data.get("min")
    if low is not None and value <= low:
        raise ValueError(f"must be above min ({low})")
    return value


class LogUniform(StrictModel):
    """A positive float whose logarithm is uniform: learning rates, weight decay."""

    type: Literal["log_uniform"] = "log_uniform"
    min: PositiveFloat
    max: PositiveFloat

    _max_above_min = field_validator("max")(_above_min)

    def declare(self, hp: Any, name: str) -> float:
        return float(hp.Float(name, self.min, self.max, sampling="log"))

    def extremes(self) -> list[Any]:
        return [self.min, self.max]

    def decode(self, raw: Any) -> float:
        return float(raw)


class Uniform(StrictModel):
    """A float drawn uniformly from ``[min, max]``: dropout rates, ratios."""

    type: Literal["uniform"] = "uniform"
    min: float
    max: float

    _max_above_min = field_validator("max")(_above_min)

    def declare(self, hp: Any, name: str) -> float:
        return float(hp.Float(name, self.min, self.max))

    def extremes(self) -> list[Any]:
        return [self.min, self.max]

    def decode(self, raw: Any) -> float:
        return float(raw)


class IntRange(StrictModel):
    """An integer ``min, min + step, ...`` up to ``max``: widths, depths, batch sizes."""

    type: Literal["int"] = "int"
    min: int
    max: int
    step: PositiveInt = 1

    _max_above_min = field_validator("max")(_above_min)

    def declare(self, hp: Any, name: str) -> int:
        return int(hp.Int(name, self.min, self.max, step=self.step))

    def extremes(self) -> list[Any]:
        return [self.min, self.min + (self.max - self.min) // self.step * self.step]

    def decode(self, raw: Any) -> int:
        return int(raw)


class Choice(StrictModel):
    """One of ``values``, which may be lists or mappings (``stages: [[16, 32], [32, 64]]``).

    keras-tuner's ``Choice`` holds scalars of one type only, so the tuner chooses among
    the *indices* of ``values`` (unordered) and :meth:`decode` maps an index back to its
    value; results, tables and ``best.yaml`` always show the value itself.
    """

    type: Literal["choice"] = "choice"
    values: list[Any] = Field(min_length=1)

    def declare(self, hp: Any, name: str) -> Any:
        return self.decode(hp.Choice(name, list(range(len(self.values))), ordered=False))

    def extremes(self) -> list[Any]:
        return list(self.values)

    def decode(self, raw: Any) -> Any:
        return copy.deepcopy(self.values[int(raw)])


Parameter = LogUniform | Uniform | IntRange | Choice
TunerType = Literal["random", "bayesian", "hyperband"]


class TunerSettings(StrictModel):
    """How the search runs.

    ``max_trials`` bounds every tuner (Hyperband stops at its own schedule's end if that
    comes first). ``max_epochs`` is each random/bayesian trial's length and Hyperband's
    longest (its shorter trials stop early in a run of that length), and what the best
    experiment trains for; by default the experiment's ``training.epochs``. ``factor`` is Hyperband's
    reduction factor, ``initial_points`` the random trials a Bayesian search starts with
    (keras-tuner's default: three per parameter). ``direction`` defaults to ``max`` for
    accuracies and ``min`` otherwise; ``seed`` to the experiment's seed.
    """

    type: TunerType = "random"
    max_trials: PositiveInt = 10
    executions_per_trial: PositiveInt = 1
    max_epochs: PositiveInt | None = None
    factor: int = Field(default=3, ge=2)
    initial_points: PositiveInt | None = None
    objective: str = "val_loss"
    direction: Literal["min", "max"] | None = None
    seed: NonNegativeInt | None = None


class _SpaceFile(StrictModel):
    tuner: TunerSettings = Field(default_factory=TunerSettings)
    parameters: dict[str, tagged_union(LogUniform, Uniform, IntRange, Choice)] = Field(min_length=1)


def set_path(data: Mapping[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A deep copy of ``data`` with ``path`` (dotted keys) set to ``value``.

    Missing mappings on the way are created (``training.optimizer`` need not be in the
    file to tune its learning rate); a non-mapping on the way is a ValueError.
    """
    result = copy.deepcopy(dict(data))
    node = result
    keys = path.split(".")
    for depth, key in enumerate(keys[:-1]):
        child = node.setdefault(key, {})
        if child is None:
            child = node[key] = {}
        if not isinstance(child, dict):
            prefix = ".".join(keys[: depth + 1])
            raise ValueError(f"{prefix} is {type(child).__name__} {child!r}, not a mapping")
        node = child
    node[keys[-1]] = copy.deepcopy(value)
    return result


def experiment_with(
    raw: Mapping[str, Any], values: Mapping[str, Any], *, base_dir: str | Path, source: str
) -> ExperimentConfig:
    """The experiment ``raw`` (its YAML mapping) with ``values`` applied, validated.

    ``source`` prefixes any ConfigError (and the experiment's later ones); ``base_dir``
    is where the experiment's relative paths are resolved from (its own directory).
    """
    data: Mapping[str, Any] = raw
    for path, value in values.items():
        try:
            data = set_path(data, path, value)
        except ValueError as exc:
            raise ConfigError(f"{source}: {path}: {exc}") from None
    config = parse_model(dict(data), ExperimentConfig, source=source)
    return config.model_copy(update={"base_dir": str(base_dir), "source": source})


def _key_lines(text: str) -> dict[tuple[str, str], int]:
    """1-based lines of the keys one level inside each top-level section."""
    lines: dict[tuple[str, str], int] = {}
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    if not isinstance(root, yaml.MappingNode):
        return lines
    for section, body in root.value:
        lines[(section.value, "")] = section.start_mark.line + 1
        if isinstance(body, yaml.MappingNode):
            for key, _ in body.value:
                lines[(section.value, key.value)] = key.start_mark.line + 1
    return lines


@dataclass(frozen=True)
class SearchSpace:
    """A validated space file, remembering where each key is for error messages."""

    tuner: TunerSettings
    parameters: dict[str, Parameter]
    source: str
    lines: Mapping[tuple[str, str], int]

    def where(self, section: str, key: str = "") -> str:
        """``file:line`` of a key (or of its section when the key is not in the file)."""
        line = self.lines.get((section, key)) or self.lines.get((section, ""))
        return f"{self.source}:{line}" if line else self.source

    def declare(self, hp: Any) -> dict[str, Any]:
        """Register every parameter with ``hp`` and return the values it holds, decoded."""
        return {path: parameter.declare(hp, path) for path, parameter in self.parameters.items()}

    def decode(self, raw_values: Mapping[str, Any]) -> dict[str, Any]:
        """The parameter values of a keras-tuner trial (``hp.values``), decoded."""
        return {
            path: parameter.decode(raw_values[path])
            for path, parameter in self.parameters.items()
            if path in raw_values
        }

    def check(self, raw: Mapping[str, Any], *, base_dir: str | Path) -> None:
        """Apply each parameter's extreme values, one at a time, to the experiment.

        A ConfigError names this file, the parameter's line and its path, followed by
        what the experiment schema says about the value.
        """
        for path, parameter in self.parameters.items():
            for value in parameter.extremes():
                source = f"{self.where('parameters', path)}: parameters.{path} = {value!r}"
                experiment_with(raw, {path: value}, base_dir=base_dir, source=source)

    def fingerprint(self) -> str:
        """SHA-256 of everything that decides which trials run, except ``max_trials``.

        A search stored under one fingerprint is resumed only by the same space, and
        raising ``max_trials`` extends it rather than starting over.
        """
        canonical = json.dumps(
            {
                "tuner": self.tuner.model_dump(mode="json", exclude={"max_trials"}),
                "parameters": {
                    path: parameter.model_dump(mode="json")
                    for path, parameter in sorted(self.parameters.items())
                },
            },
            sort_keys=True,
            separators=(",", ":"),
        )
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def load_space(path: str | Path) -> SearchSpace:
    """Read a space file; a ConfigError names the file, line and key."""
    path = Path(path)
    parsed = load_yaml_model(path, _SpaceFile)
    space = SearchSpace(
        tuner=parsed.tuner,
        parameters=dict(parsed.parameters),
        source=str(path),
        lines=_key_lines(path.read_text(encoding="utf-8")),
    )
    for name in space.parameters:
        if not _PATH.match(name):
            raise ConfigError(
                f"{space.where('parameters', name)}: parameters.{name}: not a dotted key path "
                "of the experiment (e.g. training.optimizer.learning_rate)"
            )
    return space
