"""conform_model: any tf_keras model is fitted to the dataset's names, or told what differs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from research.models import HeadSpec, InputSpec
from research.models.interface import conform_model
from research.models.registry import build_model
from research.models.specs import ModelInterfaceError
from tests.support.keras_checks import (
    assert_config_round_trip,
    assert_saved_model_round_trip,
    predict,
    train,
)

IMAGE = {"image": InputSpec(kind="image", shape=(8, 8, 1))}
DIGIT = {"digit": HeadSpec(kind="classification", num_classes=10)}
TWO_INPUTS = {
    "pixels": InputSpec(shape=(4,)),
    "colour": InputSpec(kind="categorical", vocab_size=3),
}
TWO_HEADS = {
    "species": HeadSpec(kind="classification", num_classes=3),
    "weight": HeadSpec(kind="regression", units=2),
}


@keras.saving.register_keras_serializable(package="tests")
class Scale(keras.layers.Layer):
    """A custom layer with a weight and a constructor argument."""

    def __init__(self, initial: float = 1.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.initial = initial

    def build(self, input_shape: tf.TensorShape) -> None:
        self.scale = self.add_weight(
            name="scale", shape=(), initializer=keras.initializers.Constant(self.initial)
        )

    def call(self, x: tf.Tensor) -> tf.Tensor:
        return x * tf.cast(self.scale, x.dtype)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "initial": self.initial}


class DigitNet(keras.Model):
    """A subclassed model reading the features dict, with a custom layer inside."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.flatten = keras.layers.Flatten()
        self.scale = Scale(0.5)
        self.hidden = keras.layers.Dense(16, activation="relu")
        self.classes = keras.layers.Dense(10, activation="softmax")

    def call(self, features: dict[str, tf.Tensor], training: bool | None = None) -> tf.Tensor:
        return self.classes(self.hidden(self.scale(self.flatten(features["image"]))))


class TwoHeadNet(keras.Model):
    """A subclassed model returning a list of outputs, in the order of the heads it got."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.embed = keras.layers.Embedding(3, 4)
        self.trunk = keras.layers.Dense(8, activation="relu")
        self.species = keras.layers.Dense(3, activation="softmax")
        self.weight = keras.layers.Dense(2)

    def call(self, features: dict[str, tf.Tensor]) -> list[tf.Tensor]:
        x = tf.concat([features["pixels"], self.embed(features["colour"])], axis=-1)
        x = self.trunk(x)
        return [self.species(x), self.weight(x)]


def _digits(n: int = 32) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return (
        {"image": rng.random((n, 8, 8, 1), dtype=np.float32)},
        {"digit": rng.integers(0, 10, size=n)},
    )


def _two_head_data(n: int = 32) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    return (
        {"pixels": rng.random((n, 4), dtype=np.float32), "colour": rng.integers(0, 3, size=n)},
        {"species": rng.integers(0, 3, size=n), "weight": rng.random((n, 2), dtype=np.float32)},
    )


def _assert_conforms(model: keras.Model, inputs: dict, heads: dict) -> None:
    """Named inputs with the dataset's dtypes, float32 outputs keyed by head."""
    assert sorted(model.input) == sorted(inputs)
    for name, tensor in model.input.items():
        assert tensor.dtype.name == inputs[name].dtype
    assert list(model.output) == list(heads)
    assert all(tensor.dtype == tf.float32 for tensor in model.output.values())


# -- models that already conform ---------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "inputs", "heads"),
    [
        ({"type": "mlp", "hidden_units": [8]}, TWO_INPUTS, TWO_HEADS),
        ({"type": "cnn", "stem_filters": 4, "stages": [4]}, IMAGE, DIGIT),
        (
            {"type": "transformer", "num_layers": 1, "d_model": 8, "ff_dim": 8},
            {"text": InputSpec(kind="tokens", shape=(6,), vocab_size=9)},
            DIGIT,
        ),
        (
            {"type": "gpt", "num_layers": 1, "d_model": 8, "ff_dim": 8},
            {"text": InputSpec(kind="tokens", shape=(6,), vocab_size=9)},
            {"next": HeadSpec(kind="language_model")},
        ),
        (
            {"type": "multitask", "trunk": {"type": "mlp", "hidden_units": [8]}},
            TWO_INPUTS,
            TWO_HEADS,
        ),
    ],
)
def test_zoo_models_are_returned_unchanged(config: dict, inputs: dict, heads: dict) -> None:
    model = build_model(config, inputs, heads)
    assert conform_model(model, inputs, heads, source="zoo") is model


