"""The prediction log writer: never blocks a request, counts what it drops or cannot write,
and hands readers only finished files."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import tensorflow as tf
from tensorflow_serving.apis import model_pb2, prediction_log_pb2

from contracts.yaml_config import ConfigError
from serving.config import PredictionLogConfig
from serving.metrics import GatewayMetrics
from serving.prediction_log import PredictionLogWriter, open_prediction_log

MIB = 1024 * 1024


def writer(directory: Path, metrics: GatewayMetrics, **settings: float) -> PredictionLogWriter:
    options = {"sample": 1.0, "max_file_bytes": MIB, "max_file_age_s": 600.0, "queue_size": 8}
    return PredictionLogWriter(directory, metrics, **{**options, **settings})  # type: ignore[arg-type]


def empty(log: prediction_log_pb2.PredictionLog, spec: model_pb2.ModelSpec) -> None:
    log.predict_log.response.model_spec.CopyFrom(spec)


def counted(metrics: GatewayMetrics, outcome: str) -> float | None:
    return metrics.registry.get_sample_value(
        "slipway_gateway_prediction_log_records_total", {"outcome": outcome}
    )


def logged_ids(directory: Path) -> list[str]:
    files = sorted(str(path) for path in directory.glob("*.tfrecord"))
    return [
        prediction_log_pb2.PredictionLog.FromString(record.numpy()).log_metadata.request_origin
        for record in tf.data.TFRecordDataset(files)
    ]


def test_a_full_queue_drops_the_record_and_counts_it(tmp_path: Path) -> None:
    metrics = GatewayMetrics()
    log = writer(tmp_path, metrics, queue_size=1)
    started, release = threading.Event(), threading.Event()

    def blocked(record: prediction_log_pb2.PredictionLog, spec: model_pb2.ModelSpec) -> None:
        started.set()
        assert release.wait(30)

    log.submit("first", "digits", 1, "serving_default", blocked)
    assert started.wait(30)  # the writer thread holds "first"
    log.submit("second", "digits", 1, "serving_default", empty)  # fills the queue
    log.submit("third", "digits", 1, "serving_default", empty)  # nowhere to go
    assert counted(metrics, "dropped") == 1
    release.set()
    log.close()
    assert counted(metrics, "written") == 2
    assert logged_ids(tmp_path) == ["first", "second"]


def test_a_record_that_cannot_be_built_is_counted_and_the_rest_are_written(
    tmp_path: Path,
) -> None:
    metrics = GatewayMetrics()
    log = writer(tmp_path, metrics)

    def broken(record: prediction_log_pb2.PredictionLog, spec: model_pb2.ModelSpec) -> None:
        raise ValueError("cannot encode")

    log.submit("bad", "digits", 1, "serving_default", broken)
    log.submit("good", "digits", 1, "serving_default", empty)
    log.close()
    assert counted(metrics, "failed") == 1
    assert logged_ids(tmp_path) == ["good"]


def test_files_rotate_by_age_and_only_finished_files_have_the_tfrecord_suffix(
    tmp_path: Path,
) -> None:
    log = writer(tmp_path, GatewayMetrics(), max_file_age_s=1e-9)  # every file is old at once
    for request_id in ("a", "b", "c"):
        log.submit(request_id, "digits", 1, "serving_default", empty)
    log.close()
    assert len(list(tmp_path.glob("*.tfrecord"))) == 3
    assert not list(tmp_path.glob("*.part"))
    assert logged_ids(tmp_path) == ["a", "b", "c"]


def test_sampling_follows_the_request_id(tmp_path: Path) -> None:
    log = writer(tmp_path, GatewayMetrics(), sample=0.5)
    ids = [f"id-{n}" for n in range(200)]
    chosen = [i for i in ids if log.sampled(i)]
    assert 70 <= len(chosen) <= 130
    assert chosen == [i for i in ids if log.sampled(i)]  # the same id, the same decision
    log.close()


def test_logging_is_off_by_default_and_an_unusable_directory_is_a_config_error(
    tmp_path: Path,
) -> None:
    assert open_prediction_log(PredictionLogConfig(), GatewayMetrics()) is None
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    settings = PredictionLogConfig(directory=blocked / "logs", sample=0.5)
    with pytest.raises(ConfigError, match="prediction_log.directory: cannot create"):
        open_prediction_log(settings, GatewayMetrics())
