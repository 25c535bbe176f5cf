"""Every zoo family, exported as training exports it, answers raw features sent by
unmodified TensorFlow Serving clients: gRPC Predict and Classify, and REST JSON with
strings, numbers and base64 images — and answers them as the model answers the input
pipeline's preprocessed batch of the same records."""

from __future__ import annotations

import base64
import json
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import sentencepiece as spm
import tensorflow as tf
from tensorflow_serving.apis import (
    classification_pb2,
    predict_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)

from contracts.features import FeatureSpec
from research.data.input_pipeline import make_dataset
from research.data.spec import VocabSpec, WordsSpec
from research.data.tokenizer import train_tokenizer
from research.data.words import word_bag_file, words_path
from research.experiments.config import ExperimentConfig
from research.experiments.task import ExperimentTask
from research.preprocessing.words import text_terms
from serving.batching import BatchingConfig
from serving.config import GatewayConfig
from serving.rest_api import LARGE_BODY_BYTES
from tests.support.gateways import GatewayThread
from tests.support.http import http
from tests.support.records import png, write_dataset
from training.publish import publish_model

ROWS = 6
RNG = np.random.default_rng(5)
SPECIES = ("setosa", "versicolor", "virginica")

TABULAR = [
    FeatureSpec("petal", "numeric"),
    FeatureSpec("sepal", "numeric", shape=(2,)),
    FeatureSpec("colour", "categorical", vocabulary=("blue", "white")),
    FeatureSpec("species", "categorical", vocabulary=SPECIES, is_label=True),
    FeatureSpec("height", "numeric", is_label=True),
]
TABULAR_RECORDS = [
    {
        "petal": float(RNG.normal(4.0, 2.0)),
        "sepal": RNG.normal(300.0, 50.0, 2).tolist(),
        **({"colour": ("blue", "white", "pink")[i % 3]} if i % 4 else {}),
        "species": SPECIES[i % 3],
        "height": float(RNG.normal(30.0, 5.0)),
    }
    for i in range(24)
]
TABULAR_STATISTICS = {
    "train": {
        "features": {
            "petal": {"mean": 4.0, "std": 2.0},
            "sepal": {"mean": 300.0, "std": 50.0},
            "height": {"mean": 30.0, "std": 5.0},
        }
    }
}
IMAGES = [
    FeatureSpec("photo", "image", height=8, width=8, channels=1),
    FeatureSpec("species", "categorical", vocabulary=SPECIES, is_label=True),
]
IMAGE_RECORDS = [
    {"photo": png(RNG.integers(0, 256, (8, 8, 1), dtype=np.uint8)), "species": SPECIES[i % 3]}
    for i in range(24)
]

WORDS = [
    "river",
    "stone",
    "cloud",
    "maple",
    "lantern",
    "harbor",
    "violet",
    "copper",
    "meadow",
    "falcon",
]
TEXTS = [" ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(3 + i % 9)) for i in range(24)]


def text_features(root: Path) -> list[FeatureSpec]:
    """A text feature with a sentencepiece model learned on ``TEXTS`` in ``root``."""
    model = train_tokenizer(TEXTS, VocabSpec(size=40), "text")
    path = root / "tokenizers" / "text.model"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model)
    vocab_size = spm.SentencePieceProcessor(model_proto=model).get_piece_size()
    return [
        FeatureSpec("text", "text", tokenizer_file="tokenizers/text.model", vocab_size=vocab_size),
        FeatureSpec("species", "categorical", vocabulary=SPECIES, is_label=True),
    ]


def word_features(root: Path) -> list[FeatureSpec]:
    """A text feature read as a TF-IDF bag of the words and word pairs of ``TEXTS``."""
    spec = WordsSpec(ngrams=2, min_documents=1)
    frequencies = Counter(term for row in text_terms(TEXTS, 2).to_list() for term in set(row))
    terms = [(term.decode("utf-8"), df) for term, df in frequencies.items()]
    path = root / words_path("text")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(word_bag_file(terms, len(TEXTS), spec))
    return [
        FeatureSpec("text", "text", words_file=words_path("text"), words_size=len(terms)),
        FeatureSpec("species", "categorical", vocabulary=SPECIES, is_label=True),
    ]


