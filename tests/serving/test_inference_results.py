"""Classify answers read class names from the model's own ``<head>_classes`` output."""

from __future__ import annotations

import numpy as np

from serving.inference_results import classes_from_outputs, top_classes

SCORES = np.array([[0.1, 0.9], [0.7, 0.3]], np.float32)
NAMES = np.array([[b"benign", b"malignant"]] * 2, object)


def test_the_heads_own_class_names_label_its_scores() -> None:
    outputs = {"diagnosis": SCORES, "diagnosis_classes": NAMES}
    answer = classes_from_outputs(outputs, None, 2)
    assert [[name for name, _ in row] for row in answer] == [["benign", "malignant"]] * 2
    assert answer[0][1][1] == np.float32(0.9)
    assert top_classes(outputs, None) == (2, [(1, "malignant"), (0, "benign")])


def test_the_model_outranks_slipway_json_and_other_heads_keep_theirs() -> None:
    manifest = {
        "labels": {
            "diagnosis": {"kind": "classification", "classes": ["b", "m"]},
            "grade": {"kind": "regression"},
        }
    }
    outputs = {
        "diagnosis": SCORES,
        "diagnosis_classes": NAMES,
        "grade": np.array([[1.5], [2.5]], np.float32),
    }
    answer = classes_from_outputs(outputs, manifest, 2)
    assert [name for name, _ in answer[1]] == ["benign", "malignant"]
    without = {"diagnosis": SCORES, "grade": outputs["grade"]}
    assert [name for name, _ in classes_from_outputs(without, manifest, 2)[0]] == ["b", "m"]
