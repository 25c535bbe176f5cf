"""Whole dataset builds on Beam's in-process runner, checked against what went in.

Each input is built once per module and shared by the tests that inspect it; every
expectation comes from the raw input (or the generator's ground truth), never from
the pipeline's own modules.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sentencepiece as spm

from contracts.dataset_manifest import load_manifest
from research.data.input_pipeline import PAD_ID, make_dataset
from research.data.pipeline import BuildResult, build_dataset
from research.data.spec import load_spec
from research.data.synthetic import GroundTruth, write_corpus_jsonl
from research.data.validate import validate_dataset
from tests.support.cli import slipway
from tests.support.raw_data import copy_example_spec, write_digits, write_spec
from tests.support.shards import (
    all_examples,
    png_pixels,
    read_examples,
    shard_hashes,
    text_of,
    tree_digest,
)


def luhn_valid(digits: str) -> bool:
    """The Luhn check written out here, independently of the masker's own."""
    total = 0
    for position, char in enumerate(reversed(digits)):
        value = int(char) * (2 if position % 2 else 1)
        total += value - 9 if value > 9 else value
    return total % 10 == 0


MULTI_THREADED = ["--direct_num_workers=2", "--direct_running_mode=multi_threading"]


def counter(result: BuildResult, rule: str) -> int:
    return sum(entry["count"] for entry in result.report["rules"] if entry["rule"] == rule)


def written(result: BuildResult) -> int:
    return sum(result.report["records_written"].values())


# --------------------------------------------------------------------------- digits

DIGIT_DUPLICATES = (3, 100, 517, 1000, 1500, 1796)


DigitKeys = Counter[tuple[str, bytes]]  # (label, raw 8x8 pixels) -> records


@dataclass(frozen=True)
class Digits:
    images: np.ndarray
    labels: np.ndarray
    npz: BuildResult
    folder: BuildResult
    written: dict[str, dict[str, DigitKeys]]  # source -> split -> what its shards hold


def digit_keys(examples: list[dict[str, list]]) -> DigitKeys:
    """(label, raw pixels) of every example, after checking each image is 8x8x1."""
    keys: DigitKeys = Counter()
    for example in examples:
        pixels = png_pixels(example["image"][0])
        assert pixels.shape == (8, 8, 1) and pixels.dtype == np.uint8
        keys[(example["label"][0].decode(), pixels.tobytes())] += 1
    return keys


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> Digits:
    raw = tmp_path_factory.mktemp("digits")
    images, labels = write_digits(raw, DIGIT_DUPLICATES)
    npz = build_dataset(load_spec(copy_example_spec("digits.yaml", raw)), raw / "out" / "digits")
    folder = build_dataset(
        load_spec(copy_example_spec("digits_images.yaml", raw)), raw / "out" / "digits-images"
    )
    written = {
        source: {
            split: digit_keys(examples)
            for split, examples in read_examples(Path(result.output_dir)).items()
        }
        for source, result in (("npz", npz), ("folder", folder))
    }
    return Digits(images, labels, npz, folder, written)


@pytest.mark.parametrize("source", ["npz", "folder"])
def test_digits_counts_add_up_to_input_minus_merged_duplicates(digits: Digits, source: str) -> None:
    result: BuildResult = getattr(digits, source)
    assert result.report["records_read"] == len(digits.images)
    assert counter(result, "dedup.exact.merged") == len(DIGIT_DUPLICATES)
    assert result.report["records_merged"] == len(DIGIT_DUPLICATES)
    assert result.report["records_quarantined"] == 0
    assert written(result) == len(digits.images) - len(DIGIT_DUPLICATES)
    assert {name: split.num_records for name, split in result.manifest.splits.items()} == (
        result.report["records_written"]
    )
    assert set(result.manifest.splits) == {"train", "validation", "test"}
    assert all(result.report["records_written"].values())


@pytest.mark.parametrize("source", ["npz", "folder"])
def test_digit_labels_are_the_ten_classes_in_natural_order(digits: Digits, source: str) -> None:
    manifest = getattr(digits, source).manifest
    assert manifest.labels == ["label"]
    assert manifest.features["label"].is_label
    assert manifest.features["label"].vocabulary == tuple(str(digit) for digit in range(10))