TEXT_RECORDS = [{"text": text, "species": SPECIES[i % 3]} for i, text in enumerate(TEXTS)]
TRANSFORMER = {"type": "transformer", "d_model": 8, "num_heads": 2, "num_layers": 1, "ff_dim": 16}


@dataclass(frozen=True)
class Setup:
    """A family's dataset, model and the labels it predicts."""

    features: Callable[[Path], list[FeatureSpec]]
    records: list[dict]
    model: dict
    labels: list[str]
    statistics: dict = field(default_factory=dict)
    data: dict = field(default_factory=dict)
    heads: dict | None = None


FAMILIES = {
    "mlp": Setup(lambda root: TABULAR, TABULAR_RECORDS, {"type": "mlp", "hidden_units": [8]},
                 ["species"], TABULAR_STATISTICS),
    "regression": Setup(lambda root: TABULAR, TABULAR_RECORDS,
                        {"type": "mlp", "hidden_units": [8]}, ["height"], TABULAR_STATISTICS),
    "cnn": Setup(lambda root: IMAGES, IMAGE_RECORDS,
                 {"type": "cnn", "stem_filters": 4, "stages": [4]}, ["species"]),
    "multitask": Setup(lambda root: TABULAR, TABULAR_RECORDS,
                       {"type": "multitask", "trunk": {"type": "mlp", "hidden_units": [8]},
                        "head_hidden_units": [4]}, ["species", "height"], TABULAR_STATISTICS),
    "transformer": Setup(text_features, TEXT_RECORDS, TRANSFORMER, ["species"],
                         data={"sequence_length": 12}),
    "words": Setup(word_features, TEXT_RECORDS, {"type": "mlp", "hidden_units": []},
                   ["species"]),  # an MLP over text read as a TF-IDF bag
    "gpt": Setup(text_features, TEXT_RECORDS, {**TRANSFORMER, "type": "gpt"}, [],
                 data={"sequence_length": 12}, heads={"next_token": {"kind": "language_model"}}),
}  # fmt: skip


def experiment(root: Path, family: str) -> ExperimentConfig:
    setup = FAMILIES[family]
    dataset = root / "dataset"
    features = setup.features(dataset)
    records = setup.records
    write_dataset(
        dataset,
        features,
        {"train": [records[:12], records[12:]], "test": [records[:ROWS]]},
        labels=[f.name for f in features if f.is_label],
        statistics=setup.statistics,
    )
    data = {"dataset": str(dataset), "batch_size": 4, "eval_split": "test", **setup.data}
    if setup.labels:
        data["labels"] = setup.labels
    else:
        data["features"] = ["text"]
    return ExperimentConfig.model_validate(
        {
            "name": family,
            "run_dir": str(root / "run"),
            "data": data,
            "model": setup.model,
            **({"heads": setup.heads} if setup.heads else {}),
            "training": {"steps": 1, "precision": "float32"},
            "export": {"model_root": str(root / "models"), "model_name": family},
        }
    )


def first_features(dataset: tf.data.Dataset) -> dict[str, tf.Tensor]:
    """The features of a dataset's first batch (with or without labels)."""
    element = next(iter(dataset))
    return element[0] if isinstance(element, tuple) else element


class Family:
    """A family's model published into its own repository, and the records to send."""

    def __init__(self, root: Path, family: str) -> None:
        self.name = family
        self.task = ExperimentTask(experiment(root, family))
        self.model = self.task.build_model()
        publish_model(self.model, self.task, metrics={}, method="test")
        self.model_root = root / "models"
        dataset = self.task.config.resolve(self.task.config.data.dataset)
        read = dict(
            batch_size=ROWS,
            shuffle=False,
            features=list(self.task.inputs),
            sequence_length=self.task.config.data.sequence_length,
        )
        self.raw, features = (
            first_features(make_dataset(dataset, "test", raw=raw, **read)) for raw in (True, False)
        )
        self.expected = {
            name: output.numpy() for name, output in self.model(features, training=False).items()
        }


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Family:
    return Family(tmp_path_factory.mktemp(request.param), request.param)


@pytest.fixture(scope="module")
def gateway(family: Family) -> Iterator[GatewayThread]:
    with GatewayThread(family.model_root) as thread:
        yield thread


def json_value(feature: FeatureSpec, value: Any) -> Any:
    """A raw value as a REST client writes it: an image file as ``{"b64": ...}``, text
    and categories as strings, numbers as they are."""
    if feature.type == "image":
        return {"b64": base64.b64encode(value).decode()}
    return value.decode("utf-8") if isinstance(value, bytes) else value


