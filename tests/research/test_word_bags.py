"""Text read as a TF-IDF bag of word n-grams: what the layer computes, what the build
learns for it, and that training and serving compute the same bag."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras
from sklearn.feature_extraction.text import TfidfVectorizer

from contracts.dataset_manifest import DatasetError, load_manifest
from contracts.yaml_config import ConfigError
from research.data.input_pipeline import describe_inputs, make_dataset
from research.data.pipeline import build_dataset
from research.data.quality import BuildRejectedError
from research.data.spec import load_spec
from research.data.validate import validate_dataset
from research.models import input_spec_from_feature
from research.preprocessing.preprocessor import FeaturePreprocessor
from research.preprocessing.words import (
    WordBag,
    inverse_document_frequencies,
    text_terms,
    word_bag_for,
)
from tests.support.raw_data import write_spec, write_text_spec
from tests.support.shards import read_examples, text_of
from tests.support.texts import varied_texts

TEXTS = [
    "Return the Logger; the logger is cached.",
    "Parse an e-mail MESSAGE from a string: the message's headers first.",
    "Straße und Straße, ÉTÉ été",
    "東京 данные 東京 data_frame 42 42 42",
    "",
    "  ...  ",
]


def terms_of(texts: list[str], ngrams: int) -> list[list[str]]:
    return [[t.decode("utf-8") for t in row] for row in text_terms(texts, ngrams).to_list()]


def test_terms_are_lower_cased_words_and_word_runs() -> None:
    assert terms_of(["Parse an E-mail, ÉTÉ!"], 2) == [
        ["parse", "an", "e", "mail", "été", "parse an", "an e", "e mail", "mail été"]
    ]
    assert terms_of(["東京 data_frame  42", "", "..."], 1) == [["東京", "data_frame", "42"], [], []]


def test_the_bag_is_scikit_learns_sublinear_tfidf() -> None:
    """Same terms, counts, smoothed IDF and unit length as TfidfVectorizer(sublinear_tf)."""
    vectorizer = TfidfVectorizer(analyzer=lambda terms: terms, sublinear_tf=True)
    expected = vectorizer.fit_transform(terms_of(TEXTS, 2)).toarray()
    terms = list(vectorizer.get_feature_names_out())
    frequencies = [sum(term in row for row in terms_of(TEXTS, 2)) for term in terms]
    idf = inverse_document_frequencies(frequencies, len(TEXTS))
    np.testing.assert_allclose(idf, vectorizer.idf_, rtol=1e-12)

    bag = WordBag(terms, idf, ngrams=2)(tf.constant(TEXTS)[:, None]).numpy()
    assert bag.shape == (len(TEXTS), len(terms)) and bag.dtype == np.float32
    np.testing.assert_allclose(bag, expected, atol=1e-6)
    assert not bag[4].any() and not bag[5].any()  # no word: all zeros, not NaN


def test_terms_outside_the_vocabulary_are_ignored() -> None:
    layer = WordBag(["river", "mill", "river mill"], [1.0, 2.0, 3.0], ngrams=2)
    bag = layer(tf.constant(["unknown words only", "the RIVER mill, river"])).numpy()
    assert not bag[0].any()
    weights = np.array([1 + np.log(2), 2.0, 3.0])  # river twice, mill once, "river mill" once
    np.testing.assert_allclose(bag[1], weights / np.linalg.norm(weights), rtol=1e-6)


def test_the_layer_refuses_inconsistent_terms() -> None:
    with pytest.raises(ValueError, match="2 terms but 1 IDF"):
        WordBag(["a", "b"], [1.0], ngrams=1)
    with pytest.raises(ValueError, match="at least one term"):
        WordBag([], [], ngrams=1)
    with pytest.raises(ValueError, match="ngrams must be >= 1"):
        WordBag(["a"], [1.0], ngrams=0)


def test_the_layer_config_and_a_reloaded_saved_model_give_the_same_bag(tmp_path: Path) -> None:
    layer = WordBag(["the", "logger", "the logger", "東京"], [1.0, 2.5, 3.0, 1.5], ngrams=2)
    expected = layer(tf.constant(TEXTS)).numpy()
    again = WordBag.from_config(json.loads(json.dumps(layer.get_config())))
    np.testing.assert_array_equal(again(tf.constant(TEXTS)).numpy(), expected)

    inputs = keras.Input([], dtype=tf.string)
    model = keras.Model(inputs, layer(inputs))
    model.save(tmp_path / "sm", save_format="tf")
    served = tf.saved_model.load(str(tmp_path / "sm"))
    np.testing.assert_array_equal(served(tf.constant(TEXTS)).numpy(), expected)


# --------------------------------------------------------------------------- the build


def write_texts(directory: Path, texts: list[str], words: dict) -> Path:
    text = {"type": "text", "words": words}
    return write_text_spec(directory, texts, text, output={"num_shards": {"train": 2, "test": 1}})


def build(directory: Path, texts: list[str], words: dict) -> Path:
    spec = load_spec(write_texts(directory, texts, words))
    return Path(build_dataset(spec, directory / "out").output_dir)


def stored_texts(root: Path, split: str | None = None) -> dict[int, str]:
    """Record id -> the text the shards hold, read without the input pipeline."""
    return {
        example["id"][0]: text_of(example, "text") if "text" in example else ""
        for examples in read_examples(root, split).values()
        for example in examples
    }


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return varied_texts(400, seed=11) + [f"report {i} for the mill" for i in range(40)]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory, corpus: list[str]) -> Path:
    return build(tmp_path_factory.mktemp("words"), corpus, {"ngrams": 2, "min_documents": 3})


def test_the_build_counts_document_frequencies_on_the_training_split_only(dataset: Path) -> None:
    manifest = load_manifest(dataset)
    feature = manifest.features["text"]
    learned = json.loads((dataset / feature.words_file).read_text("utf-8"))
    train = [
        text for text in stored_texts(dataset, "train").values() if text
    ]  # no text: no document
    frequencies = Counter(term for row in terms_of(train, 2) for term in set(row))
    kept = {term: df for term, df in frequencies.items() if df >= 3}
    assert learned["documents"] == len(train) and learned["ngrams"] == 2
    assert dict(zip(learned["terms"], learned["document_frequencies"], strict=True)) == kept
    pairs = zip(learned["terms"], learned["document_frequencies"], strict=True)
    ranks = [(-df, term) for term, df in pairs]
    assert ranks == sorted(ranks)  # most documents first, ties in term order
    assert feature.words_size == len(kept) and feature.tokenizer_file is None
    assert not (dataset / "tokenizers" / "text.model").exists()  # no subword model needed


def test_a_word_only_in_test_texts_never_becomes_a_term(tmp_path: Path, corpus: list[str]) -> None:
    texts = corpus + [f"zzyzx {i}" for i in range(30)]
    root = build(tmp_path, texts, {"ngrams": 1, "min_documents": 1})
    train = set(stored_texts(root, "train").values())
    planted_in_train = any("zzyzx" in text for text in train)
    terms = json.loads((root / "tokenizers" / "text.words.json").read_text("utf-8"))["terms"]
    assert ("zzyzx" in terms) == planted_in_train
    test_only = {t for row in terms_of(list(stored_texts(root, "test").values()), 1) for t in row}
    test_only -= {t for row in terms_of(list(train), 1) for t in row}
    assert test_only and not test_only & set(terms)


def test_max_terms_keeps_the_terms_in_most_documents_and_rebuilds_are_identical(
    tmp_path: Path, corpus: list[str]
) -> None:
    words = {"ngrams": 2, "min_documents": 1, "max_terms": 25}
    first = build(tmp_path / "a", corpus, words)
    second = build(tmp_path / "b", corpus, words)
    file = "tokenizers/text.words.json"
    assert (first / file).read_bytes() == (second / file).read_bytes()
    learned = json.loads((first / file).read_text("utf-8"))
    train = list(stored_texts(first, "train").values())
    frequencies = Counter(term for row in terms_of(train, 2) for term in set(row))
    best = sorted(frequencies.items(), key=lambda item: (-item[1], item[0]))[:25]
    assert learned["terms"] == [term for term, _ in best]


def test_a_field_without_a_frequent_term_is_refused_by_name(tmp_path: Path) -> None:
    texts = [f"unique{i} words{i}" for i in range(40)]
    with pytest.raises(BuildRejectedError, match=r"'text': no term is in 2 or more training"):
        build(tmp_path, texts, {"ngrams": 1, "min_documents": 2})


def test_words_apply_to_text_fields_only(tmp_path: Path) -> None:
    path = write_texts(tmp_path, ["a b"], {"ngrams": 1})
    spec = json.loads(json.dumps(__import__("yaml").safe_load(path.read_text("utf-8"))))
    spec["schema"]["id"]["words"] = {"ngrams": 1}
    with pytest.raises(ConfigError, match="words applies to text fields only"):
        load_spec(write_spec(tmp_path / "bad.yaml", spec))


# --------------------------------------------------------------------------- readers


SKEW_TEXTS = 1000


def test_training_bags_equal_the_bags_a_reloaded_serving_graph_computes(tmp_path: Path) -> None:
    """The skew check: on 1,000 varied texts the input pipeline's bags are those an
    exported preprocessing graph computes from the raw strings a client sends."""
    root = build(tmp_path / "data", varied_texts(SKEW_TEXTS, seed=4), {"ngrams": 2})
    manifest = load_manifest(root)
    preprocessor = FeaturePreprocessor.for_inputs(manifest, ["text"], dataset_dir=root)
    module = tf.Module()
    module.preprocessor = preprocessor
    module.serve = tf.function(
        lambda text: module.preprocessor({"text": text}),
        input_signature=[tf.TensorSpec([None], tf.string, name="text")],
    )
    tf.saved_model.save(module, str(tmp_path / "sm"), signatures={"serving_default": module.serve})
    serve = tf.saved_model.load(str(tmp_path / "sm")).signatures["serving_default"]

    stored = stored_texts(root)
    compared = 0
    for split in manifest.splits:
        read = partial(make_dataset, root, split, batch_size=64, shuffle=False)
        for raw, batch in zip(read(raw=True), read(), strict=True):
            texts = tf.constant([stored[int(i)] for i in raw["id"].numpy()])
            assert batch["text"].shape[1] == manifest.features["text"].words_size
            np.testing.assert_array_equal(batch["text"].numpy(), serve(text=texts)["text"].numpy())
            compared += len(texts)
    assert compared == SKEW_TEXTS


def test_models_read_the_bag_as_a_numeric_vector(dataset: Path) -> None:
    feature = load_manifest(dataset).features["text"]
    spec = input_spec_from_feature(feature, sequence_length=64)
    assert spec.kind == "numeric" and spec.shape == (feature.words_size,)
    described = describe_inputs(dataset)["text"]
    assert described["shape"] == (feature.words_size,) and described["dtype"] == "float32"
    batch = next(iter(make_dataset(dataset, "train", batch_size=8, token_dropout=0.5)))
    assert batch["text"].dtype == tf.float32  # token dropout leaves a bag alone
    norms = np.linalg.norm(batch["text"].numpy(), axis=1)
    assert np.all((norms == 0) | (np.abs(norms - 1) < 1e-5)) and norms.max() > 0.99


def test_a_missing_or_corrupt_terms_file_is_a_dataset_error_naming_it(
    dataset: Path, tmp_path: Path
) -> None:
    copy = Path(shutil.copytree(dataset, tmp_path / "copy"))
    path = copy / "tokenizers" / "text.words.json"
    path.write_text(path.read_text("utf-8").replace('"the"', '"thé"'), encoding="utf-8")
    with pytest.raises(DatasetError, match=r"text\.words\.json.*does not match the SHA-256"):
        make_dataset(copy, "train", batch_size=4)
    problems = [problem.message for problem in validate_dataset(str(copy)).problems]
    assert any("word terms file tokenizers/text.words.json does not match" in m for m in problems)

    feature = load_manifest(copy).features["text"]
    unchecked = type(feature)(name="text", type="text", words_file=feature.words_file)
    path.write_text('{"terms": ["a"]}', encoding="utf-8")
    with pytest.raises(DatasetError, match=r"text\.words\.json.*unreadable"):
        word_bag_for(copy, unchecked)
    path.unlink()
    with pytest.raises(DatasetError, match=r"text\.words\.json.*'text' is missing"):
        word_bag_for(copy, unchecked)
