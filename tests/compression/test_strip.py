"""What makes a deployed int8 flatbuffer small: stripping, per-tensor weights, static shapes.

Stripping must change the bytes and nothing a client or the interpreter sees: the same
signatures and names, bit-identical outputs. Per-tensor conversion must leave one scale
per weight tensor; layer-norm detection must take the whole norm and no residual add;
and the zoo's Transformer blocks must convert without runtime-computed shapes.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras
from ai_edge_litert.interpreter import Interpreter
from ai_edge_litert.tools import flatbuffer_utils

from compression.convert import to_tflite
from compression.strip import strip_for_serving
from compression.tflite_graph import Graph, layer_norm_tensors
from research.models.attention import block_stack
from research.models.configs import TransformerShape

ALIGNMENT = 16


@pytest.fixture(scope="module")
def conv_model() -> keras.Model:
    keras.utils.set_random_seed(0)
    image = keras.Input((8, 8, 1), name="image")
    x = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(image)
    x = keras.layers.Conv2D(16, 3, strides=2, activation="relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(image, keras.layers.Dense(4, activation="softmax", name="label")(x))


def calibration() -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [{"image": rng.random((1, 8, 8, 1), dtype=np.float32)} for _ in range(16)]


def int8(model: keras.Model, per_tensor: bool = False) -> bytes:
    samples = calibration()
    return to_tflite(
        model,
        optimizations=[tf.lite.Optimize.DEFAULT],
        representative_dataset=lambda: iter(samples),
        integer_only=True,
        per_tensor=per_tensor,
    )


def run(flatbuffer: bytes, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return Interpreter(model_content=flatbuffer).get_signature_runner("serving_default")(**batch)


def io_details(flatbuffer: bytes) -> dict[str, list]:
    runner = Interpreter(model_content=flatbuffer).get_signature_runner("serving_default")
    return {
        side: [(key, detail["name"], tuple(detail["shape_signature"])) for key, detail in details]
        for side, details in (
            ("inputs", sorted(runner.get_input_details().items())),
            ("outputs", sorted(runner.get_output_details().items())),
        )
    }


def test_stripping_keeps_signatures_and_outputs_bit_for_bit(conv_model: keras.Model) -> None:
    batch = {"image": np.random.default_rng(1).random((5, 8, 8, 1), dtype=np.float32)}
    for flatbuffer in (to_tflite(conv_model), int8(conv_model)):
        stripped = strip_for_serving(flatbuffer)
        assert len(stripped) < len(flatbuffer)
        assert (
            Interpreter(model_content=stripped).get_signature_list()
            == Interpreter(model_content=flatbuffer).get_signature_list()
        )
        assert io_details(stripped) == io_details(flatbuffer)
        expected, got = run(flatbuffer, batch), run(stripped, batch)
        assert sorted(got) == sorted(expected) == ["label"]
        np.testing.assert_array_equal(got["label"], expected["label"])


def test_stripped_model_has_no_names_ranges_or_metadata_and_aligned_weights(
    conv_model: keras.Model,
) -> None:
    stripped = strip_for_serving(int8(conv_model))
    model = flatbuffer_utils.read_model_from_bytearray(bytearray(stripped))
    assert model.description is None and not model.metadata
    (signature,) = model.signatureDefs
    kept = {entry.tensorIndex for entry in signature.inputs + signature.outputs}
    (subgraph,) = model.subgraphs
    for index, tensor in enumerate(subgraph.tensors):
        assert (tensor.name is not None) == (index in kept)
        if tensor.quantization is not None:
            assert tensor.quantization.min is None and tensor.quantization.max is None
    assert _misaligned_buffers(stripped) == 0


def _misaligned_buffers(flatbuffer: bytes) -> int:
    from ai_edge_litert import schema_py_generated as schema

    model = schema.Model.GetRootAs(flatbuffer, 0)
    misaligned = 0
    for index in range(model.BuffersLength()):
        buffer = model.Buffers(index)
        if buffer.DataLength():
            start = buffer._tab.Vector(buffer._tab.Offset(4))  # the data field's bytes
            misaligned += start % ALIGNMENT != 0
    return misaligned


def test_per_tensor_conversion_has_one_scale_per_weight_tensor(conv_model: keras.Model) -> None:
    def scale_counts(flatbuffer: bytes) -> list[int]:
        interpreter = Interpreter(model_content=flatbuffer)
        return [
            len(detail["quantization_parameters"]["scales"])
            for detail in interpreter.get_tensor_details()
        ]

    assert max(scale_counts(int8(conv_model))) > 1  # per output channel by default
    per_tensor = int8(conv_model, per_tensor=True)
    assert max(scale_counts(per_tensor)) == 1
    assert len(strip_for_serving(per_tensor)) < len(strip_for_serving(int8(conv_model)))


def test_layer_norm_tensors_are_the_whole_norm_and_not_the_residual() -> None:
    x = keras.Input((6, 8), name="x")
    # The zoo's epsilon: Keras computes such a norm from moments rather than fusing it.
    normed = keras.layers.LayerNormalization(epsilon=1e-6, name="norm")(x)
    h = keras.layers.Dense(8, name="proj")(normed)
    model = keras.Model(x, keras.layers.Add(name="residual")([x, h]))
    names = layer_norm_tensors(to_tflite(model))
    # Two MEANs, SQUARED_DIFFERENCE, RSQRT; add epsilon, three MULs, SUB, add the shift.
    assert len(names) == 10
    assert all("/norm/" in name for name in names)
    assert not any("residual" in name or "StatefulPartitionedCall" in name for name in names)


def test_transformer_blocks_convert_with_static_shapes_and_a_free_batch() -> None:
    keras.utils.set_random_seed(0)
    tokens = keras.Input((12, 16), name="tokens")
    mask = keras.Input((12, 12), dtype="bool", name="mask")
    shape = TransformerShape(num_layers=1, d_model=16, num_heads=2, ff_dim=32, dropout=0.0)
    model = keras.Model([tokens, mask], block_stack(tokens, mask, shape, "encoder"))
    flatbuffer = to_tflite(model)
    ops = {op.name for op in Graph.read(flatbuffer).ops}
    assert not ops & {"SHAPE", "REDUCE_PROD", "PACK"}
    rng = np.random.default_rng(0)
    for batch in (1, 3):
        feed = {
            "tokens": rng.random((batch, 12, 16), dtype=np.float32),
            "mask": np.ones((batch, 12, 12), dtype=bool),
        }
        (got,) = run(flatbuffer, feed).values()
        expected = model(feed, training=False).numpy()
        np.testing.assert_allclose(got, expected, atol=1e-4)
