"""What a model is built around: its named inputs and its named outputs (heads).

A model's input names are the dataset's feature names and its output names are the
label names, so a ``(features, labels)`` batch from the input pipeline feeds ``fit``
unchanged and the exported ``serving_default`` signature speaks the dataset's words.
These specs are plain config objects (no TensorFlow import) so they can be written in
an experiment file or derived from a dataset manifest.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import FiniteFloat, NonNegativeFloat, PositiveFloat, PositiveInt, model_validator

from contracts.features import FeatureSpec
from contracts.yaml_config import StrictModel

# Keras layer names become SavedModel signature keys and TF name scopes, which reject '/'.
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.\-]*$")
_ID_KINDS = ("categorical", "tokens")


class ModelInterfaceError(ValueError):
    """A model does not fit its dataset's inputs and heads; the message says what differs.

    Defined beside the specs, free of TensorFlow, so a command line can name it as a user
    error without loading TensorFlow.
    """


class InputSpec(StrictModel):
    """One named model input.

    ``kind`` says how the model treats the tensor:
    - ``numeric``: a value or vector of numbers;
    - ``image``: ``(height, width[, channels])`` pixel values, already scaled by the reader;
    - ``categorical``: one integer id per example in ``[0, vocab_size)``; id 0 is a real
      category (the first vocabulary entry), not padding;
    - ``tokens``: a sequence of token ids in ``[0, vocab_size)``, where id 0 is padding.

    Numbers are always read as float32: an integer feature is cast by Keras as it enters
    the model, so no cast layer sits in the graph for the compression tools to trip on.
    """

    kind: Literal["numeric", "image", "categorical", "tokens"] = "numeric"
    shape: tuple[PositiveInt | None, ...] = ()
    dtype: Literal["float32", "int32", "int64"] = "float32"
    vocab_size: PositiveInt | None = None

    @model_validator(mode="before")
    @classmethod
    def _ids_default_to_int64(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and data.get("kind") in _ID_KINDS and "dtype" not in data:
            return {**data, "dtype": "int64"}
        return data

    @model_validator(mode="after")
    def _check_kind(self) -> InputSpec:
        if self.kind in _ID_KINDS:
            if self.vocab_size is None:
                raise ValueError(f"vocab_size: required for {self.kind} inputs")
            if self.dtype == "float32":
                raise ValueError(f"dtype: {self.kind} inputs hold integer ids, got float32")
        else:
            if self.vocab_size is not None:
                raise ValueError(
                    f"vocab_size: only categorical and tokens inputs have one, not {self.kind}"
                )
            if self.dtype != "float32":
                raise ValueError(
                    f"dtype: {self.kind} inputs are read as float32 (integer features are "
                    f"cast on the way in), got {self.dtype}"
                )
        if self.kind == "tokens" and len(self.shape) != 1:
            raise ValueError(f"shape: tokens inputs are 1-D sequences, got {list(self.shape)}")
        if self.kind == "categorical" and self.shape not in ((), (1,)):
            raise ValueError(f"shape: categorical inputs hold one id, got {list(self.shape)}")
        if self.kind == "image" and len(self.shape) not in (2, 3):
            raise ValueError(
                f"shape: images are (height, width[, channels]), got {list(self.shape)}"
            )
        if self.kind != "tokens" and None in self.shape:
            raise ValueError(
                f"shape: only tokens inputs may have an unknown length, got {list(self.shape)}"
            )
        return self


class HeadSpec(StrictModel):
    """One named model output and how much its loss counts.

    ``classification`` heads output class probabilities (softmax) over ``num_classes``;
    ``regression`` heads output ``units`` values in the label's own units; a
    ``language_model`` head outputs next-token logits over the vocabulary of the model's
    tokens input.

    A regression head learns in standard units and rescales by ``target_mean`` and
    ``target_std`` (the training split's, from the manifest): a target around 150 with a
    spread of 80 is then as quick to fit as one around 0, with any optimizer's defaults.
    """

    kind: Literal["classification", "regression", "language_model"]
    num_classes: PositiveInt | None = None
    units: PositiveInt = 1
    loss_weight: NonNegativeFloat = 1.0
    target_mean: FiniteFloat = 0.0
    target_std: PositiveFloat = 1.0

    @model_validator(mode="after")
    def _check_kind(self) -> HeadSpec:
        if self.kind == "classification" and (self.num_classes is None or self.num_classes < 2):
            raise ValueError("num_classes: classification heads need at least 2 classes")
        if self.kind != "classification" and self.num_classes is not None:
            raise ValueError(f"num_classes: only classification heads have one, not {self.kind}")
        if self.kind != "regression" and self.units != 1:
            raise ValueError(f"units: only regression heads set units, not {self.kind}")
        if self.kind != "regression" and (self.target_mean, self.target_std) != (0.0, 1.0):
            raise ValueError(
                f"target_mean, target_std: only regression heads rescale, not {self.kind}"
            )
        return self


def check_names(inputs: Mapping[str, InputSpec], heads: Mapping[str, HeadSpec]) -> None:
    """Refuse names Keras or a serving signature cannot carry, before any layer is made.

    A ModelInterfaceError (a user error) whose message starts with the field at fault:
    ``inputs``, ``heads`` or ``inputs.<name>`` / ``heads.<name>``.
    """
    if not inputs:
        raise ModelInterfaceError("inputs: a model needs at least one input")
    if not heads:
        raise ModelInterfaceError("heads: a model needs at least one head")
    for field, names in (("inputs", inputs), ("heads", heads)):
        for name in names:
            if not _NAME.match(name):
                raise ModelInterfaceError(
                    f"{field}.{name}: {name!r} cannot name a model input or output (a "
                    "serving signature key): start with a letter, then letters, digits, "
                    "'_', '.', '-'"
                )
    shared = sorted(set(inputs) & set(heads))
    if shared:
        raise ModelInterfaceError(f"heads: names used for both an input and a head: {shared}")


def input_spec_from_feature(
    feature: FeatureSpec, *, sequence_length: int | None = None
) -> InputSpec:
    """The model input for one manifest feature, as the input pipeline delivers it.

    Categorical ids run to ``len(vocabulary)`` inclusive (the out-of-vocabulary id), and a
    text feature arrives as its token ids padded to ``sequence_length`` (``None``: ragged
    batches padded per batch), or, read as words, as a numeric vector: its TF-IDF bag.
    """
    if feature.type == "numeric":
        return InputSpec(kind="numeric", shape=feature.shape)
    if feature.type == "categorical":
        return InputSpec(kind="categorical", vocab_size=len(feature.vocabulary) + 1)
    if feature.type == "text" and feature.reads_words:
        return InputSpec(kind="numeric", shape=(feature.words_size,))
    if feature.type == "text":
        if feature.vocab_size is None:
            raise ValueError(f"text feature {feature.name!r} has no vocab_size in the manifest")
        return InputSpec(kind="tokens", shape=(sequence_length,), vocab_size=feature.vocab_size)
    if feature.type == "image":
        shape = (feature.height, feature.width, feature.channels or 1)
        return InputSpec(kind="image", shape=shape)
    raise ValueError(f"feature {feature.name!r}: unknown type {feature.type!r}")


def head_spec_from_feature(
    feature: FeatureSpec,
    *,
    loss_weight: float = 1.0,
    num_classes: int | None = None,
    statistics: Mapping[str, Any] | None = None,
) -> HeadSpec:
    """The model head predicting one manifest label.

    A categorical label is a classification over its vocabulary; a numeric label is a
    regression unless ``num_classes`` says its integer values are class ids. A regression
    head rescales by the label's training ``statistics`` (the manifest's ``mean`` and
    ``std``) when they are known and finite.
    """
    if feature.type == "categorical":
        classes = num_classes or len(feature.vocabulary)
        if classes < 2:
            raise ValueError(
                f"label {feature.name!r} has {classes} class(es) in the dataset; a "
                "classification needs at least 2 (was the dataset built from no records?)"
            )
        return HeadSpec(kind="classification", num_classes=classes, loss_weight=loss_weight)
    if feature.type == "numeric":
        if num_classes is not None:
            return HeadSpec(kind="classification", num_classes=num_classes, loss_weight=loss_weight)
        mean, std = _target_scale(statistics or {})
        return HeadSpec(
            kind="regression",
            units=feature.num_values,
            loss_weight=loss_weight,
            target_mean=mean,
            target_std=std,
        )
    raise ValueError(f"label {feature.name!r}: a {feature.type} feature cannot be a label")


def _target_scale(statistics: Mapping[str, Any]) -> tuple[float, float]:
    """``(mean, std)`` of a label from its statistics; ``(0, 1)`` where either is unusable
    (missing, not finite, or a constant label's zero spread)."""
    mean, std = statistics.get("mean"), statistics.get("std")
    if not (isinstance(mean, int | float) and math.isfinite(mean)):
        return 0.0, 1.0
    if not (isinstance(std, int | float) and math.isfinite(std) and std > 0):
        return float(mean), 1.0
    return float(mean), float(std)