@pytest.mark.parametrize("source", ["npz", "folder"])
def test_digit_images_are_the_source_pixels_once_each(digits: Digits, source: str) -> None:
    written_keys = sum(digits.written[source].values(), Counter())
    source_keys = {
        (str(label), image[..., None].tobytes())
        for image, label in zip(digits.images, digits.labels, strict=True)
    }
    assert written_keys == Counter(dict.fromkeys(source_keys, 1))
    # A sampled record, found by its label and pixels, is there exactly once.
    index = 1234
    assert written_keys[(str(digits.labels[index]), digits.images[index].tobytes())] == 1


def test_npz_and_folder_put_the_same_digits_in_the_same_splits(digits: Digits) -> None:
    assert digits.written["npz"] == digits.written["folder"]
    assert digits.npz.report["records_written"] == digits.folder.report["records_written"]
    code = slipway(
        "data",
        "validate",
        Path(digits.folder.output_dir),
        "--reference",
        Path(digits.npz.output_dir),
    )
    assert code == 0


# --------------------------------------------------------------------------- corpus

CORPUS_SIZE = 1000
EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
CARD_CANDIDATE = re.compile(r"(?<![\d-])\d(?:[ -]?\d){12,18}(?![\d])")
IPV4_CANDIDATE = re.compile(r"(?<![\w.])(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})(?![\w]|\.\d)")
PLACEHOLDERS = ("[EMAIL]", "[PHONE]", "[IPV4]", "[CARD]")


def personal_data(text: str) -> list[str]:
    """E-mails, Luhn-valid card numbers and IPv4 addresses found by plain regexes."""
    found = EMAIL.findall(text)
    for match in CARD_CANDIDATE.finditer(text):
        digits = re.sub(r"\D", "", match.group(0))
        if luhn_valid(digits):
            found.append(match.group(0))
    for match in IPV4_CANDIDATE.finditer(text):
        if all(int(octet) <= 255 for octet in match.groups()):
            found.append(match.group(0))
    return found


@dataclass(frozen=True)
class Corpus:
    raw: Path
    records: list[dict[str, Any]]
    truth: GroundTruth
    result: BuildResult
    examples: list[dict[str, list]]

    @property
    def texts(self) -> list[str]:
        return [text_of(example, "text") for example in self.examples]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    raw = tmp_path_factory.mktemp("corpus")
    truth = write_corpus_jsonl(
        raw / "corpus.jsonl",
        CORPUS_SIZE,
        seed=11,
        duplicate_rate=0.08,
        near_duplicate_rate=0.08,
        pii_rate=0.15,
    )
    lines = (raw / "corpus.jsonl").read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines]
    result = build_dataset(load_spec(copy_example_spec("corpus.yaml", raw)), raw / "out" / "corpus")
    return Corpus(raw, records, truth, result, all_examples(Path(result.output_dir)))


def test_corpus_exact_duplicates_merged_are_the_planted_ones(corpus: Corpus) -> None:
    assert len(corpus.truth.exact_duplicates) > 50
    seen: set[str] = set()
    repeats = set()
    for record in corpus.records:
        if record["text"] in seen:
            repeats.add(record["id"])
        seen.add(record["text"])
    planted = set(corpus.truth.exact_duplicates)
    assert planted <= repeats
    # Two near copies of one original may receive the same edit: an exact pair too.
    accidental = repeats - planted
    assert accidental <= set(corpus.truth.near_duplicates)
    assert len(accidental) <= 0.05 * len(corpus.truth.near_duplicates)
    assert counter(corpus.result, "dedup.exact.merged") == len(planted) + len(accidental)


def test_corpus_near_duplicates_are_found_and_originals_kept(corpus: Corpus) -> None:
    truth = corpus.truth
    by_id = {record["id"]: record for record in corpus.records}
    kept = set(corpus.texts)
    near_copies = [by_id[copy]["text"] for copy in truth.near_duplicates]
    assert len(near_copies) > 50
    recall = sum(text not in kept for text in near_copies) / len(near_copies)
    assert recall >= 0.9
    merged = counter(corpus.result, "dedup.near.merged")
    assert 0.9 * len(near_copies) <= merged <= len(near_copies)
    planted = set(truth.exact_duplicates) | set(truth.near_duplicates) | set(truth.pii)
    originals = [record["text"] for record in corpus.records if record["id"] not in planted]
    lost = sum(text not in kept for text in originals)
    assert lost <= 0.01 * len(originals)
    report = corpus.result.report
    assert report["records_dropped"] == report["records_quarantined"] == 0
    assert written(corpus.result) == CORPUS_SIZE - report["records_merged"]
    assert len(corpus.examples) == written(corpus.result)


