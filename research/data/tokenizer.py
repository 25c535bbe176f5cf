"""Each text field's sentencepiece model, learned in the build from the training split.

The build stores text as text; models turn it into token ids in the graph with the
learned model (``research.preprocessing.text``), so training and serving tokenize with
the same ops. What the build does here:

- ``LearnTokenizers``: the texts of each field in the training split (after cleaning,
  de-duplication and the split, so no validation or test text shapes the vocabulary)
  are sampled by the SHA-256 of their content, a sample every runner and every run
  draws alike, down to ``vocab.input_sentence_size`` texts and
  ``vocab.input_characters`` characters; one worker trains the model on them, in that
  order, on one thread with a fixed seed, so the same data always gives the same model
  bytes. The character budget is what bounds that worker's memory: sentencepiece's
  unigram trainer takes about 20 bytes per input character (a million 200-character
  texts would need 4 GiB), whatever the number of texts.
- ``CountTokens``: every record gets its token count per field under the bookkeeping
  key ``TOKEN_COUNTS``, for the token statistics the manifest reports; the ids
  themselves are not stored.

Ids: ``PAD_ID`` 0 and ``UNK_ID`` 1, as the input pipeline expects; no BOS or EOS, which
nothing inserts (the language model learns from the text's own tokens and generates a
set number of them).
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import apache_beam as beam
import sentencepiece as spm

from research.data import filesystems
from research.data.records import TOKEN_COUNTS, PackRecords, Record, count, unpack_records
from research.data.spec import VocabSpec

TOKENIZER_DIR = "tokenizers"
PAD_ID = 0
UNK_ID = 1
_SEED = 1


def tokenizer_path(field: str) -> str:
    """Where a field's model lives, relative to the dataset directory."""
    return f"{TOKENIZER_DIR}/{field}.model"


def train_tokenizer(texts: Sequence[str], spec: VocabSpec, field: str) -> bytes:
    """A serialized sentencepiece model learned from ``texts``, in their order.

    A corpus too small for ``spec.size`` tokens gets as many as it can fill
    (``hard_vocab_limit=False``); the manifest records the real size.
    """
    if not texts:
        raise ValueError(f"text field {field!r}: no text in the training split to learn from")
    model = io.BytesIO()
    spm.set_random_generator_seed(_SEED)
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(texts),
            model_writer=model,
            vocab_size=spec.size,
            model_type=spec.model_type,
            character_coverage=spec.character_coverage,
            input_sentence_size=spec.input_sentence_size,
            shuffle_input_sentence=False,
            hard_vocab_limit=False,
            pad_id=PAD_ID,
            unk_id=UNK_ID,
            bos_id=-1,
            eos_id=-1,
            num_threads=1,
            minloglevel=2,
        )
    except RuntimeError as exc:
        raise ValueError(f"text field {field!r}: sentencepiece could not learn: {exc}") from None
    return model.getvalue()


def vocab_size(model: bytes) -> int:
    return spm.SentencePieceProcessor(model_proto=model).get_piece_size()


