"""Classify and Regress answers, read from the outputs of an ordinary signature.

A version need not export TensorFlow Serving's classification or regression signatures:
the gateway runs the requested signature and reads the answer from its outputs. The
output is found by TensorFlow Serving's name for it (``scores``, ``outputs``), else by
the ``kind`` that ``slipway.json`` gives it under ``labels``, else by its shape; class
names come from a ``classes`` output, else from ``slipway.json``; without either a class
has a score and no label, as TF Serving answers a signature without a ``classes`` output.
An output that does not fit is ``FailedPrecondition``: the model, not the request, is wrong.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from tensorflow_serving.apis import classification_pb2, regression_pb2

from contracts.model_manifest import CLASSES_SUFFIX
from serving.errors import FailedPrecondition

# Output names TF Serving's classify / regress signatures use.
SCORES_OUTPUT, CLASSES_OUTPUT, REGRESS_OUTPUT = "scores", "classes", "outputs"


def _manifest_classes(manifest: Mapping[str, Any] | None, output: str) -> list[str] | None:
    labels = (manifest or {}).get("labels")
    entry = labels.get(output) if isinstance(labels, Mapping) else None
    classes = entry.get("classes") if isinstance(entry, Mapping) else None
    if isinstance(classes, list) and all(isinstance(name, str) for name in classes):
        return classes
    return None


def _labelled_output(
    outputs: Mapping[str, np.ndarray], manifest: Mapping[str, Any] | None, kind: str
) -> str | None:
    labels = (manifest or {}).get("labels")
    if not isinstance(labels, Mapping):
        return None
    found = [
        name
        for name, entry in labels.items()
        if name in outputs and isinstance(entry, Mapping) and entry.get("kind") == kind
    ]
    return found[0] if len(found) == 1 else None


def _pick_output(
    outputs: Mapping[str, np.ndarray],
    manifest: Mapping[str, Any] | None,
    preferred: str,
    kind: str,
    fits: Callable[[np.ndarray], bool],
) -> str:
    """The output a classify/regress call reads: TF Serving's name for it, else the one
    slipway.json labels with ``kind``, else the only output whose shape ``fits``."""
    if preferred in outputs:
        return preferred
    if len(outputs) == 1:
        return next(iter(outputs))
    labelled = _labelled_output(outputs, manifest, kind)
    if labelled is not None:
        return labelled
    fitting = [name for name, array in outputs.items() if fits(np.asarray(array))]
    if len(fitting) == 1:
        return fitting[0]
    raise FailedPrecondition(
        f"cannot tell which of the outputs ({', '.join(outputs)}) holds the {kind} result: "
        f"name it {preferred!r} or label it {kind!r} in slipway.json"
    )


def _names_output(scores: str, outputs: Mapping[str, np.ndarray]) -> str | None:
    """The output with the class names of output ``scores``: ``<scores>_classes`` as
    Slipway exports them, else TF Serving's ``classes``."""
    for name in (f"{scores}{CLASSES_SUFFIX}", CLASSES_OUTPUT):
        if name in outputs:
            return name
    return None


def _holds_names(name: str, outputs: Mapping[str, np.ndarray]) -> bool:
    """Whether output ``name`` is the class names of another output."""
    if name == CLASSES_OUTPUT:
        return True
    scores = name.removesuffix(CLASSES_SUFFIX)
    return scores != name and scores in outputs


def _is_scores(array: np.ndarray) -> bool:
    return array.ndim == 2 and array.shape[1] > 1 and array.dtype.kind == "f"


def _is_one_value(array: np.ndarray) -> bool:
    return (
        array.ndim == 1 or (array.ndim == 2 and array.shape[1] == 1)
    ) and array.dtype.kind in "fiu"


