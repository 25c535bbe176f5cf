"""Every version of a model answers as its stable version does: the differences that
would break clients are named, and class names are kept for cores that hold no strings."""

from __future__ import annotations

import numpy as np

from contracts.serving_contract import (
    class_name_outputs,
    contract_differences,
    with_class_name_outputs,
)
from serving.backends.class_names import ClassNamesBackend
from serving.signature import STRING, Signature, TensorSpec

STABLE = {
    "inputs": {
        "text": {"dtype": "string", "shape": [-1]},
        "age": {"dtype": "float32", "shape": [-1]},
    },
    "outputs": {
        "topic": {"dtype": "float32", "shape": [-1, 3]},
        "topic_classes": {"dtype": "string", "shape": [-1, 3]},
    },
}
LABELS = {
    "topic": {"kind": "classification", "classes": ["billing", "login", "other"]},
    "price": {"kind": "regression"},
}


def test_the_same_contract_in_another_order_has_no_differences() -> None:
    reordered = {
        "outputs": dict(reversed(STABLE["outputs"].items())),
        "inputs": dict(reversed(STABLE["inputs"].items())),
    }
    assert contract_differences(STABLE, reordered) == []


def test_every_difference_is_named() -> None:
    candidate = {
        "inputs": {
            "text": {"dtype": "int64", "shape": [-1]},
            "years": {"dtype": "float32", "shape": [-1]},
        },
        "outputs": {"topic": {"dtype": "float32", "shape": [-1, 4]}},
    }
    assert contract_differences(STABLE, candidate) == [
        "input 'age' is missing",
        "input 'years' is new",
        "input 'text' dtype string -> int64",
        "output 'topic_classes' is missing",
        "output 'topic' shape [-1, 3] -> [-1, 4]",
    ]


def test_a_tflite_core_gets_the_class_name_outputs_its_export_would_have() -> None:
    core = {"inputs": STABLE["inputs"], "outputs": {"topic": STABLE["outputs"]["topic"]}}
    assert class_name_outputs(LABELS) == {"topic_classes": ["billing", "login", "other"]}
    assert contract_differences(STABLE, with_class_name_outputs(core, LABELS)) == []


class Scores:
    """A core answering only scores, as a TFLite classifier does."""

    signatures = {
        "serving_default": Signature(
            "serving_default",
            {"age": TensorSpec("age", np.dtype(np.float32), (-1,))},
            {"topic": TensorSpec("topic", np.dtype(np.float32), (-1, 3))},
        )
    }
    closed = False

    def run(self, signature_name, inputs, timeout=None):  # noqa: ANN001, ANN201
        return {"topic": np.full((len(inputs["age"]), 3), 1 / 3, np.float32)}

    def close(self) -> None:
        self.closed = True


def test_the_gateway_answers_class_names_beside_a_cores_scores() -> None:
    core = Scores()
    backend = ClassNamesBackend(core, class_name_outputs(LABELS))
    outputs = backend.signatures["serving_default"].outputs
    assert sorted(outputs) == ["topic", "topic_classes"]
    assert outputs["topic_classes"].dtype == STRING
    answer = backend.run("serving_default", {"age": np.zeros(4, np.float32)})
    assert answer["topic_classes"].shape == (4, 3)
    assert answer["topic_classes"][2].tolist() == [b"billing", b"login", b"other"]
    backend.close()
    assert core.closed