def test_corpus_masking_counts_match_the_planted_personal_data(corpus: Corpus) -> None:
    planted = Counter(kind for kinds in corpus.truth.pii.values() for kind in kinds)
    assert set(planted) == {"email", "phone", "ipv4", "card"}
    for kind, number in planted.items():
        assert counter(corpus.result, f"clean.masked.{kind}") == number, kind
    assert counter(corpus.result, "clean.records_masked") == len(corpus.truth.pii)
    assert corpus.result.report["pii_replacements"] == sum(planted.values())


def test_no_personal_data_reaches_the_shards(corpus: Corpus) -> None:
    raw_found = [found for r in corpus.records for found in personal_data(r["text"])]
    # The scan is able to see what was planted in the input...
    planted = Counter(kind for kinds in corpus.truth.pii.values() for kind in kinds)
    assert len(raw_found) >= planted["email"] + planted["card"] + planted["ipv4"]
    # ...and sees none of it in what was written.
    leaks = {text: personal_data(text) for text in corpus.texts if personal_data(text)}
    assert leaks == {}
    joined = "\n".join(corpus.texts)
    for placeholder in PLACEHOLDERS:
        assert placeholder in joined
    # Look-alikes that are not personal data survive.
    for lookalike in ("2024-05-01", "2.4.1", "3.10.12", "7731-22"):
        assert lookalike in joined