def _class_scores(
    outputs: Mapping[str, np.ndarray], manifest: Mapping[str, Any] | None, examples: int | None
) -> tuple[np.ndarray, list[list[str]]]:
    """The scores [rows, classes] of the classification output and each row's class names.

    Class names come from a ``classes`` output, else slipway.json's
    ``labels.<output>.classes``, else none at all (empty labels: TF Serving's classifier
    sets only the score when the signature has no ``classes`` output). ``examples``
    (when known) is the number of rows the answer must have.
    """
    candidates = {k: v for k, v in outputs.items() if not _holds_names(k, outputs)}
    name = _pick_output(candidates, manifest, SCORES_OUTPUT, "classification", _is_scores)
    scores = np.asarray(outputs[name])
    if scores.ndim == 0:
        # A scalar answer (a model whose input is a scalar) has no rows to classify.
        raise FailedPrecondition(
            f"output {name!r} is a scalar; classification needs scores per example"
        )
    if scores.ndim == 1:
        scores = scores[:, None]
    rows = scores.shape[0] if examples is None else examples
    if scores.ndim != 2 or scores.shape[0] != rows or scores.dtype.kind not in "fiu":
        raise FailedPrecondition(
            f"output {name!r} has shape {list(scores.shape)} ({scores.dtype}); classification "
            f"needs numeric scores of shape [{rows}, classes]"
        )
    count = scores.shape[1]
    names_output = _names_output(name, outputs)
    if names_output is not None and np.shape(outputs[names_output]) == scores.shape:
        names = [
            [
                item.decode("utf-8", "replace") if isinstance(item, bytes) else str(item)
                for item in row
            ]
            for row in np.asarray(outputs[names_output]).tolist()
        ]
    else:
        listed = _manifest_classes(manifest, name)
        if listed is None or len(listed) != count:
            listed = [""] * count
        names = [listed] * rows
    return scores, names


def classes_from_outputs(
    outputs: Mapping[str, np.ndarray], manifest: Mapping[str, Any] | None, examples: int
) -> list[list[tuple[str, float]]]:
    """Per example, every class with its score, in the model's class order."""
    scores, names = _class_scores(outputs, manifest, examples)
    return [
        list(zip(labels, (float(score) for score in row), strict=True))
        for labels, row in zip(names, scores.tolist(), strict=True)
    ]


def top_classes(
    outputs: Mapping[str, np.ndarray], manifest: Mapping[str, Any] | None
) -> tuple[int, list[tuple[int, str]]]:
    """The number of classes and, per row, the top-1 class served: (index, name).

    ``FailedPrecondition`` when no output holds scores of two classes or more (a single
    column is a regression value, not a class).
    """
    scores, names = _class_scores(outputs, manifest, None)
    if scores.shape[1] < 2:
        raise FailedPrecondition("the classification output has a single column")
    best = scores.argmax(axis=1).tolist()
    # An unnamed class is known by its index here.
    return scores.shape[1], [
        (index, row[index] or str(index)) for index, row in zip(best, names, strict=True)
    ]


def values_from_outputs(
    outputs: Mapping[str, np.ndarray], manifest: Mapping[str, Any] | None, examples: int | None
) -> list[float]:
    """One regression value per row, from an output of shape [rows] or [rows, 1];
    ``examples`` (when known) is the number of rows the answer must have."""
    name = _pick_output(outputs, manifest, REGRESS_OUTPUT, "regression", _is_one_value)
    values = np.asarray(outputs[name])
    if values.ndim == 2 and values.shape[1] == 1:
        values = values[:, 0]
    rows = values.shape[0] if examples is None and values.ndim else examples
    if values.shape != (rows,) or values.dtype.kind not in "fiu":
        raise FailedPrecondition(
            f"output {name!r} has shape {list(np.shape(outputs[name]))}; regression needs one "
            f"number per example ([{rows}] or [{rows}, 1])"
        )
    return [float(value) for value in values.tolist()]


def classification_proto(
    classes: list[list[tuple[str, float]]],
) -> classification_pb2.ClassificationResult:
    """A Classify answer as TF Serving's ``ClassificationResult``."""
    proto = classification_pb2.ClassificationResult()
    for row in classes:
        classifications = proto.classifications.add()
        for label, score in row:
            # An unnamed class has its score only (proto3: an empty label is unset).
            classifications.classes.add(label=label, score=score)
    return proto


def regression_proto(values: list[float]) -> regression_pb2.RegressionResult:
    """A Regress answer as TF Serving's ``RegressionResult``."""
    proto = regression_pb2.RegressionResult()
    for value in values:
        proto.regressions.add(value=value)
    return proto