def test_conforming_functional_model_is_returned_unchanged() -> None:
    image = keras.Input((8, 8, 1), name="image")
    x = Scale(2.0)(keras.layers.Flatten()(image))
    digit = keras.layers.Dense(10, activation="softmax", name="digit")(x)
    model = keras.Model({"image": image}, {"digit": digit})
    assert conform_model(model, IMAGE, DIGIT, source="functional") is model


def test_zoo_model_under_mixed_precision_is_returned_unchanged() -> None:
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = build_model({"type": "cnn", "stem_filters": 4, "stages": [4]}, IMAGE, DIGIT)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert conform_model(model, IMAGE, DIGIT, source="zoo") is model


# -- models that are wrapped -------------------------------------------------------------


def test_subclassed_model_with_custom_layer_is_wrapped_saved_and_trained(tmp_path) -> None:
    keras.utils.set_random_seed(0)
    model = conform_model(DigitNet(name="digit_net"), IMAGE, DIGIT, source="subclassed")
    _assert_conforms(model, IMAGE, DIGIT)
    assert model.name == "digit_net"
    features, labels = _digits()
    first, last = train(model, DIGIT, features, labels, epochs=3)
    assert np.isfinite(last) and last < first
    assert_saved_model_round_trip(model, features, tmp_path)


def test_sequential_model_reads_the_single_feature(tmp_path) -> None:
    keras.utils.set_random_seed(0)
    sequential = keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Flatten(),
            Scale(0.5),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model = conform_model(sequential, IMAGE, DIGIT, source="sequential")
    _assert_conforms(model, IMAGE, DIGIT)
    features, labels = _digits()
    train(model, DIGIT, features, labels, epochs=1)
    assert_config_round_trip(model, features)
    assert_saved_model_round_trip(model, features, tmp_path)


def test_sequential_model_without_input_shape_is_built_on_the_feature() -> None:
    sequential = keras.Sequential(
        [keras.layers.Flatten(), keras.layers.Dense(10, activation="softmax")]
    )
    model = conform_model(sequential, IMAGE, DIGIT, source="sequential")
    _assert_conforms(model, IMAGE, DIGIT)
    assert predict(model, _digits(2)[0])["digit"].shape == (2, 10)


def test_list_outputs_map_to_heads_by_layer_name() -> None:
    pixels = keras.Input((4,), name="pixels")
    colour = keras.Input((), dtype="int64", name="colour")
    x = keras.layers.Concatenate()([pixels, keras.layers.Embedding(3, 2)(colour)])
    weight = keras.layers.Dense(2, name="weight")(x)
    species = keras.layers.Dense(3, activation="softmax", name="species")(x)
    functional = keras.Model([pixels, colour], [weight, species])
    model = conform_model(functional, TWO_INPUTS, TWO_HEADS, source="functional")
    _assert_conforms(model, TWO_INPUTS, TWO_HEADS)
    outputs = predict(model, _two_head_data(2)[0])
    assert outputs["species"].shape == (2, 3) and outputs["weight"].shape == (2, 2)


def test_subclassed_list_outputs_map_to_heads_in_order(tmp_path) -> None:
    keras.utils.set_random_seed(0)
    model = conform_model(TwoHeadNet(), TWO_INPUTS, TWO_HEADS, source="subclassed")
    _assert_conforms(model, TWO_INPUTS, TWO_HEADS)
    features, labels = _two_head_data()
    first, last = train(model, TWO_HEADS, features, labels, epochs=3)
    assert last < first
    assert_saved_model_round_trip(model, features, tmp_path)


