"""Category vocabularies: the most frequent values per field, kept by a bounded combiner."""

from __future__ import annotations

import random
from collections import Counter

import apache_beam as beam
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from research.data import categories
from research.data.categories import CategoryVocabularies, choose_vocabulary
from research.data.runners import IN_PROCESS_RUNNER as RUNNER
from research.data.split import SPLIT


def test_each_field_keeps_its_most_frequent_values_as_choose_vocabulary_ranks_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(categories, "MAX_CATEGORIES", 5)
    rng = random.Random(7)
    colours = [f"c{rng.randrange(40)}" for _ in range(3000)] + ["tie-b", "tie-a"] * 90
    labels = [str(rng.randrange(12)) for _ in colours]
    rows = [
        {"colour": colour, "label": label, SPLIT: "train" if index % 4 else "test"}
        for index, (colour, label) in enumerate(zip(colours, labels, strict=True))
    ]
    train = Counter(row["colour"] for row in rows if row[SPLIT] == "train")
    expected = {
        "colour": choose_vocabulary(train.items(), max_size=5),
        "label": choose_vocabulary(Counter(labels).items(), max_size=5),
    }
    with TestPipeline(runner=RUNNER) as pipeline:
        out = pipeline | beam.Create(rows) | CategoryVocabularies(["colour"], ["label"], "train")
        assert_that(out, equal_to([expected]))
    assert len(expected["colour"]) == 5