def test_grpc_predict_takes_raw_tensors(family: Family, gateway: GatewayThread) -> None:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = family.name
    for name, tensor in family.raw.items():
        request.inputs[name].CopyFrom(tf.make_tensor_proto(tensor.numpy()))
    with grpc.insecure_channel(gateway.grpc_target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        response = stub.Predict(request, timeout=30)
    for name, expected in family.expected.items():
        answer = tf.make_ndarray(response.outputs[name])
        np.testing.assert_allclose(answer, expected, rtol=1e-5, atol=1e-6)
    if "species" in family.expected:
        classes = tf.make_ndarray(response.outputs["species_classes"])
        assert classes.tolist() == [[name.encode() for name in SPECIES]] * ROWS


def rest_rows(family: Family) -> list[dict[str, Any]]:
    """The family's raw test rows as a REST client writes them, one dict per row."""
    features = family.task.manifest.features
    return [
        {
            name: json_value(features[name], np.asarray(tensor.numpy()[row]).tolist())
            for name, tensor in family.raw.items()
        }
        for row in range(ROWS)
    ]


def test_rest_predict_takes_json_strings_numbers_and_b64(
    family: Family, gateway: GatewayThread
) -> None:
    rows = rest_rows(family)
    status, answer = http(gateway, "POST", f"/v1/models/{family.name}:predict", {"instances": rows})
    assert status == 200, answer
    predictions = answer["predictions"]
    for name, expected in family.expected.items():
        # one output answers with its values alone, as TensorFlow Serving's row format does
        rows = [p[name] if isinstance(p, dict) else p for p in predictions]
        answer = np.array(rows, np.float32)
        np.testing.assert_allclose(answer, expected, rtol=1e-5, atol=1e-6)
    if "species" in family.expected:
        assert predictions[0]["species_classes"] == list(SPECIES)


def send_examples(family: Family, gateway: GatewayThread, request: Any, method: str) -> Any:
    """``request`` with the family's raw rows as ``tf.Example``s, as a TensorFlow Serving
    client sends them, answered by the gateway's gRPC ``method``."""
    request.model_spec.name = family.name
    for row in range(ROWS):
        example = request.input.example_list.examples.add()
        for name, tensor in family.raw.items():
            values = np.ravel(tensor.numpy()[row]).tolist()
            feature = example.features.feature[name]
            if tensor.dtype == tf.string:
                feature.bytes_list.value.extend(values)
            else:
                feature.float_list.value.extend(values)
    with grpc.insecure_channel(gateway.grpc_target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        return getattr(stub, method)(request, timeout=30)


def test_grpc_classify_reads_raw_features_from_tf_examples(
    family: Family, gateway: GatewayThread
) -> None:
    if "species" not in family.expected:
        pytest.skip("classifies nothing")
    response = send_examples(
        family, gateway, classification_pb2.ClassificationRequest(), "Classify"
    )
    scores = family.expected["species"]
    for row, classification in enumerate(response.result.classifications):
        assert [entry.label for entry in classification.classes] == list(SPECIES)
        np.testing.assert_allclose(
            [entry.score for entry in classification.classes], scores[row], rtol=1e-5, atol=1e-6
        )


def test_regress_reads_raw_features_over_grpc_and_rest(
    family: Family, gateway: GatewayThread
) -> None:
    """A regression answers in the label's units, as the model does in process."""
    if list(family.expected) != ["height"]:
        pytest.skip("Regress answers for a model with one regression output")
    expected = family.expected["height"][:, 0]
    response = send_examples(family, gateway, regression_pb2.RegressionRequest(), "Regress")
    answers = [regression.value for regression in response.result.regressions]
    np.testing.assert_allclose(answers, expected, rtol=1e-5, atol=1e-5)

    features = family.task.manifest.features
    examples = [
        {
            name: json_value(features[name], np.asarray(t.numpy()[row]).tolist())
            for name, t in family.raw.items()
        }
        for row in range(ROWS)
    ]
    status, answer = http(
        gateway, "POST", f"/v1/models/{family.name}:regress", {"examples": examples}
    )
    assert status == 200, answer
    np.testing.assert_allclose(answer["results"], expected, rtol=1e-5, atol=1e-5)
    assert abs(float(np.mean(expected)) - 30.0) < 3 * 5.0  # in the label's units, around its mean


def test_columns_of_different_lengths_are_refused_naming_each_inputs_rows(
    family: Family, gateway: GatewayThread
) -> None:
    """The model's raw graph error (a ConcatOp deep in preprocessing) is not an answer."""
    if family.name != "mlp":
        pytest.skip("one tabular model shows it")
    features = family.task.manifest.features
    columns = {
        name: [json_value(features[name], np.asarray(v).tolist()) for v in tensor.numpy()]
        for name, tensor in family.raw.items()
    }
    columns["sepal"] = columns["sepal"][:2]
    status, answer = http(gateway, "POST", f"/v1/models/{family.name}:predict", {"inputs": columns})
    assert status == 400, answer
    assert "must have equal 0th-dimension size" in answer["error"]
    assert "'sepal' has 2" in answer["error"] and f"'petal' has {ROWS}" in answer["error"]
    assert "ConcatOp" not in answer["error"] and "Graph execution" not in answer["error"]


def test_an_image_the_model_cannot_decode_is_named_by_input_and_row(
    family: Family, gateway: GatewayThread
) -> None:
    """Not TensorFlow's graph error: over gRPC and REST, and the next request still answers."""
    if family.name != "cnn":
        pytest.skip("the image family shows it")
    photos = [bytes(value) for value in family.raw["photo"].numpy()]
    photos[1] = photos[1][: len(photos[1]) // 2]
    request = predict_pb2.PredictRequest()
    request.model_spec.name = family.name
    request.inputs["photo"].CopyFrom(tf.make_tensor_proto(np.array(photos, object)))
    with grpc.insecure_channel(gateway.grpc_target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.Predict(request, timeout=30)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details().startswith("input 'photo', row 1: a truncated or corrupt PNG")

    rows = [{"photo": {"b64": base64.b64encode(photo).decode()}} for photo in photos[:1]]
    rows.append({"photo": base64.b64encode(photos[0]).decode()})  # the wrapper forgotten
    status, answer = http(gateway, "POST", f"/v1/models/{family.name}:predict", {"instances": rows})
    assert status == 400, answer
    assert answer["error"].startswith("input 'photo', row 1: base64 text, not image bytes")
    assert "Graph execution" not in answer["error"]

    status, answer = http(
        gateway, "POST", f"/v1/models/{family.name}:predict", {"instances": rows[:1]}
    )
    assert status == 200, answer


@pytest.mark.process  # a body this large is decoded in the gateway's decoding process
@pytest.mark.parametrize("layout", ["instances", "inputs"])
def test_a_large_rest_body_of_strings_answers_as_a_small_one(
    family: Family, gateway: GatewayThread, layout: str
) -> None:
    """Strings, categories and b64 images above the size decoded out of process; more rows
    than the batch queue ever holds are a client error, not "retry later"."""
    rows = rest_rows(family)
    copies = 2 * LARGE_BODY_BYTES // len(json.dumps({"instances": rows})) + 1
    many = rows * copies
    if layout == "instances":
        body: dict[str, Any] = {"instances": many}
    else:
        body = {"inputs": {name: [row[name] for row in many] for name in many[0]}}
    assert len(json.dumps(body)) >= LARGE_BODY_BYTES
    path = f"/v1/models/{family.name}:predict"
    queue = BatchingConfig()
    if len(many) > queue.max_batch_size * queue.max_enqueued_batches:
        status, answer = http(gateway, "POST", path, body)
        assert status == 400, answer
        assert f"the request has {len(many):,} rows, more than the batch queue" in answer["error"]
    roomy = GatewayConfig(batching=BatchingConfig(max_enqueued_batches=len(many)))
    with GatewayThread(family.model_root, roomy) as large:
        status, answer = http(large, "POST", path, body)
    assert status == 200, answer
    answers = answer["predictions"] if layout == "instances" else answer["outputs"]
    for name, expected in family.expected.items():
        if layout == "instances":
            got = [a[name] if isinstance(a, dict) else a for a in answers]
        else:
            got = answers[name] if isinstance(answers, dict) else answers
        np.testing.assert_allclose(
            np.array(got, np.float32), np.concatenate([expected] * copies), rtol=1e-5, atol=1e-6
        )