def test_mixed_precision_outputs_are_cast_to_float32() -> None:
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        image = keras.Input((8, 8, 1), name="image")
        x = keras.layers.Dense(10, activation="softmax")(keras.layers.Flatten()(image))
        functional = keras.Model({"image": image}, {"digit": x})
        assert functional.output["digit"].dtype == tf.float16
        model = conform_model(functional, IMAGE, DIGIT, source="mixed")
        subclassed = conform_model(DigitNet(), IMAGE, DIGIT, source="mixed")
    finally:
        keras.mixed_precision.set_global_policy("float32")
    for conformed in (model, subclassed):
        _assert_conforms(conformed, IMAGE, DIGIT)
        assert predict(conformed, _digits(2)[0])["digit"].dtype == np.float32


# -- what does not fit -------------------------------------------------------------------


def _message(model: Any, inputs: dict, heads: dict) -> str:
    with pytest.raises(ModelInterfaceError) as caught:
        conform_model(model, inputs, heads, source="my_models:build")
    message = str(caught.value)
    assert message.startswith("my_models:build: ")
    return message


def _functional(inputs: dict[str, Any], outputs: Any) -> keras.Model:
    return keras.Model(inputs, outputs)


def test_keras_3_model_is_refused_with_the_fix() -> None:
    keras3 = pytest.importorskip("keras")
    if not keras3.__version__.startswith("3."):
        pytest.skip("the installed keras package is not Keras 3")
    model = keras3.Sequential([keras3.Input((4,)), keras3.layers.Dense(2)])
    message = _message(model, IMAGE, DIGIT)
    assert "Keras 3" in message and "import tf_keras as keras" in message
    assert "Received: keras.src.models.sequential.Sequential" in message


@pytest.mark.parametrize(
    ("model", "received"),
    [
        ("not a model", "builtins.str"),
        (keras.layers.Dense(3), "tf_keras.src.layers.core.dense.Dense"),
    ],
)
def test_non_model_is_refused(model: Any, received: str) -> None:
    assert _message(model, IMAGE, DIGIT).endswith(
        f"expected a tf_keras Model. Received: {received}"
    )


def test_input_names_list_both_sides() -> None:
    pixels = keras.Input((4,), name="pixels")
    color = keras.Input((), dtype="int64", name="color")
    x = keras.layers.Concatenate()([pixels, keras.layers.Embedding(3, 2)(color)])
    species = keras.layers.Dense(3, activation="softmax")(x)
    weight = keras.layers.Dense(2)(x)
    model = _functional({"pixels": pixels, "color": color}, {"species": species, "weight": weight})
    message = _message(model, TWO_INPUTS, TWO_HEADS)
    assert "Features the model lacks: ['colour']; model inputs that are no feature: ['color']" in (
        message
    )
    assert "Received: model inputs ['color', 'pixels'], dataset features ['colour', 'pixels']" in (
        message
    )


def test_input_dtype_differs() -> None:
    inputs = {"text": InputSpec(kind="tokens", shape=(6,), vocab_size=9)}
    text = keras.Input((6,), dtype="int32", name="text")
    x = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(9, 4)(text))
    model = _functional(text, keras.layers.Dense(10, activation="softmax")(x))
    assert _message(model, inputs, DIGIT).endswith(
        "input 'text' (tokens) must have dtype int64, the dtype the dataset delivers and "
        "clients send. Received: dtype=int32"
    )


def test_input_shape_differs() -> None:
    image = keras.Input((8, 8), name="image")
    model = _functional(
        image, keras.layers.Dense(10, activation="softmax")(keras.layers.Flatten()(image))
    )
    assert _message(model, IMAGE, DIGIT).endswith(
        "input 'image' (image) must have shape [batch, 8, 8, 1]. Received: shape=[batch, 8, 8]"
    )


