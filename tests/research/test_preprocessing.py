"""In-graph preprocessing: each layer on its own, and the served model taking raw features
with exactly what the input pipeline gives the model in training."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras
from PIL import Image

from contracts.dataset_manifest import load_manifest
from contracts.features import FeatureSpec
from research.data.input_pipeline import describe_inputs, make_dataset
from research.preprocessing.categorical import OOV_ID, category_lookup
from research.preprocessing.image import ImageDecoder
from research.preprocessing.numeric import standardizer
from research.preprocessing.preprocessor import FeaturePreprocessor
from tests.support.records import png, write_dataset
from training.export import IMAGE_ARRAYS_SIGNATURE, ExportError, save_serving_model


def encoded(array: np.ndarray, format: str) -> bytes:
    buffer = io.BytesIO()
    image = array[:, :, 0] if array.shape[2] == 1 else array
    Image.fromarray(image.astype(np.uint8)).save(buffer, format=format)
    return buffer.getvalue()


# -- the layers -------------------------------------------------------------------------


def test_standardizer_uses_the_statistics_and_keeps_the_shape() -> None:
    layer = standardizer(FeatureSpec("x", "numeric", shape=(2,)), {"mean": 10.0, "std": 4.0})
    values = layer(tf.constant([[10.0, 18.0], [2.0, 14.0]])).numpy()
    np.testing.assert_allclose(values, [[0.0, 2.0], [-2.0, 1.0]])
    scalars = standardizer(FeatureSpec("y", "numeric"), {"mean": 1.0, "std": 0.5})
    assert scalars(tf.constant([1.0, 2.0, 3.0])).shape == (3,)


def test_nan_standardizes_to_the_mean_as_a_missing_training_value_does() -> None:
    layer = standardizer(FeatureSpec("x", "numeric", shape=(2,)), {"mean": 10.0, "std": 4.0})
    values = layer(tf.constant([[float("nan"), 18.0], [2.0, float("nan")]])).numpy()
    np.testing.assert_allclose(values, [[0.0, 2.0], [-2.0, 0.0]])


def test_a_clipped_log_feature_is_read_as_its_spec_says_and_standardized_as_read() -> None:
    spec = FeatureSpec("income", "numeric", clip=(-5.0, 1e6), transform="log")
    layer = standardizer(spec, {"mean": 5e5, "std": 1e6, "as_read": {"mean": 2.0, "std": 4.0}})
    raw = [0.0, 9.0, -3.0, -80.0, 1e7, 4.2e4]
    values = layer(tf.constant(raw + [float("nan")])).numpy()
    expected = [(spec.as_model_reads(v) - 2.0) / 4.0 for v in raw] + [0.0]
    np.testing.assert_allclose(values, expected, rtol=1e-6)
    rebuilt = type(layer).from_config(layer.get_config())
    np.testing.assert_array_equal(rebuilt(tf.constant(raw)).numpy(), values[:-1])


@pytest.mark.parametrize("stats", [{}, {"mean": 3.0, "std": 0.0}, {"mean": None, "std": None}])
def test_a_constant_or_unmeasured_feature_is_never_divided_by_zero(stats: dict) -> None:
    layer = standardizer(FeatureSpec("x", "numeric", dtype="int64"), stats)
    values = layer(tf.constant([3, 5], tf.int64)).numpy()
    assert values.dtype == np.float32 and np.isfinite(values).all()
    np.testing.assert_allclose(values, np.array([3.0, 5.0]) - (stats.get("mean") or 0.0))


def test_categories_get_ids_from_one_and_unknown_values_the_oov_id() -> None:
    layer = category_lookup(FeatureSpec("c", "categorical", vocabulary=("red", "[UNK]", "")))
    ids = layer(tf.constant(["red", "[UNK]", "", "purple"])).numpy().tolist()
    assert ids == [1, 2, 3, OOV_ID]
    empty = category_lookup(FeatureSpec("c", "categorical"))
    assert empty(tf.constant(["a", "b"])).numpy().tolist() == [OOV_ID, OOV_ID]


def test_images_of_the_models_size_decode_exactly() -> None:
    rng = np.random.default_rng(3)
    images = rng.integers(0, 256, (3, 6, 5, 3), dtype=np.uint8)
    decoded = ImageDecoder(6, 5, 3)(tf.constant([png(image) for image in images])).numpy()
    np.testing.assert_array_equal(decoded, images * np.float32(1.0 / 255.0))


def test_other_formats_sizes_and_channels_are_converted() -> None:
    rng = np.random.default_rng(4)
    big = rng.integers(0, 256, (24, 20, 3), dtype=np.uint8)
    grey = rng.integers(0, 256, (6, 5, 1), dtype=np.uint8)
    decoder = ImageDecoder(6, 5, 3)
    decoded = decoder(tf.constant([encoded(big, "JPEG"), png(grey), b""])).numpy()
    assert decoded.shape == (3, 6, 5, 3)
    assert decoded.min() >= 0.0 and decoded.max() <= 1.0
    # shrunk 4x: each pixel is about the mean of its 4x4 block (JPEG and antialiasing blur)
    blocks = big.reshape(6, 4, 5, 4, 3).mean(axis=(1, 3)) / 255.0
    assert np.abs(decoded[0] - blocks).mean() < 0.08
    np.testing.assert_array_equal(decoded[1], np.repeat(grey, 3, axis=2) * np.float32(1.0 / 255.0))
    assert not decoded[2].any()  # a missing image is black


def test_statistics_come_from_the_train_split_else_the_largest(tmp_path: Path) -> None:
    spec = FeatureSpec("x", "numeric")
    manifest = write_dataset(
        tmp_path / "a", [spec], {"test": [[{"x": 1.0}] * 3], "other": [[{"x": 2.0}]]}
    )
    assert manifest.statistics_split == "test"
    manifest = write_dataset(tmp_path / "b", [spec], {"test": [[{"x": 1.0}] * 3], "train": [[]]})
    assert manifest.statistics_split == "train"


# -- raw features served as the pipeline preprocesses them ------------------------------

RNG = np.random.default_rng(11)
FEATURES = [
    FeatureSpec("x", "numeric"),
    FeatureSpec("vec", "numeric", shape=(3,)),
    FeatureSpec("count", "numeric", dtype="int64"),
    FeatureSpec("color", "categorical", vocabulary=("red", "green", "blue")),
    FeatureSpec("img", "image", height=6, width=5, channels=3),
    FeatureSpec("label", "categorical", vocabulary=("no", "yes"), is_label=True),
]
COLORS = ["red", "green", "blue", "purple", None]
RECORDS = [
    {
        "x": float(RNG.normal(500.0, 100.0)),
        "vec": RNG.normal(0.0, 0.01, 3).tolist(),
        "count": int(RNG.integers(0, 10_000)),
        **({"color": COLORS[i % 5]} if COLORS[i % 5] else {}),
        "img": png(RNG.integers(0, 256, (6, 5, 3), dtype=np.uint8)),
        "label": ["no", "yes"][i % 2],
    }
    for i in range(40)
]
STATISTICS = {
    "train": {
        "features": {
            "x": {"mean": 500.0, "std": 100.0},
            "vec": {"mean": 0.0, "std": 0.01},
            "count": {"mean": 5000.0, "std": 2900.0},
        }
    }
}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("raw-features")
    write_dataset(
        root,
        FEATURES,
        {"train": [RECORDS[:20], RECORDS[20:]]},
        labels=["label"],
        statistics=STATISTICS,
    )
    return root


def core_model(dataset: Path) -> keras.Model:
    """A model on the preprocessed inputs, touching every one of them."""
    described = describe_inputs(dataset)
    inputs = {
        name: keras.Input(info["shape"], name=name, dtype=info["dtype"])
        for name, info in described.items()
        if not info["label"]
    }
    parts = [
        keras.layers.Reshape((1,))(inputs["x"]),
        inputs["vec"],
        keras.layers.Reshape((1,))(inputs["count"]),
        keras.layers.Flatten()(keras.layers.Embedding(4, 2)(inputs["color"])),
        keras.layers.Flatten()(inputs["img"]),
    ]
    hidden = keras.layers.Dense(8, activation="tanh")(keras.layers.Concatenate()(parts))
    label = keras.layers.Dense(2, activation="softmax", name="label")(hidden)
    keras.utils.set_random_seed(0)
    return keras.Model(inputs, {"label": label})


@pytest.fixture(scope="module")
def served(dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    manifest = load_manifest(dataset)
    inputs = {f.name: f for f in FEATURES if not f.is_label}
    model = core_model(dataset)
    directory = tmp_path_factory.mktemp("served") / "model"
    signature = save_serving_model(
        model,
        directory,
        FeaturePreprocessor.from_manifest(manifest, inputs, dataset_dir=dataset),
        class_names={"label": ["no", "yes"]},
    )
    return model, directory, signature


def test_the_signature_takes_raw_features(served: tuple) -> None:
    _, _, signature = served
    assert signature["inputs"] == {
        "x": {"dtype": "float32", "shape": [-1]},
        "vec": {"dtype": "float32", "shape": [-1, 3]},
        "count": {"dtype": "float32", "shape": [-1]},
        "color": {"dtype": "string", "shape": [-1]},
        "img": {"dtype": "string", "shape": [-1]},
    }
    assert signature["outputs"] == {
        "label": {"dtype": "float32", "shape": [-1, 2]},
        "label_classes": {"dtype": "string", "shape": [-1, 2]},
    }


def test_served_raw_features_predict_as_the_training_pipeline_feeds(
    dataset: Path, served: tuple
) -> None:
    """No skew: raw features through the served graph give what the model gives on the
    input pipeline's preprocessed batch of the same records."""
    model, directory, _ = served
    signature = tf.saved_model.load(str(directory)).signatures["serving_default"]
    read = dict(batch_size=40, shuffle=False)
    (raw, _), *_ = make_dataset(dataset, "train", raw=True, **read)
    (features, _), *_ = make_dataset(dataset, "train", **read)
    assert raw["color"].dtype == tf.string and raw["img"].dtype == tf.string
    np.testing.assert_allclose(
        features["x"].numpy(), (raw["x"].numpy() - 500.0) / 100.0, rtol=1e-5, atol=1e-6
    )
    expected = model(features, training=False)["label"].numpy()
    answer = signature(**raw)
    np.testing.assert_allclose(answer["label"].numpy(), expected, rtol=1e-6, atol=1e-7)
    assert answer["label_classes"].numpy().tolist() == [[b"no", b"yes"]] * 40


