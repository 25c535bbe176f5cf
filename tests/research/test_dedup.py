"""De-duplication: MinHash/LSH building blocks and the exact and near Beam transforms."""

from __future__ import annotations

import json
import random
from pathlib import Path

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from research.data import dedup
from research.data.dedup import (
    MERSENNE_PRIME,
    DeduplicateExact,
    DeduplicateNear,
    band_hashes,
    estimate_jaccard,
    minhash_signature,
    near_duplicate_rows,
    optimal_lsh_params,
    permutations,
    shingle_hashes,
    text_signatures,
)
from research.data.records import DROPPED_TAG, METRICS_NAMESPACE, make_rank
from research.data.rejects import read_entries, write_entries
from research.data.runners import IN_PROCESS_RUNNER as RUNNER
from research.data.spec import NearDedupSpec
from research.data.synthetic import GroundTruth, generate_corpus

LONG_TEXT = (
    "The quick brown fox jumps over the lazy dog near the quiet river bank in the early "
    "morning light while the birds sing and the old ferry waits at the harbour for tourists"
)


# --------------------------------------------------------------------------- shingles


def test_word_shingles_ignore_case_and_punctuation() -> None:
    assert len(shingle_hashes("one two three four five")) == 3
    assert np.array_equal(
        shingle_hashes("One, two; THREE four!"), shingle_hashes("one two three four")
    )


def test_shingles_depend_on_word_order() -> None:
    assert not np.array_equal(shingle_hashes("a b c"), shingle_hashes("c b a"))


def test_short_text_is_one_shingle_and_empty_text_none() -> None:
    assert len(shingle_hashes("just two", ngram=3)) == 1
    assert len(shingle_hashes("   ")) == 0


def test_char_shingles_see_inside_words() -> None:
    assert len(shingle_hashes("abcdef", "char", 3)) == 4
    assert (
        len(np.intersect1d(shingle_hashes("colour", "char", 3), shingle_hashes("color", "char", 3)))
        == 2
    )


def test_shingle_hashes_are_stable_values() -> None:
    # Never Python's salted hash(): the same text hashes the same in every process.
    first = shingle_hashes("stable across processes and runs")
    assert first.dtype == np.uint64
    assert np.array_equal(first, shingle_hashes("stable across processes and runs"))


# --------------------------------------------------------------------------- MinHash


def test_signature_is_exact_modular_arithmetic() -> None:
    hashes = shingle_hashes(LONG_TEXT)
    a, b = permutations(32)
    expected = [
        min((int(a[j]) * (int(x) >> 32) + int(b[j])) % MERSENNE_PRIME for x in hashes)
        for j in range(32)
    ]
    assert minhash_signature(hashes, 32).tolist() == expected


def test_permutations_are_fixed() -> None:
    a, b = permutations(128)
    assert a.tolist() == dedup.permutations.__wrapped__(128)[0].tolist()
    assert b.tolist() == dedup.permutations.__wrapped__(128)[1].tolist()
    assert (a > 0).all() and (a < MERSENNE_PRIME).all() and (b < MERSENNE_PRIME).all()


def test_batch_signatures_equal_one_at_a_time() -> None:
    texts = [LONG_TEXT, "short", "", LONG_TEXT.upper(), "other words entirely here"]
    batch = text_signatures(texts, "word", 3, 64)
    for row, text in zip(batch, texts, strict=True):
        assert np.array_equal(row, minhash_signature(shingle_hashes(text), 64))
    assert (batch[2] == MERSENNE_PRIME).all()  # no shingles


@pytest.mark.parametrize("offset", [100, 333, 667])
def test_estimate_tracks_true_jaccard(offset: int) -> None:
    universe = np.random.default_rng(7).integers(0, 2**63, size=2000, dtype=np.uint64)
    first, second = universe[:1000], universe[offset : offset + 1000]
    actual = (1000 - offset) / (1000 + offset)
    estimate = estimate_jaccard(minhash_signature(first, 512), minhash_signature(second, 512))
    assert abs(estimate - actual) < 0.07


def test_estimate_of_identical_and_disjoint_texts() -> None:
    sig = minhash_signature(shingle_hashes(LONG_TEXT))
    assert estimate_jaccard(sig, sig.copy()) == 1.0
    other = minhash_signature(shingle_hashes("nothing at all in common with that sentence"))
    assert estimate_jaccard(sig, other) < 0.1


def test_signatures_of_different_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="differ in length"):
        estimate_jaccard(np.zeros(4), np.zeros(8))


# --------------------------------------------------------------------------- LSH


