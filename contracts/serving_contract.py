"""What clients of a model rely on: the names, dtypes and shapes of its signature.

Every version of a model (float, pruned, int8, fp16, distilled, or a SavedModel
published from elsewhere) must keep its stable version's contract: a canary that drops
an output such as ``<head>_classes``, or renames an input, breaks every client the
moment it receives traffic. Publishers compare before they publish and name each
difference; a deliberate change is allowed explicitly.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from contracts.model_manifest import CLASSES_SUFFIX, read_model_manifest
from contracts.model_repository import existing_versions

# The flag of ``slipway publish`` and ``slipway compress`` that publishes a changed contract.
OVERRIDE_FLAG = "--allow-contract-change"


class ContractChangeError(ValueError):
    """A version would not answer clients as the model's stable version does."""


def class_name_outputs(labels: Mapping[str, Any]) -> dict[str, list[str]]:
    """``<head>_classes`` -> the head's class names in score order, for each
    classification head that ``slipway.json``'s ``labels`` describe."""
    return {
        f"{head}{CLASSES_SUFFIX}": [str(name) for name in label["classes"]]
        for head, label in labels.items()
        if isinstance(label, Mapping)
        and label.get("kind") == "classification"
        and label.get("classes")
    }


def with_class_name_outputs(
    signature: Mapping[str, Any], labels: Mapping[str, Any]
) -> dict[str, Any]:
    """``signature`` with the ``<head>_classes`` outputs a SavedModel export has, added for
    each classification head whose scores it outputs (a TFLite core holds no strings)."""
    outputs = dict(signature.get("outputs") or {})
    for name, classes in class_name_outputs(labels).items():
        if name.removesuffix(CLASSES_SUFFIX) in outputs and name not in outputs:
            outputs[name] = {"dtype": "string", "shape": [-1, len(classes)]}
    return {**signature, "outputs": outputs}


def contract_differences(stable: Mapping[str, Any], candidate: Mapping[str, Any]) -> list[str]:
    """Each way ``candidate``'s signature differs from ``stable``'s, as ``slipway.json``
    describes them (``inputs`` and ``outputs``: name -> dtype and shape); [] if none."""
    differences = []
    for side in ("inputs", "outputs"):
        old, new = stable.get(side) or {}, candidate.get(side) or {}
        noun = side[:-1]
        differences += [f"{noun} {name!r} is missing" for name in sorted(set(old) - set(new))]
        differences += [f"{noun} {name!r} is new" for name in sorted(set(new) - set(old))]
        for name in sorted(set(old) & set(new)):
            for field in ("dtype", "shape"):
                if old[name].get(field) != new[name].get(field):
                    differences.append(
                        f"{noun} {name!r} {field} {old[name].get(field)} -> {new[name].get(field)}"
                    )
    return differences


def check_contract(
    stable: Mapping[str, Any], candidate: Mapping[str, Any], *, against: str, override: str
) -> None:
    """Refuse ``candidate`` if its contract differs from ``stable``'s, naming every
    difference, the version compared ``against`` and the ``override`` that allows it."""
    differences = contract_differences(stable, candidate)
    if differences:
        raise ContractChangeError(
            f"the serving contract differs from {against}: {'; '.join(differences)} "
            f"(clients of that version would break; {override} publishes it anyway)"
        )


def latest_signature(model_root: str | Path, model_name: str) -> tuple[int, dict[str, Any]] | None:
    """The newest published version of ``model_name`` and its signature, if there is one."""
    directory = Path(model_root) / model_name
    versions = existing_versions(directory)[::-1]
    for version in versions:
        manifest = read_model_manifest(directory / str(version))
        if manifest is not None and "signature" in manifest:
            return version, dict(manifest["signature"])
    return None