def test_images_may_come_as_float_arrays_through_their_own_signature(
    dataset: Path, served: tuple
) -> None:
    """Clients holding pixels rather than files call ``serving_image_arrays``: the image
    goes to the model as given, every other feature is still preprocessed."""
    model, directory, _ = served
    loaded = tf.saved_model.load(str(directory))
    assert set(loaded.signatures) == {"serving_default", IMAGE_ARRAYS_SIGNATURE}
    arrays = loaded.signatures[IMAGE_ARRAYS_SIGNATURE]
    read = dict(batch_size=40, shuffle=False)
    (raw, _), *_ = make_dataset(dataset, "train", raw=True, **read)
    (features, _), *_ = make_dataset(dataset, "train", **read)
    answer = arrays(**{**raw, "img": features["img"]})
    expected = model(features, training=False)["label"].numpy()
    np.testing.assert_allclose(answer["label"].numpy(), expected, rtol=1e-6, atol=1e-7)


def test_class_names_that_do_not_fit_the_scores_are_refused(dataset: Path, tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="3 class names for output 'label', which has 2"):
        save_serving_model(core_model(dataset), tmp_path / "m", class_names={"label": "abc"})
    with pytest.raises(ExportError, match="no output"):
        save_serving_model(core_model(dataset), tmp_path / "m", class_names={"other": "ab"})