def test_optimal_params_match_the_classic_choice() -> None:
    assert optimal_lsh_params(0.8, 128) == (9, 13)


@pytest.mark.parametrize("threshold", [0.3, 0.5, 0.7, 0.9])
@pytest.mark.parametrize("num_perm", [32, 128, 256])
def test_optimal_params_fit_and_centre_on_the_threshold(threshold: float, num_perm: int) -> None:
    bands, rows = optimal_lsh_params(threshold, num_perm)
    assert bands * rows <= num_perm
    # The S-curve's steepest point (1/b)**(1/r) sits near the threshold.
    assert abs((1 / bands) ** (1 / rows) - threshold) < 0.15


def test_weighting_false_negatives_buys_more_bands() -> None:
    balanced = optimal_lsh_params(0.8, 128)
    recall_first = optimal_lsh_params(0.8, 128, 0.2, 0.8)
    assert recall_first[0] > balanced[0]


def test_band_hashes_change_only_where_the_signature_does() -> None:
    signature = minhash_signature(shingle_hashes(LONG_TEXT))
    changed = signature.copy()
    changed[20] += 1  # inside band 1 of (4 bands x 16 rows)
    hashes = band_hashes(np.stack([signature, signature, changed]), 4, 16)
    assert np.array_equal(hashes[0], hashes[1])
    assert [hashes[0][band] == hashes[2][band] for band in range(4)] == [True, False, True, True]


def test_too_many_bands_are_refused() -> None:
    with pytest.raises(ValueError, match="exceed"):
        band_hashes(np.zeros((1, 16), dtype=np.uint64), 5, 4)


def test_near_duplicate_rows_compare_with_earlier_rows_only() -> None:
    rows = np.array([[1, 2, 3, 4], [9, 9, 9, 9], [1, 2, 3, 5], [9, 9, 9, 8], [1, 2, 3, 4]])
    # (row, the first earlier row it agrees with, positions agreeing)
    assert near_duplicate_rows(rows, needed=3) == [(2, 0, 3), (3, 1, 3), (4, 0, 4)]
    assert near_duplicate_rows(rows, needed=4) == [(4, 0, 4)]


# --------------------------------------------------------------------------- pipelines


def ranked(rows: list[dict]) -> list[dict]:
    return [
        {**row, "_rank": make_rank(0, "data.jsonl", i), "_origin": f"data.jsonl:{i}"}
        for i, row in enumerate(rows)
    ]


def exact(workdir: Path, fields: list[str] | None = None) -> DeduplicateExact:
    return DeduplicateExact(fields, temp_dir=str(workdir / "scratch"))


def near(workdir: Path, spec: NearDedupSpec) -> DeduplicateNear:
    return DeduplicateNear(spec, temp_dir=str(workdir / "scratch"))


def run(
    records: list[dict], transform: beam.PTransform, workdir: Path, check=None
) -> tuple[list[str], dict[str, int]]:
    """Run ``transform`` over shuffled ``records``: the kept ranks (sorted) and counters."""
    kept, _, counters = run_with_drops(records, transform, workdir, check)
    return kept, counters


def run_with_drops(
    records: list[dict], transform: beam.PTransform, workdir: Path, check=None
) -> tuple[list[str], list[dict], dict[str, int]]:
    """Like ``run``, plus the dropped.jsonl entries in input order."""
    shuffled = list(records)
    random.Random(len(records)).shuffle(shuffled)
    kept_file, dropped_file = workdir / "kept.json", workdir / "dropped.jsonl"
    pipeline = TestPipeline(runner=RUNNER)
    outputs = pipeline | beam.Create(shuffled) | transform
    if check is not None:
        assert_that(outputs.records, check)
    (
        outputs.records
        | beam.Map(lambda record: record["_rank"])
        | beam.combiners.ToList()
        | beam.Map(lambda ranks: kept_file.write_text(json.dumps(sorted(ranks))))
    )
    (
        outputs[DROPPED_TAG]
        | "Dropped" >> beam.combiners.ToList()
        | "WriteDropped" >> beam.Map(write_entries, str(dropped_file))
    )
    result = pipeline.run()
    result.wait_until_finish()
    query = result.metrics().query(MetricsFilter().with_namespace(METRICS_NAMESPACE))
    counters = {counter.key.metric.name: counter.committed for counter in query["counters"]}
    return json.loads(kept_file.read_text()), read_entries(dropped_file), counters


