"""How ``slipway data show`` writes a stored value: images, vectors, long text, missing."""

from __future__ import annotations

import io

from PIL import Image
from tensorflow.core.example import feature_pb2

from contracts.features import FeatureSpec
from research.data.show import statistics_line, stored_value_text


def png(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("L", (width, height)).save(buffer, "PNG")
    return buffer.getvalue()


def test_each_kind_of_value_is_written_briefly() -> None:
    image = FeatureSpec("photo", "image", height=8, width=6, channels=1)
    text = FeatureSpec("note", "text")
    pixels = FeatureSpec("pixels", "numeric", shape=[64])
    data = png(6, 8)
    assert stored_value_text(
        image, feature_pb2.Feature(bytes_list=feature_pb2.BytesList(value=[data]))
    ) == (f"PNG 6x8 L, {len(data):,} bytes")
    assert stored_value_text(
        image, feature_pb2.Feature(bytes_list=feature_pb2.BytesList(value=[b"xx"]))
    ) == ("not an image, 2 bytes")
    long = "word " * 30
    written = stored_value_text(
        text, feature_pb2.Feature(bytes_list=feature_pb2.BytesList(value=[long.encode()]))
    )
    assert len(written) == 48 and written.endswith("…")
    vector = feature_pb2.Feature(float_list=feature_pb2.FloatList(value=[0.5] * 64))
    assert stored_value_text(pixels, vector) == "[0.5, 0.5, 0.5, 0.5, … (64 values)]"
    assert stored_value_text(pixels, None) == "(missing)"
    assert stored_value_text(pixels, feature_pb2.Feature()) == "(missing)"


def test_statistics_of_a_feature_without_any() -> None:
    assert statistics_line({}) == "-"
    assert statistics_line({"type": "image", "count": 1200, "missing": 3}) == (
        "1,200 present; 3 missing"
    )
