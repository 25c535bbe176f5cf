"""tf.Examples, as Classify and Regress requests carry them, become a signature's inputs.

TensorFlow Serving's Classify and Regress APIs send ``tf.Example`` protos, not tensors. Each
feature feeds the signature input of the same name, one row per example, reshaped to the
input's shape; a signature that takes the serialized examples themselves (one string
input, no feature of that name) gets them as they came. Every mismatch is the client's to
fix, so each is ``InvalidArgument`` naming the example and the feature.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from tensorflow.core.example.example_pb2 import Example
from tensorflow.core.example.feature_pb2 import Feature

from serving.errors import InvalidArgument
from serving.signature import STRING, Signature, Tensors, TensorSpec


def examples_to_inputs(
    examples: Sequence[Example], context: Example | None, signature: Signature
) -> Tensors:
    """Batch tensors for ``signature`` from tf.Examples, feature name = input name.

    Features of ``context`` apply to every example (an example's own feature wins). A
    signature with one string input and no feature of that name takes the serialized
    examples themselves, as TF Serving's classify/regress signatures do.
    """
    if not examples:
        raise InvalidArgument("input: no examples")
    merged = [_with_context(example, context) for example in examples]
    names = list(signature.inputs)
    if (
        len(names) == 1
        and signature.inputs[names[0]].dtype == STRING
        and not any(names[0] in example.features.feature for example in merged)
    ):
        serialized = np.empty(len(merged), dtype=object)
        serialized[:] = [example.SerializeToString() for example in merged]
        return {names[0]: serialized}
    inputs = {}
    for name, spec in signature.inputs.items():
        rows = []
        for index, example in enumerate(merged):
            features = example.features.feature
            if name not in features:
                raise InvalidArgument(
                    f"example {index}: missing feature {name!r}; signature {signature.name!r} "
                    f"takes {signature.describe_inputs()}"
                )
            rows.append(_feature_to_array(features[name], spec, f"example {index}"))
        try:
            inputs[name] = np.stack(rows)
        except ValueError:
            raise InvalidArgument(
                f"feature {name!r}: examples give it different numbers of values"
            ) from None
    return inputs


def _with_context(example: Example, context: Example | None) -> Example:
    if context is None or not context.features.feature:
        return example
    merged = Example()
    merged.CopyFrom(context)
    for name, feature in example.features.feature.items():
        merged.features.feature[name].CopyFrom(feature)
    return merged


def _feature_to_array(feature: Feature, spec: TensorSpec, where: str) -> np.ndarray:
    """One example's values for ``spec``, shaped like the spec without its batch dim."""
    kind = feature.WhichOneof("kind")
    label = f"{where}: feature {spec.name!r}"
    expected = spec.describe()
    if spec.dtype == STRING:
        if kind not in ("bytes_list", None):
            raise InvalidArgument(f"{label}: expected bytes_list for {expected}, got {kind}")
        values = np.empty(len(feature.bytes_list.value), dtype=object)
        values[:] = list(feature.bytes_list.value)
    elif kind == "float_list":
        if spec.dtype.kind != "f":
            raise InvalidArgument(f"{label}: expected int64_list for {expected}, got float_list")
        values = np.asarray(feature.float_list.value, dtype=spec.dtype)
    elif kind == "int64_list":
        if spec.dtype.kind not in "iuf":
            raise InvalidArgument(f"{label}: expected {spec.dtype_name} values, got int64_list")
        values = np.asarray(feature.int64_list.value, dtype=np.int64)
        if spec.dtype.kind in "iu":
            limits = np.iinfo(spec.dtype)
            if values.size and (values.min() < limits.min or values.max() > limits.max):
                raise InvalidArgument(f"{label}: value out of range for {spec.dtype_name}")
        values = values.astype(spec.dtype)
    elif kind is None:
        values = np.zeros(0, dtype=spec.dtype)
    else:
        raise InvalidArgument(f"{label}: expected values for {expected}, got {kind}")
    inner = None if spec.shape is None else spec.shape[1:]
    if inner is None:
        return values
    known = int(np.prod([d for d in inner if d is not None], dtype=np.int64))
    free = [axis for axis, d in enumerate(inner) if d is None]
    if (not free and values.size != known) or (
        free and (len(free) > 1 or known == 0 or values.size % known)
    ):
        raise InvalidArgument(f"{label}: {values.size} values do not fit {expected}")
    shape = tuple(values.size // known if d is None else d for d in inner)
    return values.reshape(shape)