def test_missing_and_extra_outputs_list_both_sides() -> None:
    pixels = keras.Input((4,), name="pixels")
    colour = keras.Input((), dtype="int64", name="colour")
    x = keras.layers.Concatenate()([pixels, keras.layers.Embedding(3, 2)(colour)])
    outputs = {"species": keras.layers.Dense(3, activation="softmax")(x), "mass": x}
    model = _functional({"pixels": pixels, "colour": colour}, outputs)
    assert _message(model, TWO_INPUTS, TWO_HEADS).endswith(
        "the model's outputs must be keyed by the dataset's heads. Heads without an output: "
        "['weight']; outputs that are no head: ['mass']. "
        "Received: outputs ['species', 'mass'], heads ['species', 'weight']"
    )


def test_output_count_differs_from_heads() -> None:
    pixels = keras.Input((4,), name="pixels")
    colour = keras.Input((), dtype="int64", name="colour")
    x = keras.layers.Concatenate()([pixels, keras.layers.Embedding(3, 2)(colour)])
    model = _functional([pixels, colour], [keras.layers.Dense(3)(x)] * 3)
    assert _message(model, TWO_INPUTS, TWO_HEADS).endswith(
        "the model returns 3 output(s) for 2 head(s): return a dict keyed by head name. "
        "Received: 3 output(s), heads ['species', 'weight']"
    )


@pytest.mark.parametrize(
    ("heads", "units", "expected"),
    [
        (
            DIGIT,
            8,
            "output 'digit' (classification head) must have shape [batch, 10] (class "
            "probabilities, num_classes=10). Received: shape=[batch, 8]",
        ),
        (
            {"size": HeadSpec(kind="regression")},
            None,
            "output 'size' (regression head) must have shape [batch, 1] (units=1). "
            "Received: shape=[batch]",
        ),
    ],
)
def test_output_shape_differs(heads: dict, units: int | None, expected: str) -> None:
    image = keras.Input((8, 8, 1), name="image")
    x = keras.layers.Flatten()(image)
    output = keras.layers.Dense(units)(x) if units else keras.layers.Flatten()(x)[:, 0]
    assert _message(_functional(image, output), IMAGE, heads).endswith(expected)


def test_language_model_output_needs_the_vocabulary() -> None:
    inputs = {"text": InputSpec(kind="tokens", shape=(6,), vocab_size=9)}
    text = keras.Input((6,), dtype="int64", name="text")
    logits = keras.layers.Dense(7)(keras.layers.Embedding(9, 4)(text))
    heads = {"next": HeadSpec(kind="language_model")}
    assert _message(_functional(text, logits), inputs, heads).endswith(
        "output 'next' (language_model head) must have shape [batch, 6, 9] (next-token "
        "logits over input 'text', vocab_size=9). Received: shape=[batch, 6, 7]"
    )


def test_integer_output_is_refused() -> None:
    image = keras.Input((8, 8, 1), name="image")
    x = keras.layers.Dense(10)(keras.layers.Flatten()(image))
    classes = keras.layers.Lambda(lambda t: tf.argmax(t, axis=-1))(x)
    assert _message(_functional(image, classes), IMAGE, DIGIT).endswith(
        "output 'digit' (classification head) must be floating point (probabilities, "
        "values or logits). Received: dtype=int64"
    )


def test_subclassed_model_that_fails_on_the_features_says_what_it_was_given() -> None:
    class ReadsATensor(keras.Model):
        def __init__(self) -> None:
            super().__init__()
            self.dense = keras.layers.Dense(10)

        def call(self, x: tf.Tensor) -> tf.Tensor:
            return self.dense(keras.layers.Flatten()(x))

    message = _message(ReadsATensor(), IMAGE, DIGIT)
    assert message.startswith(
        "my_models:build: calling the model on the dataset's features failed (a model without "
        "keras.Input layers is called with a dict keyed by feature name). "
        "Received: {'image': 'float32 [batch, 8, 8, 1]'}\nAttributeError: "
    )


def test_model_named_like_a_head_is_refused() -> None:
    message = _message(DigitNet(name="digit"), IMAGE, DIGIT)
    assert message.endswith("rename the model. Received: name='digit'")
