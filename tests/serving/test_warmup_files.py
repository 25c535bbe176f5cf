"""Warm-up as TensorFlow Serving does it: only the requests a version ships in
``assets.extra/tf_serving_warmup_requests`` are run, every kind of ``PredictionLog`` that
TF Serving replays is replayed, and no request is made up for a version without them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import (
    classification_pb2,
    inference_pb2,
    predict_pb2,
    prediction_log_pb2,
    regression_pb2,
)

from serving.backends.savedmodel import SavedModelBackend
from serving.errors import InvalidArgument, ServingError
from serving.tensors import numpy_to_tensor_proto
from serving.warmup import MAX_WARMUP_RECORDS, WARMUP_FILE, warm_up
from tests.support.warmup import Recording, example, write_half_plus_two

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def version_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("half_plus_two") / "1"
    write_half_plus_two(directory)
    return directory


@pytest.fixture(scope="module")
def backend(version_dir: Path) -> Iterator[SavedModelBackend]:
    loaded = SavedModelBackend(version_dir)
    yield loaded
    loaded.close()


def write_records(directory: Path, logs: list[prediction_log_pb2.PredictionLog]) -> Path:
    path = directory.joinpath(*WARMUP_FILE)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for entry in logs:
            writer.write(entry.SerializeToString())
    return path


def with_files(version_dir: Path, tmp_path: Path) -> Path:
    """A copy of the version in which a test may put warm-up files."""
    import shutil

    copy = tmp_path / "1"
    shutil.copytree(version_dir, copy)
    return copy


def test_a_model_that_parses_examples_loads_without_a_warmup_file(
    backend: SavedModelBackend, version_dir: Path
) -> None:
    recording = Recording(backend)
    assert warm_up(recording, version_dir) == 0
    assert recording.calls == []
    # and it answers real requests afterwards
    serialized = np.array([example(4.0).SerializeToString()], dtype=object)
    assert backend.run("serving_default", {"inputs": serialized})["outputs"].tolist() == [[4.0]]


def test_every_kind_of_record_tf_serving_replays_is_replayed(
    backend: SavedModelBackend, version_dir: Path, tmp_path: Path
) -> None:
    directory = with_files(version_dir, tmp_path)
    predict = predict_pb2.PredictRequest()
    predict.model_spec.name = "half_plus_two"
    predict.inputs["inputs"].CopyFrom(
        numpy_to_tensor_proto(np.array([example(1.0).SerializeToString()], dtype=object))
    )
    classify = classification_pb2.ClassificationRequest()
    classify.model_spec.signature_name = "classify_x_to_y"
    classify.input.example_list.examples.extend([example(1.0), example(2.0)])
    regress = regression_pb2.RegressionRequest()
    regress.model_spec.signature_name = "regress_x_to_y"
    regress.input.example_list_with_context.examples.add()
    regress.input.example_list_with_context.context.CopyFrom(example(3.0))
    multi = inference_pb2.MultiInferenceRequest()
    multi.tasks.add().model_spec.signature_name = "classify_x_to_y"
    multi.tasks.add().model_spec.signature_name = "regress_x_to_y"
    multi.input.example_list.examples.append(example(5.0))
    write_records(
        directory,
        [
            prediction_log_pb2.PredictionLog(
                predict_log=prediction_log_pb2.PredictLog(request=predict)
            ),
            prediction_log_pb2.PredictionLog(
                classify_log=prediction_log_pb2.ClassifyLog(request=classify)
            ),
            prediction_log_pb2.PredictionLog(
                regress_log=prediction_log_pb2.RegressLog(request=regress)
            ),
            prediction_log_pb2.PredictionLog(
                multi_inference_log=prediction_log_pb2.MultiInferenceLog(request=multi)
            ),
        ],
    )
    recording = Recording(backend)
    assert warm_up(recording, directory) == 4
    assert [name for name, _ in recording.calls] == [
        "serving_default",
        "classify_x_to_y",
        "regress_x_to_y",
        "classify_x_to_y",
        "regress_x_to_y",
    ]
    assert [len(inputs["inputs"]) for _, inputs in recording.calls] == [1, 2, 1, 1, 1]


def test_a_recorded_request_the_model_refuses_fails_the_load(
    backend: SavedModelBackend, version_dir: Path, tmp_path: Path
) -> None:
    directory = with_files(version_dir, tmp_path)
    regress = regression_pb2.RegressionRequest()
    regress.input.example_list.examples.add()  # no feature x: the graph refuses it
    write_records(
        directory,
        [
            prediction_log_pb2.PredictionLog(
                regress_log=prediction_log_pb2.RegressLog(request=regress)
            )
        ],
    )
    with pytest.raises(ServingError, match="tf_serving_warmup_requests: record 0"):
        warm_up(Recording(backend), directory)


def test_session_run_records_and_too_many_records_fail_as_in_tf_serving(
    backend: SavedModelBackend, version_dir: Path, tmp_path: Path
) -> None:
    directory = with_files(version_dir, tmp_path)
    write_records(
        directory,
        [prediction_log_pb2.PredictionLog(session_run_log=prediction_log_pb2.SessionRunLog())],
    )
    with pytest.raises(ServingError, match="session_run_log"):
        warm_up(Recording(backend), directory)

    empty = prediction_log_pb2.PredictionLog()  # no request: skipped, as TF Serving does
    write_records(directory, [empty] * (MAX_WARMUP_RECORDS + 1))
    with pytest.raises(InvalidArgument, match="exceeds the maximum"):
        warm_up(Recording(backend), directory)
    write_records(directory, [empty] * 3)
    assert warm_up(Recording(backend), directory) == 3
