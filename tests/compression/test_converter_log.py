"""The TFLite converter's output goes to the run's log file; a refusal reads as one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from compression.convert import to_tflite
from compression.converter_log import logging_to
from compression.errors import CompressionError


def unconvertible() -> keras.Model:
    """Adds an axis by slicing a tensor of unknown length: a StridedSlice LiteRT lacks."""
    values = keras.Input(shape=(None,), name="values")
    total = keras.layers.Lambda(
        lambda x: tf.reduce_sum(x[:, :, tf.newaxis] * 2.0, axis=[1, 2]), name="odd_slice"
    )(values)
    return keras.Model(values, {"total": total})


def small_dense() -> keras.Model:
    features = keras.Input(shape=(4,), name="features")
    return keras.Model(features, {"score": keras.layers.Dense(2, name="score")(features)})


def test_a_refused_model_is_one_line_naming_the_op_and_the_log_holds_the_rest(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "report" / "converter.log"
    with logging_to(log), pytest.raises(CompressionError) as refused:
        to_tflite(unconvertible())

    message = str(refused.value)
    assert "\n" not in message and len(message) < 500
    assert "'tf.StridedSlice' op is neither a custom op nor a flex op" in message
    assert message.endswith(f"(the converter's full message: {log})")
    written = log.read_text()
    assert "loc(" in written and "StridedSlice" in written  # the whole diagnostic
    printed = capfd.readouterr()
    assert "loc(" not in printed.out + printed.err


def test_without_a_log_a_refusal_is_still_one_line() -> None:
    with pytest.raises(CompressionError) as refused:
        to_tflite(unconvertible())
    assert "\n" not in str(refused.value) and "StridedSlice" in str(refused.value)


def test_calibration_chatter_goes_to_the_log_and_python_output_still_prints(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    samples = [{"features": np.full((1, 4), i / 8, np.float32)} for i in range(8)]
    log = tmp_path / "converter.log"
    with logging_to(log):
        flatbuffer = to_tflite(
            small_dense(),
            optimizations=[tf.lite.Optimize.DEFAULT],
            representative_dataset=lambda: iter(samples),
            integer_only=True,
        )
    print("after the conversion")

    assert flatbuffer
    assert "fully_quantize" in log.read_text()
    printed = capfd.readouterr()
    assert "fully_quantize" not in printed.out + printed.err
    assert "after the conversion" in printed.out  # descriptors are given back
