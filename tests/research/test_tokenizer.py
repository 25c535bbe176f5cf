"""Learning each text field's sentencepiece model in the dataset build.

Expectations are read with sentencepiece's own Python API and the TFRecord reader,
never with the build's modules.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import sentencepiece as spm

from contracts.dataset_manifest import Manifest, load_manifest
from contracts.features import FeatureSpec
from research.data.pipeline import build_dataset
from research.data.quality import BuildRejectedError
from research.data.spec import VocabSpec, load_spec
from research.data.tokenizer import train_tokenizer
from tests.support.raw_data import write_spec
from tests.support.shards import read_examples, text_of, tree_digest

PLANTED = "quetzalcoatlus"
COMMON = ["the", "river", "runs", "past", "the", "old", "mill", "and", "the", "miller", "sings"]


def corpus_spec(name: str, **vocab: Any) -> dict[str, Any]:
    return {
        "name": name,
        "sources": [{"type": "jsonl", "path": "texts.jsonl"}],
        "infer_schema": False,
        "schema": {"id": {"type": "numeric", "dtype": "int64"}, "text": {"type": "text"}},
        "dedup": {"exact": {"fields": ["id"]}},
        "split": {"ratios": {"train": 0.5, "test": 0.5}, "key": "id"},
        "vocab": {"size": 200, **vocab},
    }


def build(directory: Path, texts: list[str], name: str = "words", **vocab: Any) -> Path:
    """Build a dataset of ``{"id": i, "text": texts[i]}`` in ``directory/out``."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"id": i, "text": text}) for i, text in enumerate(texts)]
    (directory / "texts.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    spec = write_spec(directory / f"{name}.yaml", corpus_spec(name, **vocab))
    return Path(build_dataset(load_spec(spec), directory / "out").output_dir)


def sentence(i: int) -> str:
    return " ".join(COMMON[(i + k) % len(COMMON)] for k in range(6))


def processor(root: Path) -> spm.SentencePieceProcessor:
    feature = load_manifest(root).features["text"]
    return spm.SentencePieceProcessor(model_file=str(root / feature.tokenizer_file))


def split_ids(root: Path, split: str) -> set[int]:
    return {example["id"][0] for example in read_examples(root, split)[split]}


@pytest.fixture(scope="module")
def splits(tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[int]]:
    """Which ids land in which split (the split goes by ``id`` alone, not the text)."""
    root = build(tmp_path_factory.mktemp("plain"), [sentence(i) for i in range(200)])
    return {split: split_ids(root, split) for split in ("train", "test")}


@pytest.mark.parametrize("planted_in", ["train", "test"])
def test_only_the_training_split_shapes_the_vocabulary(
    planted_in: str, splits: dict[str, set[int]], tmp_path: Path
) -> None:
    """A word repeated in every record of one split is a piece only if that split is train."""
    texts = [
        f"{sentence(i)} {PLANTED} {PLANTED}" if i in splits[planted_in] else sentence(i)
        for i in range(200)
    ]
    root = build(tmp_path, texts)
    assert split_ids(root, "test") == splits["test"]
    pieces = processor(root)
    whole_word = pieces.piece_to_id(f"▁{PLANTED}") != pieces.unk_id()
    assert whole_word == (planted_in == "train")


def test_a_rebuild_gives_the_same_bytes_and_the_manifest_records_the_model(
    tmp_path: Path,
) -> None:
    texts = [sentence(i) + f" item{i % 17}" for i in range(120)]
    first = build(tmp_path / "a", texts, model_type="bpe")
    second = build(tmp_path / "b", texts, model_type="bpe")
    digests = tree_digest(first), tree_digest(second)
    assert "tokenizers/text.model" in digests[0]
    manifests = [load_manifest(root).to_json() for root in (first, second)]
    for digest, manifest_json in zip(digests, manifests, strict=True):
        digest.pop("manifest.json")
        manifest_json.pop("created")
    assert digests[0] == digests[1]
    assert manifests[0] == manifests[1]

    manifest = load_manifest(first)
    feature = manifest.features["text"]
    model = (first / "tokenizers" / "text.model").read_bytes()
    assert feature.tokenizer_file == "tokenizers/text.model"
    assert feature.tokenizer_sha256 == hashlib.sha256(model).hexdigest()
    assert feature.vocab_size == processor(first).get_piece_size()
    assert not any(
        "/" in key for example in read_examples(first, "train")["train"] for key in example
    )
    assert Manifest.from_json(manifest.to_json()).to_json() == manifest.to_json()
    assert FeatureSpec.from_json("text", feature.to_json()) == feature


def test_a_corpus_too_small_for_the_size_gets_the_tokens_it_can_fill(tmp_path: Path) -> None:
    root = build(tmp_path, ["a tiny corpus", "of very few words", "a few words"] * 4, size=8000)
    feature = load_manifest(root).features["text"]
    assert feature.vocab_size == processor(root).get_piece_size() < 8000
    pieces = processor(root)
    assert (pieces.pad_id(), pieces.unk_id(), pieces.bos_id(), pieces.eos_id()) == (0, 1, -1, -1)


def test_token_statistics_count_the_learned_models_tokens(tmp_path: Path) -> None:
    texts = [sentence(i) * (1 + i % 5) for i in range(80)]
    root = build(tmp_path, texts)
    pieces = processor(root)
    manifest = load_manifest(root)
    for split in manifest.splits:
        counts = sorted(
            len(pieces.encode(text_of(example, "text")))
            for example in read_examples(root, split)[split]
        )
        quantiles = manifest.statistics[split]["features"]["text"]["token_quantiles"]
        assert (quantiles["p0"], quantiles["p100"]) == (counts[0], counts[-1])


@pytest.mark.process
def test_learning_is_the_same_in_another_process() -> None:
    texts = [sentence(i) + f" n{i}" for i in range(300)]
    here = train_tokenizer(texts, VocabSpec(size=120, model_type="unigram"), "text")
    script = (
        "import sys, json\n"
        "from research.data.spec import VocabSpec\n"
        "from research.data.tokenizer import train_tokenizer\n"
        "texts = json.loads(sys.stdin.read())\n"
        "model = train_tokenizer(texts, VocabSpec(size=120, model_type='unigram'), 'text')\n"
        "sys.stdout.buffer.write(model)\n"
    )
    there = subprocess.run(
        [sys.executable, "-c", script],
        input=json.dumps(texts).encode(),
        capture_output=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    ).stdout
    assert here == there


def test_a_field_without_training_text_is_named() -> None:
    with pytest.raises(ValueError, match="'title'.*no text in the training split"):
        train_tokenizer([], VocabSpec(), "title")


def test_a_build_whose_training_split_has_no_text_is_refused_naming_the_field(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "raw"
    directory.mkdir()
    lines = [json.dumps({"id": i, "text": None}) for i in range(40)]
    (directory / "texts.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    spec = write_spec(directory / "empty.yaml", corpus_spec("empty"))
    with pytest.raises(BuildRejectedError, match="'text': the training split holds no text"):
        build_dataset(load_spec(spec), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def _sample_in_parts(
    texts: list[str], parts: int, max_texts: int, max_characters: int
) -> list[str]:
    from research.data.tokenizer import ContentSample

    combine = ContentSample(max_texts, max_characters)
    accumulators = []
    for part in range(parts):
        accumulator = combine.create_accumulator()
        for text in texts[part::parts]:
            accumulator = combine.add_input(accumulator, text)
        accumulators.append(combine.compact(accumulator))
    return combine.extract_output(combine.merge_accumulators(accumulators))


@pytest.mark.parametrize(("max_texts", "max_characters"), [(10**6, 5_000), (40, 10**9), (40, 900)])
def test_the_sample_is_the_same_however_the_input_is_cut_and_keeps_to_its_budget(
    max_texts: int, max_characters: int
) -> None:
    texts = [f"{sentence(i)} {i} " * (1 + i % 7) for i in range(1000)]
    whole = _sample_in_parts(texts, 1, max_texts, max_characters)
    for parts in (2, 3, 17):
        assert _sample_in_parts(texts, parts, max_texts, max_characters) == whole
    ordered = sorted(texts, key=lambda text: hashlib.sha256(text.encode()).digest())
    assert whole == ordered[: len(whole)]
    assert len(whole) <= max_texts
    assert sum(map(len, whole)) <= max_characters
    assert len(whole) == max_texts or sum(map(len, ordered[: len(whole) + 1])) > max_characters


def test_a_text_longer_than_the_character_budget_is_still_learned_from() -> None:
    texts = ["x" * 100, "y" * 200]
    assert len(_sample_in_parts(texts, 2, 10, 50)) == 1
