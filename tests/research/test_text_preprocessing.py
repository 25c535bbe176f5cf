"""The in-graph tokenizer: what it computes, and that training and serving agree on it."""

from __future__ import annotations

import json
import shutil
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm
import tensorflow as tf
import tf_keras as keras

from contracts.dataset_manifest import DatasetError, load_manifest
from research.data.input_pipeline import default_sequence_length, make_dataset
from research.data.pipeline import build_dataset
from research.data.spec import VocabSpec, load_spec
from research.data.tokenizer import train_tokenizer
from research.preprocessing.text import PAD_ID, SubwordTokenizer, tokenizer_for
from tests.support.raw_data import write_text_spec
from tests.support.shards import read_examples, text_of
from tests.support.texts import varied_texts


@pytest.fixture(scope="module")
def model() -> bytes:
    return train_tokenizer(varied_texts(300, seed=1), VocabSpec(size=2000), "text")


def python_ids(model: bytes, text: str) -> list[int]:
    return spm.SentencePieceProcessor(model_proto=model).encode(text)


def layer_ids(model: bytes, texts: list[str], sequence_length: int | None = None) -> list:
    return SubwordTokenizer(model, sequence_length)(tf.constant(texts)[:, None]).numpy().tolist()


def test_the_layer_gives_sentencepieces_ids_padded_and_truncated() -> None:
    texts = varied_texts(200, seed=2)
    model = train_tokenizer(texts, VocabSpec(size=2000), "text")
    expected = [python_ids(model, text) for text in texts]
    longest = max(map(len, expected))

    ragged = SubwordTokenizer(model)(tf.constant(texts)).numpy()
    assert ragged.dtype == np.int32 and ragged.shape == (len(texts), longest)
    for row, ids in zip(ragged, expected, strict=True):
        assert row.tolist() == ids + [PAD_ID] * (longest - len(ids))

    for row, ids in zip(layer_ids(model, texts, 5), expected, strict=True):
        assert row == (ids + [PAD_ID] * 5)[:5]


def test_a_bpe_model_runs_in_the_graph_too() -> None:
    """The graph's fast kernel segments a BPE model like the library on nearly every text
    (training and serving share the layer, so they agree on every one)."""
    texts = varied_texts(200, seed=2)
    model = train_tokenizer(texts, VocabSpec(size=2000, model_type="bpe"), "text")
    rows = layer_ids(model, texts)
    same = sum(
        row[: len(ids)] == ids and not any(row[len(ids) :])
        for row, ids in zip(rows, (python_ids(model, text) for text in texts), strict=True)
    )
    assert same >= 0.9 * len(texts)
    assert layer_ids(model, texts, 5) == [(row + [PAD_ID] * 5)[:5] for row in rows]


def test_the_layer_refuses_a_non_positive_length(model: bytes) -> None:
    with pytest.raises(ValueError, match="sequence_length"):
        SubwordTokenizer(model, sequence_length=0)


def test_the_layer_config_round_trips(model: bytes) -> None:
    layer = SubwordTokenizer(model, sequence_length=7, name="body_tokenizer")
    again = SubwordTokenizer.from_config(json.loads(json.dumps(layer.get_config())))
    texts = tf.constant(varied_texts(20, seed=3))
    np.testing.assert_array_equal(layer(texts), again(texts))


# --------------------------------------------------------------------------- skew


SKEW_TEXTS = 1000


def build_texts(directory: Path, texts: list[str], model_type: str) -> Path:
    path = write_text_spec(
        directory,
        texts,
        {"type": "text"},
        vocab={"size": 2000, "model_type": model_type},
        output={"num_shards": {"train": 3, "test": 1}},
    )
    return Path(build_dataset(load_spec(path), directory / "out").output_dir)