def dropped_entries(result: BuildResult) -> list[dict[str, Any]]:
    lines = (Path(result.output_dir) / "dropped.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


def test_every_merged_duplicate_is_logged_with_the_record_kept(corpus: Corpus) -> None:
    origin = {record["id"]: f"corpus.jsonl:{line}" for line, record in enumerate(corpus.records, 1)}
    entries = dropped_entries(corpus.result)
    assert len(entries) == corpus.result.report["records_merged"]
    by_origin = {entry["origin"]: entry for entry in entries}
    for copy, original in corpus.truth.exact_duplicates.items():
        entry = by_origin[origin[copy]]
        assert (entry["rule"], entry["kept"], entry["similarity"]) == (
            "dedup.exact.merged",
            origin[original],
            1.0,
        )
    truth = corpus.truth.near_duplicates
    near = {
        copy: by_origin[origin[copy]]
        for copy in truth
        if by_origin.get(origin[copy], {}).get("rule") == "dedup.near.merged"
    }
    assert len(near) >= 0.85 * len(truth)
    kept_original = sum(entry["kept"] == origin[truth[copy]] for copy, entry in near.items())
    assert kept_original >= 0.9 * len(near)
    assert all(0.8 <= entry["similarity"] <= 1.0 for entry in near.values())
    lines = [int(entry["origin"].rsplit(":", 1)[1]) for entry in entries]
    assert lines == sorted(lines)


def test_text_fields_get_the_sentencepiece_model_the_manifest_names(corpus: Corpus) -> None:
    manifest = corpus.result.manifest
    root = Path(corpus.result.output_dir)
    text = manifest.features["text"]
    assert text.tokenizer_file == "tokenizers/text.model"
    assert manifest.vocabularies == {"text": "tokenizers/text.model"}
    model = (root / text.tokenizer_file).read_bytes()
    assert text.tokenizer_sha256 == hashlib.sha256(model).hexdigest()
    processor = spm.SentencePieceProcessor(model_proto=model)
    assert (processor.pad_id(), processor.unk_id()) == (0, 1)
    assert text.vocab_size == processor.get_piece_size() <= 2000
    assert not any(key.startswith("text/") for example in corpus.examples for key in example)
    for split in manifest.splits:
        lengths = [
            len(processor.encode(text_of(example, "text")))
            for example in read_examples(root, split)[split]
        ]
        quantiles = manifest.statistics[split]["features"]["text"]["token_quantiles"]
        assert quantiles["p100"] == max(lengths) and quantiles["p0"] == min(lengths)
    assert validate_dataset(root).ok


def test_corpus_labels_keep_topic_and_score_together(corpus: Corpus) -> None:
    manifest = corpus.result.manifest
    assert manifest.labels == ["topic", "score"]
    assert set(manifest.features) == {"text", "topic", "score"}
    expected = {
        (record["text"], record["topic"]): record["score"]
        for record in corpus.records
        if record["id"] not in corpus.truth.pii
    }
    checked = 0
    for example in corpus.examples:
        key = (text_of(example, "text"), text_of(example, "topic"))
        if key in expected:
            assert example["score"][0] == pytest.approx(expected[key], abs=1e-6)
            checked += 1
    assert checked > 0.8 * len(corpus.examples)


def test_rebuilding_the_same_spec_gives_byte_identical_datasets(
    corpus: Corpus, tmp_path: Path
) -> None:
    """Even with bundles spread over two worker threads rather than one."""
    spec = load_spec(corpus.raw / "corpus.yaml")
    again = build_dataset(spec, tmp_path / "corpus", beam_args=MULTI_THREADED)
    first = corpus.result
    assert again.manifest.spec_hash == first.manifest.spec_hash == spec.spec_hash()
    first_json = first.manifest.to_json()
    again_json = again.manifest.to_json()
    first_json.pop("created")
    again_json.pop("created")
    assert again_json == first_json
    first_files = tree_digest(first.output_dir)
    again_files = tree_digest(again.output_dir)
    first_files.pop("manifest.json")
    again_files.pop("manifest.json")
    assert again_files == first_files
    assert again.report == first.report


# --------------------------------------------------------------------------- broken CSV

BROKEN_CSV = (
    b"id,x,colour,note\n"
    b"1,0.5,red,first row\n"
    b'2,1.5,blue,"a note over\ntwo lines"\n'
    b"3,2.5,green,third   row\n"
    b"4,abc,red,not a number\n"  # line 6
    b"5,3.5,red\n"  # line 7
    b"6,4.5,blue,caf\xe9 in latin-1\n"  # line 8
    b"7,5.5,green,seventh row\n"
    b"8,,blue,missing x\n"
    b"9,6.5,red,1,extra\n"  # line 11
) + b"".join(f"{n},{n / 4},{'red' if n % 2 else 'green'},row {n}\n".encode() for n in range(10, 40))
BAD_LINES = {
    6: "expected numeric float32, got 'abc'",
    7: "expected 4 columns, got 3",
    8: "not valid UTF-8",
    11: "expected 4 columns, got 5",
}
GOOD_IDS = {1, 2, 3, 7, 8, *range(10, 40)}


@pytest.fixture(scope="module")
def broken_csv(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, BuildResult]:
    raw = tmp_path_factory.mktemp("broken")
    (raw / "table.csv").write_bytes(BROKEN_CSV)
    spec = write_spec(
        raw / "table.yaml",
        {
            "name": "table",
            "sources": [{"type": "csv", "path": "table.csv"}],
            "infer_schema": False,
            "schema": {
                "id": {"type": "numeric", "dtype": "int64"},
                "x": {"type": "numeric"},
                "colour": {"type": "categorical"},
                "note": {"type": "text"},
            },
            "vocab": {"size": 64},
            "output": {"num_shards": 2},
        },
    )
    return spec, build_dataset(load_spec(spec), raw / "out" / "table")


def test_bad_csv_rows_are_quarantined_with_line_and_reason(
    broken_csv: tuple[Path, BuildResult],
) -> None:
    _, result = broken_csv
    lines = (Path(result.output_dir) / "quarantine.jsonl").read_text(encoding="utf-8").splitlines()
    entries = [json.loads(line) for line in lines]
    by_line = {int(entry["origin"].rsplit(":", 1)[1]): entry for entry in entries}
    assert len(entries) == len(by_line) == len(BAD_LINES)
    for line, reason in BAD_LINES.items():
        assert by_line[line]["origin"] == f"table.csv:{line}"
        assert reason in by_line[line]["reason"], by_line[line]
    assert result.report["records_quarantined"] == len(BAD_LINES)
    assert result.report["records_read"] == len(GOOD_IDS) + 1  # the bad number is read first


def test_every_good_csv_row_is_written_once_with_its_values(
    broken_csv: tuple[Path, BuildResult],
) -> None:
    _, result = broken_csv
    examples = all_examples(Path(result.output_dir))
    ids = [example["id"][0] for example in examples]
    assert sorted(ids) == sorted(GOOD_IDS)
    by_id = {example["id"][0]: example for example in examples}
    assert text_of(by_id[2], "note") == "a note over two lines"
    assert text_of(by_id[3], "note") == "third row"
    assert by_id[7]["x"] == [5.5] and text_of(by_id[7], "colour") == "green"
    assert "x" not in by_id[8]  # a missing value is left out, read as the default
    assert written(result) == len(GOOD_IDS)


@pytest.fixture(scope="module")
def broken_csv_again(
    broken_csv: tuple[Path, BuildResult], tmp_path_factory: pytest.TempPathFactory
) -> BuildResult:
    spec, _ = broken_csv
    out = tmp_path_factory.mktemp("broken_again") / "table"
    return build_dataset(load_spec(spec), out, beam_args=MULTI_THREADED)


def test_rebuilding_with_quarantined_rows_gives_the_same_dataset(
    broken_csv: tuple[Path, BuildResult], broken_csv_again: BuildResult
) -> None:
    _, first = broken_csv
    first_files = tree_digest(first.output_dir)
    again_files = tree_digest(broken_csv_again.output_dir)
    first_files.pop("manifest.json")  # it records when it was made
    again_files.pop("manifest.json")
    assert again_files == first_files  # the logs included
    assert {"quarantine.jsonl", "dropped.jsonl"} <= set(first_files)
    assert broken_csv_again.manifest.spec_hash == first.manifest.spec_hash
    assert shard_hashes(broken_csv_again.output_dir) == shard_hashes(first.output_dir)


def test_quarantine_lines_come_in_input_order_on_every_runner_setup(
    broken_csv_again: BuildResult,
) -> None:
    lines = (Path(broken_csv_again.output_dir) / "quarantine.jsonl").read_text(encoding="utf-8")
    origins = [json.loads(line)["origin"] for line in lines.splitlines()]
    assert origins == [f"table.csv:{line}" for line in sorted(BAD_LINES)]


# --------------------------------------------------------------------------- every type

EVERY_TYPE_RECORDS = 120
WORDS = ("alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta")


@dataclass(frozen=True)
class EveryType:
    arrays: dict[str, np.ndarray]
    clean_texts: list[str]
    result: BuildResult


@pytest.fixture(scope="module")
def every_type(tmp_path_factory: pytest.TempPathFactory) -> EveryType:
    raw = tmp_path_factory.mktemp("every_type")
    rng = np.random.default_rng(5)
    n = EVERY_TYPE_RECORDS
    texts, clean_texts = [], []
    for index in range(n):
        words = list(rng.choice(WORDS, size=int(rng.integers(2, 7))))
        raw_text = "  ".join(words)  # doubled spaces are collapsed by cleaning
        clean = " ".join(words)
        if index % 7 == 0:
            raw_text = f"ﬁle to user{index}@example.com \t{raw_text}"  # NFKC folds the ligature
            clean = f"file to [EMAIL] {clean}"
        texts.append(raw_text)
        clean_texts.append(clean)
    arrays = {
        "serial": np.arange(n, dtype=np.int64) * 3 + 1000,
        "x": rng.normal(0.0, 5.0, size=n).astype(np.float32),
        "vec": rng.uniform(-1.0, 1.0, size=(n, 3)).astype(np.float32),
        "colour": np.array([("red", "green", "blue", "amber")[i % 4] for i in range(n)]),
        "text": np.array(texts),
        "image": rng.integers(0, 256, size=(n, 6, 5, 3), dtype=np.uint8),
        "species": rng.integers(0, 3, size=n),
        "weight": rng.normal(50.0, 10.0, size=n).astype(np.float32),
    }
    np.savez(raw / "every.npz", **arrays)
    spec = write_spec(
        raw / "every.yaml",
        {
            "name": "every-type",
            "sources": [{"type": "npz", "path": "every.npz", "images": ["image"]}],
            "infer_schema": False,
            "schema": {
                "serial": {"type": "numeric", "dtype": "int64"},
                "x": {"type": "numeric"},
                "vec": {"type": "numeric", "shape": [3]},
                "colour": {"type": "categorical"},
                "text": {"type": "text"},
                "image": {"type": "image", "height": 6, "width": 5, "channels": 3},
                "species": {"type": "categorical"},
                "weight": {"type": "numeric"},
            },
            "labels": ["species", "weight"],
            "split": {"ratios": {"train": 0.75, "test": 0.25}},
            "vocab": {"size": 200},
            "output": {"num_shards": {"train": 3, "test": 1}, "compression": "gzip"},
        },
    )
    result = build_dataset(load_spec(spec), raw / "out" / "every")
    return EveryType(arrays, clean_texts, result)


def test_input_pipeline_reads_back_every_feature_type(every_type: EveryType) -> None:
    arrays, result = every_type.arrays, every_type.result
    manifest = load_manifest(Path(result.output_dir))
    processor = spm.SentencePieceProcessor(
        model_file=str(Path(result.output_dir) / manifest.features["text"].tokenizer_file)
    )
    colours = manifest.features["colour"].vocabulary
    species = manifest.features["species"].vocabulary
    assert species == ("0", "1", "2")
    assert set(colours) == {"red", "green", "blue", "amber"}
    seen = []
    x_stats = manifest.statistics["train"]["features"]["x"]
    for split in ("train", "test"):
        read = partial(make_dataset, Path(result.output_dir), split, batch_size=16, shuffle=False)
        for (raw, _), (features, labels) in zip(
            read(raw=True).as_numpy_iterator(), read().as_numpy_iterator(), strict=True
        ):
            assert set(features) == set(raw) == {"serial", "x", "vec", "colour", "text", "image"}
            assert set(labels) == {"species", "weight"}
            for row, serial in enumerate(raw["serial"]):
                index = (int(serial) - 1000) // 3
                seen.append(index)
                assert raw["x"][row] == np.float32(arrays["x"][index])
                standardized = (arrays["x"][index] - x_stats["mean"]) / x_stats["std"]
                assert features["x"][row] == pytest.approx(standardized, rel=1e-5, abs=1e-6)
                np.testing.assert_array_equal(raw["vec"][row], arrays["vec"][index])
                assert raw["colour"][row].decode() == arrays["colour"][index]
                assert colours[features["colour"][row] - 1] == arrays["colour"][index]
                assert raw["text"][row].decode() == every_type.clean_texts[index]
                image = np.round(features["image"][row] * 255.0).astype(np.uint8)
                np.testing.assert_array_equal(image, arrays["image"][index])
                ids = features["text"][row]
                expected = processor.encode(every_type.clean_texts[index])[: len(ids)]
                assert ids[: len(expected)].tolist() == expected
                assert (ids[len(expected) :] == PAD_ID).all()
                assert species[labels["species"][row]] == str(arrays["species"][index])
                assert labels["weight"][row] == arrays["weight"][index]
    assert sorted(seen) == list(range(EVERY_TYPE_RECORDS))


def test_cleaned_text_is_what_the_shards_hold(every_type: EveryType) -> None:
    examples = all_examples(Path(every_type.result.output_dir))
    by_serial = {example["serial"][0]: example for example in examples}
    for index, clean in enumerate(every_type.clean_texts):
        text = text_of(by_serial[1000 + 3 * index], "text")
        assert text == clean
        assert text == unicodedata.normalize("NFKC", text)


# --------------------------------------------------------------------------- accounting


@pytest.mark.parametrize("build", ["digits", "corpus", "broken_csv", "every_type"])
def test_the_logs_hold_a_line_for_every_record_the_report_counts(
    build: str, request: pytest.FixtureRequest
) -> None:
    built = request.getfixturevalue(build)
    result: BuildResult = {
        "digits": lambda: built.npz,
        "corpus": lambda: built.result,
        "broken_csv": lambda: built[1],
        "every_type": lambda: built.result,
    }[build]()
    report = result.report
    quarantine = (Path(result.output_dir) / "quarantine.jsonl").read_text(encoding="utf-8")
    assert len(quarantine.splitlines()) == report["records_quarantined"]
    assert len(dropped_entries(result)) == report["records_dropped"] + report["records_merged"]
    assert report["inputs"] == (
        report["records_quarantined"]
        + report["records_dropped"]
        + report["records_merged"]
        + written(result)
    )
    assert report["quality"]["passed"]
    assert validate_dataset(Path(result.output_dir)).ok


def test_the_breast_cancer_example_reads_the_csv_as_scikit_learn_ships_it(tmp_path: Path) -> None:
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer()
    csv = Path(__import__("sklearn").__file__).parent / "datasets" / "data" / "breast_cancer.csv"
    (tmp_path / "breast_cancer.csv").write_bytes(csv.read_bytes())
    spec = copy_example_spec("breast_cancer.yaml", tmp_path)
    assert slipway("data", "build", spec, "-o", tmp_path / "out") == 0
    manifest = load_manifest(tmp_path / "out")
    assert sum(split.num_records for split in manifest.splits.values()) == len(data.target) == 569
    assert manifest.labels == ["target"]
    assert manifest.features["target"].vocabulary == ("0", "1")
    measurements = [name for name, feature in manifest.features.items() if not feature.is_label]
    assert measurements == [name.replace(" ", "_") for name in data.feature_names]
    by_measurements = {
        (round(e["mean_radius"][0], 2), round(e["mean_texture"][0], 2)): e
        for e in all_examples(tmp_path / "out")
    }
    first = by_measurements[(17.99, 10.38)]  # the CSV's first data row
    assert first["worst_area"][0] == pytest.approx(data.data[0][23])
