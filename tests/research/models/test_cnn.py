from __future__ import annotations

import numpy as np
import pytest
import tf_keras as keras

from contracts.yaml_config import ConfigError, parse_model
from research.models import CnnConfig, HeadSpec, ModelConfig
from research.models.registry import build_model
from tests.support.keras_checks import (
    assert_config_round_trip,
    assert_saved_model_round_trip,
    train,
)

HEADS = {"digit": HeadSpec(kind="classification", num_classes=10)}
SMALL = {"type": "cnn", "stem_filters": 8, "stages": [8, 16]}


def _model(shape: list[int], **overrides: object) -> keras.Model:
    config = parse_model({**SMALL, **overrides}, ModelConfig)
    assert isinstance(config.root, CnnConfig)
    return build_model(config, {"image": {"kind": "image", "shape": shape}}, HEADS)


@pytest.mark.parametrize("shape", [[8, 8], [28, 28, 1], [32, 32, 3]])
def test_image_sizes_give_class_probabilities(shape: list[int]) -> None:
    keras.utils.set_random_seed(0)
    model = _model(shape)
    assert model.input_names == ["image"] and model.output_names == ["digit"]
    images = np.random.default_rng(0).random((2, *shape)).astype(np.float32)
    probabilities = model({"image": images})["digit"].numpy()
    assert probabilities.shape == (2, 10)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)


def test_stages_downsample_and_project_shortcuts() -> None:
    model = _model([32, 32, 3], stages=[8, 16, 32], blocks_per_stage=2)
    names = {layer.name for layer in model.layers}
    # The stem already has the first stage's width: no projection there, one per later stage.
    assert "stage0_block0_projection_conv" not in names
    assert {"stage1_block0_projection_conv", "stage2_block0_projection_conv"} <= names
    assert "stage1_block1_projection_conv" not in names
    assert model.get_layer("stage2_block1_add").output.shape[1:] == (8, 8, 32)


def test_config_round_trip() -> None:
    keras.utils.set_random_seed(0)
    images = np.random.default_rng(1).random((3, 8, 8)).astype(np.float32)
    assert_config_round_trip(_model([8, 8], dropout=0.1), {"image": images})


def test_training_reduces_loss() -> None:
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(2)
    labels = rng.integers(0, 3, size=96)
    # Classes are textures (flat, horizontal stripes, vertical stripes): local patterns a
    # convolution sees wherever they are, so a few epochs learn them.
    images = rng.random((96, 8, 8)).astype(np.float32) * 0.2
    images[labels == 1, ::2, :] += 1.0
    images[labels == 2, :, ::2] += 1.0
    heads = {"digit": HeadSpec(kind="classification", num_classes=3)}
    model = build_model(SMALL, {"image": {"kind": "image", "shape": [8, 8]}}, heads)
    before, after = train(model, heads, {"image": images}, {"digit": labels}, epochs=5)
    assert after < 0.5 * before


def test_saved_model_round_trip(tmp_path) -> None:
    keras.utils.set_random_seed(0)
    images = np.random.default_rng(3).random((2, 8, 8, 1)).astype(np.float32)
    assert_saved_model_round_trip(_model([8, 8, 1]), {"image": images}, tmp_path)


def test_non_image_input_is_refused() -> None:
    with pytest.raises(
        ValueError, match=r"cnn models need one input of kind image; 'x' is numeric"
    ):
        build_model(SMALL, {"x": {"shape": [64]}}, HEADS)


def test_bad_stage_width_names_its_index() -> None:
    with pytest.raises(ConfigError, match=r"stages\.1: Input should be greater than 0"):
        parse_model({"type": "cnn", "stages": [8, 0]}, ModelConfig)