def test_exact_keeps_the_smallest_rank_of_each_group(tmp_path: Path) -> None:
    records = ranked(
        [
            {"text": "b", "n": 1},
            {"text": "a", "n": 1},
            {"text": "b", "n": 1},
            {"text": "b", "n": 2},
            {"text": "a", "n": 1},
            {"text": "c", "n": None},
            {"text": "c", "n": None},
        ]
    )
    expected = [records[i] for i in (0, 1, 3, 5)]
    kept, counters = run(records, exact(tmp_path), tmp_path, equal_to(expected))
    assert kept == [r["_rank"] for r in expected]
    assert counters == {"dedup.exact.merged": 3}


def test_exact_on_chosen_fields_ignores_the_others(tmp_path: Path) -> None:
    records = ranked(
        [{"id": "x", "text": "same"}, {"id": "y", "text": "same"}, {"id": "z", "text": "new"}]
    )
    kept, counters = run(records, exact(tmp_path, ["text"]), tmp_path)
    assert kept == [records[0]["_rank"], records[2]["_rank"]]
    assert counters == {"dedup.exact.merged": 1}


def test_exact_hashes_bytes_as_bytes_and_keeps_distinct_records(tmp_path: Path) -> None:
    records = ranked(
        [
            {"image": b"\x00\x01", "label": "a"},
            {"image": b"\x00\x01", "label": "a"},
            {"image": b"\x00\x02", "label": "a"},
            {"image": "\x00\x01", "label": "a"},  # a string is not the same bytes
            {"image": b"\x00\x01", "label": "b"},
        ]
    )
    kept, counters = run(records, exact(tmp_path), tmp_path)
    assert kept == [records[i]["_rank"] for i in (0, 2, 3, 4)]
    assert counters == {"dedup.exact.merged": 1}


def test_distinct_records_are_untouched(tmp_path: Path) -> None:
    records = ranked([{"text": f"record number {i} says {i * 7}"} for i in range(50)])
    kept, counters = run(
        records, near(tmp_path, NearDedupSpec(field="text")), tmp_path, equal_to(records)
    )
    assert len(kept) == 50
    assert counters == {}


def test_near_keeps_the_smallest_rank_and_records_without_text(tmp_path: Path) -> None:
    records = ranked(
        [
            {"text": None},
            {"text": LONG_TEXT + " tonight"},
            {"text": LONG_TEXT},
            {"text": ""},
            {"text": LONG_TEXT.replace("fox", "Fox") + "!"},
            {"text": "an unrelated sentence about something else entirely"},
        ]
    )
    kept, counters = run(records, near(tmp_path, NearDedupSpec(field="text")), tmp_path)
    assert kept == [records[i]["_rank"] for i in (0, 1, 3, 5)]
    assert counters == {"dedup.near.merged": 2}


def test_records_without_text_are_never_near_duplicates(tmp_path: Path) -> None:
    records = ranked([{"text": None}, {"text": ""}, {"text": "  "}, {"text": None}])
    kept, counters = run(records, near(tmp_path, NearDedupSpec(field="text")), tmp_path)
    assert kept == [record["_rank"] for record in records]
    assert counters == {}


@pytest.fixture(scope="module")
def corpus() -> tuple[list[dict], GroundTruth]:
    truth = GroundTruth()
    rows = list(
        generate_corpus(2500, seed=11, duplicate_rate=0.0, near_duplicate_rate=0.1, truth=truth)
    )
    return ranked(rows), truth


def test_near_finds_planted_near_duplicates_with_high_precision_and_recall(
    corpus, tmp_path: Path
) -> None:
    records, truth = corpus
    kept, counters = run(
        records, near(tmp_path, NearDedupSpec(field="text", threshold=0.8)), tmp_path
    )
    rank_to_id = {record["_rank"]: record["id"] for record in records}
    dropped = set(rank_to_id) - set(kept)
    dropped_ids = {rank_to_id[rank] for rank in dropped}
    planted = set(truth.near_duplicates)
    assert len(planted) > 150
    recall = len(dropped_ids & planted) / len(planted)
    precision = len(dropped_ids & planted) / len(dropped_ids)
    assert recall >= 0.9
    assert precision >= 0.95
    assert counters == {"dedup.near.merged": len(dropped)}


def test_near_results_are_the_same_on_every_run(corpus, tmp_path: Path) -> None:
    records, _ = corpus
    sample = records[:400]
    spec = NearDedupSpec(field="text", threshold=0.8, shingle="char", ngram=5, num_perm=64)
    first, _ = run(sample, near(tmp_path, spec), tmp_path)
    second, _ = run(list(reversed(sample)), near(tmp_path, spec), tmp_path)
    assert first == second
    assert len(first) < len(sample) - 10


# --------------------------------------------------------------------------- dropped.jsonl