def _sample_key(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8")).digest()


class _Sample:
    """A part of a content sample: (content hash, text) pairs, their characters, and the
    hash of the first text of the part that did not fit (``None``: none was left out)."""

    __slots__ = ("characters", "cut", "items")

    def __init__(self, items: list[tuple[bytes, str]], cut: bytes | None = None) -> None:
        self.items = items
        self.cut = cut
        self.characters = sum(len(text) for _, text in items)


class ContentSample(beam.CombineFn):
    """The texts with the smallest content hashes, in hash order: the longest such run
    that stays within ``max_texts`` texts and ``max_characters`` characters, and at least
    the first text, however long.

    Any part of the input keeps the run of its own texts that fits and where it cut
    that run. The whole input's run, restricted to a part, is a run of the part's texts
    within the same budget, so it is kept; below the smallest cut of the parts merged,
    every text is kept, and past it the whole run cannot reach. So merging trimmed parts
    loses nothing, and any bundling gives one sample. A part is trimmed whenever it holds
    twice its budget, so it never holds more.
    """

    def __init__(self, max_texts: int, max_characters: int) -> None:
        self._max_texts = max_texts
        self._max_characters = max_characters

    def create_accumulator(self) -> _Sample:
        return _Sample([])

    def add_input(self, sample: _Sample, text: str) -> _Sample:
        key = _sample_key(text)
        if sample.cut is not None and key >= sample.cut:
            return sample
        sample.items.append((key, text))
        sample.characters += len(text)
        if len(sample.items) > 2 * self._max_texts or sample.characters > 2 * self._max_characters:
            return self._trim(sample.items, sample.cut)
        return sample

    def merge_accumulators(self, samples: Iterable[_Sample]) -> _Sample:
        samples = list(samples)
        cuts = [sample.cut for sample in samples if sample.cut is not None]
        items = [item for sample in samples for item in sample.items]
        return self._trim(items, min(cuts, default=None))

    def compact(self, sample: _Sample) -> _Sample:
        return self._trim(sample.items, sample.cut)

    def extract_output(self, sample: _Sample) -> list[str]:
        return [text for _, text in self._trim(sample.items, sample.cut).items]

    def _trim(self, items: list[tuple[bytes, str]], cut: bytes | None) -> _Sample:
        items.sort()
        if cut is not None:
            items = [item for item in items if item[0] < cut]
        characters = 0
        for index, (key, text) in enumerate(items):
            characters += len(text)
            if index == self._max_texts or (characters > self._max_characters and index):
                return _Sample(items[:index], key)
        return _Sample(items, cut)


class LearnTokenizers(beam.PTransform):
    """Training records -> one ``(field, model bytes)`` per text field that has training
    text, for ``AsDict``.

    Each field gets its own model because fields differ in language and register.
    """

    def __init__(self, fields: Sequence[str], spec: VocabSpec) -> None:
        super().__init__()
        self._fields = list(fields)
        self._spec = spec

    def expand(self, records: beam.PCollection) -> beam.PCollection:
        per_field = [
            records
            | f"Texts[{field}]" >> beam.FlatMap(field_texts, field=field)
            | f"Sample[{field}]"
            >> beam.CombineGlobally(
                ContentSample(self._spec.input_sentence_size, self._spec.input_characters)
            )
            | f"Learn[{field}]" >> beam.FlatMap(_learn, spec=self._spec, field=field)
            for field in self._fields
        ]
        return tuple(per_field) | "Tokenizers" >> beam.Flatten(pipeline=records.pipeline)


def _learn(texts: list[str], spec: VocabSpec, field: str) -> Iterable[tuple[str, bytes]]:
    """The field's model; none without training text, which the build then refuses once
    its quality checks have had their say (an empty split is reported as such)."""
    if texts:
        yield field, train_tokenizer(texts, spec, field)


def field_texts(record: Record, field: str) -> Iterable[str]:
    """The record's text in ``field``, unless it has none."""
    value = record.get(field)
    if value is not None and value != "":
        yield value if isinstance(value, str) else str(value)


def save_field_files(
    root: str, temp_dir: str, relative_path: Callable[[str], str] = tokenizer_path
) -> beam.PTransform:
    """``(field, file bytes)`` -> the file at ``relative_path(field)`` under the dataset
    ``root`` (default: the field's tokenizer), each written atomically."""

    def save(item: tuple[str, bytes]) -> str:
        field, content = item
        path = filesystems.join(root, *relative_path(field).split("/"))
        filesystems.write_bytes(path, content, temp_dir)
        return path

    return beam.Map(save)


class CountTokens(beam.PTransform):
    """Adds ``TOKEN_COUNTS`` (field -> tokens in the record's text) to every record.

    ``models`` maps field -> model bytes: a side input view (``AsDict`` of
    ``LearnTokenizers``' output). A missing text gets no count, as it has no tokens; nor
    does a field without a model.
    """

    def __init__(self, fields: Sequence[str], models: beam.pvalue.AsSideInput) -> None:
        super().__init__()
        self._fields = list(fields)
        self._models = models

    def expand(self, records: beam.PCollection) -> beam.PCollection:
        # Records wait here until the models are learned: wait as compressed batches.
        return (
            records
            | "Pack" >> PackRecords()
            | "Count" >> beam.ParDo(_CountTokensFn(self._fields), self._models)
        )


class _CountTokensFn(beam.DoFn):
    def __init__(self, fields: Sequence[str]) -> None:
        self._fields = list(fields)
        self._processors: dict[str, spm.SentencePieceProcessor] = {}

    def process(self, packed: bytes, models: Mapping[str, bytes]) -> Iterable[Record]:
        if not self._processors:
            self._processors = {
                field: spm.SentencePieceProcessor(model_proto=models[field])
                for field in self._fields
                if field in models
            }
        for record in unpack_records(packed):
            yield self._count(record)

    def _count(self, record: Record) -> Record:
        counts: dict[str, Any] = {}
        for field, processor in self._processors.items():
            value = record.get(field)
            if value is None:
                continue
            ids = processor.encode(value if isinstance(value, str) else str(value))
            counts[field] = len(ids)
            count(f"tokenize.tokens.{field}", len(ids))
            unknown = ids.count(UNK_ID)
            if unknown:
                count(f"tokenize.unknown.{field}", unknown)
        return {**record, TOKEN_COUNTS: counts}