def test_the_exported_model_reloads_in_keras_as_its_core(served: tuple) -> None:
    model, directory, _ = served
    reloaded = keras.models.load_model(directory, compile=False)
    assert reloaded.input["color"].dtype == tf.int64
    assert len(reloaded.weights) == len(model.weights)
    for loaded, trained in zip(reloaded.weights, model.weights, strict=True):
        np.testing.assert_array_equal(loaded.numpy(), trained.numpy())


def test_a_tflite_core_serves_raw_features_through_its_preprocessing(
    dataset: Path, tmp_path: Path
) -> None:
    """A quantized core cannot hold lookups or decoders: its version keeps them in a
    SavedModel beside it, and the gateway's backend runs both."""
    from contracts.model_manifest import PREPROCESSING_DIR, TFLITE_FILE
    from serving.backends import open_backend
    from training.export import save_preprocessing

    model = core_model(dataset)
    inputs = {f.name: f for f in FEATURES if not f.is_label}
    preprocessor = FeaturePreprocessor.from_manifest(
        load_manifest(dataset), inputs, dataset_dir=dataset
    )
    signature = save_preprocessing(preprocessor, tmp_path / PREPROCESSING_DIR)
    assert signature["inputs"]["img"] == {"dtype": "string", "shape": [-1]}
    assert signature["outputs"]["img"] == {"dtype": "float32", "shape": [-1, 6, 5, 3]}
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    (tmp_path / TFLITE_FILE).write_bytes(converter.convert())

    backend = open_backend(tmp_path)
    try:
        served = backend.signatures["serving_default"]
        assert served.inputs["color"].dtype == np.dtype(object)
        assert list(served.outputs) == ["label"]
        read = dict(batch_size=8, shuffle=False)
        (raw, _), *_ = make_dataset(dataset, "train", raw=True, **read)
        (features, _), *_ = make_dataset(dataset, "train", **read)
        answer = backend.run("serving_default", {k: v.numpy() for k, v in raw.items()})
        expected = model(features, training=False)["label"].numpy()
        np.testing.assert_allclose(answer["label"], expected, rtol=1e-4, atol=1e-5)
    finally:
        backend.close()
