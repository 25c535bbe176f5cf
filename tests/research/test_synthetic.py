"""The synthetic corpus: realistic records, and planted items exactly as reported."""

from __future__ import annotations

import itertools
import json
import statistics
from pathlib import Path

import pytest

from research.data.pii import mask_pii
from research.data.synthetic import (
    NEAR_DUPLICATE_MIN_JACCARD,
    GroundTruth,
    generate_corpus,
    word_trigram_jaccard,
    write_corpus_jsonl,
)

SIZE = 6000


@pytest.fixture(scope="module")
def corpus() -> tuple[list[dict], GroundTruth]:
    truth = GroundTruth()
    records = list(generate_corpus(SIZE, seed=3, truth=truth))
    return records, truth


def test_records_have_the_documented_fields(corpus) -> None:
    records, _ = corpus
    assert len(records) == SIZE
    assert len({r["id"] for r in records}) == SIZE
    for record in records:
        assert set(record) == {"id", "text", "topic", "score"}
        assert isinstance(record["text"], str) and isinstance(record["score"], float)


def test_texts_are_varied_and_about_100_to_300_characters(corpus) -> None:
    records, truth = corpus
    originals = [r for r in records if r["id"] not in truth.pii]
    lengths = [len(r["text"]) for r in originals]
    assert min(lengths) >= 100
    assert max(lengths) <= 400
    assert 150 <= statistics.median(lengths) <= 260
    planted = set(truth.exact_duplicates)
    distinct = {r["text"] for r in records if r["id"] not in planted}
    assert len(distinct) >= 0.99 * (SIZE - len(planted))


def test_topics_are_balanced_classes(corpus) -> None:
    records, _ = corpus
    counts = {topic: 0 for topic in {r["topic"] for r in records}}
    for record in records:
        counts[record["topic"]] += 1
    assert len(counts) == 4
    assert min(counts.values()) > 0.2 * SIZE


def test_score_follows_the_sentiment_of_the_text(corpus) -> None:
    records, _ = corpus
    positive = [r["score"] for r in records if "excellent" in r["text"]]
    negative = [r["score"] for r in records if "disappointing" in r["text"]]
    assert statistics.mean(positive) > statistics.mean(negative) + 0.05


def test_planted_exact_duplicates_repeat_an_earlier_record(corpus) -> None:
    records, truth = corpus
    by_id = {r["id"]: r for r in records}
    assert abs(len(truth.exact_duplicates) / SIZE - 0.05) < 0.015
    for copy, original in truth.exact_duplicates.items():
        assert original < copy
        assert {**by_id[copy], "id": original} == by_id[original]


def test_planted_near_duplicates_are_close_but_not_identical(corpus) -> None:
    records, truth = corpus
    by_id = {r["id"]: r for r in records}
    assert abs(len(truth.near_duplicates) / SIZE - 0.05) < 0.015
    for copy, original in truth.near_duplicates.items():
        assert original < copy
        assert by_id[copy]["text"] != by_id[original]["text"]
        similarity = word_trigram_jaccard(by_id[copy]["text"], by_id[original]["text"])
        assert similarity >= NEAR_DUPLICATE_MIN_JACCARD > 0.8


def test_planted_pii_is_all_found_and_nothing_else_is(corpus) -> None:
    records, truth = corpus
    assert len(truth.pii) > 0.04 * SIZE
    kinds_seen = set()
    for record in records:
        _, counts = mask_pii(record["text"])
        found = tuple(sorted(kind for kind, count in counts.items() if count))
        assert found == truth.pii.get(record["id"], ()), record["text"]
        kinds_seen.update(found)
    assert kinds_seen == {"email", "phone", "ipv4", "card"}


def test_same_seed_same_corpus_other_seed_other_corpus() -> None:
    first = list(generate_corpus(300, seed=5))
    assert first == list(generate_corpus(300, seed=5))
    assert first != list(generate_corpus(300, seed=6))


def test_generation_streams() -> None:
    # A billion records would not fit in memory: only what is consumed is produced.
    head = list(itertools.islice(generate_corpus(10**9, seed=1), 5))
    assert [r["id"] for r in head] == [f"doc-{i:09d}" for i in range(5)]


def test_jsonl_holds_the_same_records_and_truth(tmp_path: Path) -> None:
    path = tmp_path / "corpus" / "data.jsonl"
    truth = write_corpus_jsonl(path, 500, seed=9, pii_rate=0.2)
    expected_truth = GroundTruth()
    expected = list(generate_corpus(500, seed=9, pii_rate=0.2, truth=expected_truth))
    lines = path.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == expected
    assert truth == expected_truth
    assert json.loads(json.dumps(truth.to_json()))["pii"] == {
        key: list(kinds) for key, kinds in expected_truth.pii.items()
    }


@pytest.mark.parametrize(
    "options",
    [
        {"duplicate_rate": -0.1},
        {"pii_rate": 1.5},
        {"duplicate_rate": 0.6, "near_duplicate_rate": 0.5},
        {"num_classes": 0},
        {"num_classes": 99},
    ],
)
def test_bad_options_are_refused(options: dict) -> None:
    with pytest.raises(ValueError):
        generate_corpus(10, **options)