def export_tokenizer(layer: SubwordTokenizer, directory: Path) -> Path:
    """A SavedModel whose serving function takes raw strings, as a served model would."""
    module = tf.Module()
    module.tokenizer = layer
    module.serve = tf.function(
        lambda texts: {"ids": module.tokenizer(texts)},
        input_signature=[tf.TensorSpec([None], tf.string, name="texts")],
    )
    tf.saved_model.save(module, str(directory), signatures={"serving_default": module.serve})
    return directory


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_training_ids_equal_the_ids_a_reloaded_saved_model_computes(
    model_type: str, tmp_path: Path
) -> None:
    """The skew check: the input pipeline and an exported serving graph, from one layer
    class, give every one of 1,000 varied texts the same ids."""
    root = build_texts(tmp_path / "data", varied_texts(SKEW_TEXTS, seed=4), model_type)
    manifest = load_manifest(root)
    feature = manifest.features["text"]
    length = default_sequence_length(manifest, "text")
    pieces = spm.SentencePieceProcessor(model_file=str(root / feature.tokenizer_file))

    stored = {}  # the text each record holds, read without the input pipeline
    for examples in read_examples(root).values():
        for example in examples:
            stored[example["id"][0]] = text_of(example, "text") if "text" in example else ""
    assert len(stored) == SKEW_TEXTS
    assert max(len(pieces.encode(text)) for text in stored.values()) == length
    assert length > 1000 and "" in stored.values()

    served = tf.saved_model.load(
        str(export_tokenizer(tokenizer_for(root, feature, length), tmp_path / "sm"))
    )
    serve = served.signatures["serving_default"]
    compared = 0
    for split in manifest.splits:
        read = partial(make_dataset, root, split, batch_size=64, shuffle=False)
        for raw, batch in zip(read(raw=True), read(), strict=True):
            ids = [int(i) for i in raw["id"].numpy()]  # the model sees it standardized
            texts = tf.constant([stored[i] for i in ids])
            np.testing.assert_array_equal(batch["text"].numpy(), serve(texts=texts)["ids"].numpy())
            compared += len(ids)
    assert compared == SKEW_TEXTS


# --------------------------------------------------------------------------- errors


@pytest.fixture(scope="module")
def small_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_texts(tmp_path_factory.mktemp("small"), varied_texts(60, seed=5), "unigram")


def test_end_to_end_the_pipeline_yields_the_models_ids(small_dataset: Path) -> None:
    manifest = load_manifest(small_dataset)
    feature = manifest.features["text"]
    pieces = spm.SentencePieceProcessor(model_file=str(small_dataset / feature.tokenizer_file))
    by_id = {
        example["id"][0]: text_of(example, "text") if "text" in example else ""
        for example in read_examples(small_dataset, "train")["train"]
    }
    seen = 0
    read = partial(make_dataset, small_dataset, "train", batch_size=16, sequence_length=12)
    for raw, batch in zip(read(raw=True), read(), strict=True):
        assert batch["text"].dtype == tf.int32 and batch["text"].shape[1] == 12
        for record_id, row in zip(raw["id"].numpy(), batch["text"].numpy(), strict=True):
            ids = pieces.encode(by_id[int(record_id)])[:12]
            assert row.tolist() == ids + [PAD_ID] * (12 - len(ids))
            seen += 1
    assert seen == len(by_id)


def test_a_missing_tokenizer_file_is_a_dataset_error_naming_it(
    small_dataset: Path, tmp_path: Path
) -> None:
    copy = Path(shutil.copytree(small_dataset, tmp_path / "copy"))
    (copy / "tokenizers" / "text.model").unlink()
    with pytest.raises(DatasetError, match=r"tokenizers/text\.model.*'text' is missing"):
        make_dataset(copy, "train", batch_size=4)


def test_a_corrupt_tokenizer_file_is_a_dataset_error_naming_it(
    small_dataset: Path, tmp_path: Path
) -> None:
    copy = Path(shutil.copytree(small_dataset, tmp_path / "copy"))
    path = copy / "tokenizers" / "text.model"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(DatasetError, match=r"tokenizers/text\.model.*does not match the SHA-256"):
        make_dataset(copy, "train", batch_size=4)

    feature = load_manifest(copy).features["text"]
    path.write_bytes(b"\xff" * 64)  # not a model at all, with no digest to catch it first
    unchecked = type(feature)(name="text", type="text", tokenizer_file=feature.tokenizer_file)
    with pytest.raises(DatasetError, match=r"tokenizers/text\.model.*not a"):
        tokenizer_for(copy, unchecked)


def test_keras_sees_the_layer_as_a_layer(model: bytes) -> None:
    inputs = keras.Input(shape=(1,), dtype=tf.string)
    outputs = SubwordTokenizer(model, sequence_length=4)(inputs)
    ids = keras.Model(inputs, outputs)(tf.constant([["river mill"], [""]])).numpy()
    assert ids.shape == (2, 4) and (ids[1] == PAD_ID).all()