def test_exact_drops_name_the_record_kept_in_input_order(tmp_path: Path) -> None:
    records = ranked(
        [{"text": "b"}, {"text": "a"}, {"text": "b"}, {"text": "c"}, {"text": "a"}, {"text": "b"}]
    )
    _, dropped, counters = run_with_drops(records, exact(tmp_path), tmp_path)
    assert [(e["origin"], e["kept"], e["similarity"]) for e in dropped] == [
        ("data.jsonl:2", "data.jsonl:0", 1.0),
        ("data.jsonl:4", "data.jsonl:1", 1.0),
        ("data.jsonl:5", "data.jsonl:0", 1.0),
    ]
    assert {e["rule"] for e in dropped} == {"dedup.exact.merged"}
    assert {e["stage"] for e in dropped} == {"dedup"}
    assert dropped[0]["reason"] == "exact duplicate of data.jsonl:0 (similarity 1.00)"
    assert dropped[0]["raw"] == "{'text': 'b'}"
    assert counters == {"dedup.exact.merged": len(dropped)}


def words_text(words: list[int]) -> str:
    return " ".join(f"word{index}" for index in words)


def test_a_chain_of_near_duplicates_names_the_record_that_survived(tmp_path: Path) -> None:
    # b shares 30 of 46 word trigrams with a (Jaccard 0.65), c as many with b, but only
    # 22 of 54 with a (0.41): c is a near duplicate of b, which repeats a.
    a = list(range(40))
    b = [*range(32), *range(100, 108)]
    c = [*range(200, 208), *range(8, 32), *range(100, 108)]
    records = ranked([{"text": words_text(words)} for words in (a, b, c)])
    spec = NearDedupSpec(field="text", threshold=0.55, num_perm=512)
    kept, dropped, _ = run_with_drops(records, near(tmp_path, spec), tmp_path)
    assert kept == [records[0]["_rank"]]
    assert [(e["origin"], e["kept"]) for e in dropped] == [
        ("data.jsonl:1", "data.jsonl:0"),
        ("data.jsonl:2", "data.jsonl:0"),
    ]
    assert dropped[1]["reason"].startswith("near duplicate of data.jsonl:1 (similarity 0.6")
    assert dropped[1]["reason"].endswith("itself a duplicate of data.jsonl:0, which was kept")
    assert all(0.55 <= e["similarity"] < 0.8 for e in dropped)


def test_dropped_entries_are_the_same_on_every_run(corpus, tmp_path: Path) -> None:
    records, _ = corpus
    sample = records[:300]
    spec = NearDedupSpec(field="text", threshold=0.8)
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    _, first, _ = run_with_drops(sample, near(tmp_path, spec), tmp_path / "first")
    _, second, _ = run_with_drops(list(reversed(sample)), near(tmp_path, spec), tmp_path / "second")
    assert first == second
    assert len(first) > 10
    origins = [entry["origin"] for entry in first]
    assert origins == sorted(origins, key=lambda origin: int(origin.rsplit(":", 1)[1]))


@pytest.mark.parametrize("rounds", [0, 1, 2, 5])
def test_a_long_chain_is_followed_to_the_record_kept_whatever_the_rounds(
    rounds: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each text shifts the previous one by 8 of its 40 words: Jaccard 0.65 with its
    # neighbours, 0.41 two steps away. Chains of 11 and 3 links, joined by a record
    # kept, need several jumps, and with few rounds, the side input, to reach their end.
    monkeypatch.setattr(dedup, "CHAIN_ROUNDS", rounds)
    long_chain = [words_text(list(range(8 * step, 8 * step + 40))) for step in range(12)]
    short_chain = [words_text(list(range(1000 + 8 * step, 1040 + 8 * step))) for step in range(4)]
    records = ranked([{"text": text} for text in long_chain + short_chain])
    spec = NearDedupSpec(field="text", threshold=0.55, num_perm=512)
    kept, dropped, counters = run_with_drops(records, near(tmp_path, spec), tmp_path)
    assert kept == [records[0]["_rank"], records[12]["_rank"]]
    assert [(e["origin"], e["kept"]) for e in dropped] == [
        *((f"data.jsonl:{i}", "data.jsonl:0") for i in range(1, 12)),
        *((f"data.jsonl:{i}", "data.jsonl:12") for i in range(13, 16)),
    ]
    assert dropped[5]["reason"].startswith("near duplicate of data.jsonl:5 (similarity 0.6")
    assert dropped[5]["reason"].endswith("itself a duplicate of data.jsonl:0, which was kept")
    assert counters == {"dedup.near.merged": 14}
