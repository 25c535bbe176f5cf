"""Beam's pickler through the bz2 memo: the bytes Beam always wrote, each computed once."""

from __future__ import annotations

import bz2
import os

import apache_beam as beam
import pytest
from apache_beam.internal import cloudpickle_pickler, pickler
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from research.data import beam_pickling
from research.data.runners import IN_PROCESS_RUNNER


class Scale(beam.DoFn):
    def __init__(self, factor: int) -> None:
        self.factor = factor

    def process(self, element):  # noqa: ANN001, ANN201
        yield element * self.factor


def test_answers_are_bz2s_own_and_each_payload_is_compressed_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[bytes] = []
    real_compress = bz2.compress

    def counted(data: bytes, level: int = 9) -> bytes:
        calls.append(data)
        return real_compress(data, level)

    monkeypatch.setattr(beam_pickling.bz2, "compress", counted)
    memo = beam_pickling.MemoizedBz2()
    payload = os.urandom(3000) * 2

    answers = [memo.compress(payload, compresslevel=9) for _ in range(3)]

    assert answers == [real_compress(payload, 9)] * 3
    assert calls == [payload]
    assert memo.decompress(answers[0]) == payload
    assert memo.compress(payload, compresslevel=1) == real_compress(payload, 1)


def test_the_memo_is_bounded_and_skips_large_payloads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(beam_pickling, "MAX_ENTRIES", 4)
    monkeypatch.setattr(beam_pickling, "MAX_PAYLOAD_BYTES", 100)
    memo = beam_pickling.MemoizedBz2()
    for index in range(10):
        memo.decompress(bz2.compress(bytes([index]) * 50))
    text = os.urandom(1000)
    large = bz2.compress(text)

    assert memo.decompress(large) == text
    assert len(memo.decompress._answers) == 4
    assert large not in memo.decompress._answers


def test_beams_payloads_are_unchanged_and_a_pipeline_runs_through_the_memo(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    beam_pickling.install()
    beam_pickling.install()
    assert isinstance(cloudpickle_pickler.bz2, beam_pickling.MemoizedBz2)
    through_memo = pickler.dumps(Scale(3))
    with monkeypatch.context() as plain:
        plain.setattr(cloudpickle_pickler, "bz2", bz2)
        without_memo = pickler.dumps(Scale(3))
        assert pickler.loads(through_memo).factor == 3  # read by a pickler without the memo

    assert through_memo == without_memo
    with TestPipeline(runner=IN_PROCESS_RUNNER) as pipeline:
        scaled = pipeline | beam.Create([1, 2, 3]) | beam.ParDo(Scale(3))
        assert_that(scaled, equal_to([3, 6, 9]))
