"""The terms of each text field read as a bag of words, learned in the build.

For a text field declared with ``words`` (``WordsSpec``), ``LearnWordBags`` counts in
how many training texts each term occurs (after cleaning, de-duplication and the split,
so no validation or test text chooses a term) and keeps the ``max_terms`` terms found
in at least ``min_documents`` texts, those in the most texts first, ties in term order.
The terms come from ``research.preprocessing.words.text_terms``, the TensorFlow function
the model's graph runs, so the vocabulary is chosen from exactly the terms a model will
see. The file (``words_path``) holds the terms, their document frequencies, the number
of training texts and ``ngrams``: everything the graph needs for the TF-IDF weights.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import apache_beam as beam

from research.data.spec import WordsSpec
from research.data.tokenizer import TOKENIZER_DIR, field_texts

_BATCH = {"min_batch_size": 64, "max_batch_size": 1024}


def words_path(field: str) -> str:
    """Where a field's terms live, relative to the dataset directory."""
    return f"{TOKENIZER_DIR}/{field}.words.json"


def word_bag_file(terms: Sequence[tuple[str, int]], documents: int, spec: WordsSpec) -> bytes:
    """The file of the chosen ``(term, document frequency)`` pairs, ordered as kept."""
    ordered = sorted(terms, key=_rank)
    content = {
        "ngrams": spec.ngrams,
        "documents": documents,
        "terms": [term for term, _ in ordered],
        "document_frequencies": [frequency for _, frequency in ordered],
    }
    return json.dumps(content, ensure_ascii=False, sort_keys=True).encode("utf-8")


def _rank(item: tuple[str, int]) -> tuple[int, str]:
    """Most documents first, then the term itself: the same order on every runner."""
    term, frequency = item
    return -frequency, term


class LearnWordBags(beam.PTransform):
    """Training records -> one ``(field, file bytes)`` per field of ``fields`` that has
    training text, for ``save_field_files(..., words_path)``."""

    def __init__(self, fields: Mapping[str, WordsSpec]) -> None:
        super().__init__()
        self._fields = dict(fields)

    def expand(self, records: beam.PCollection) -> beam.PCollection:
        learned = [self._learn(records, field, spec) for field, spec in self._fields.items()]
        return tuple(learned) | "WordBags" >> beam.Flatten(pipeline=records.pipeline)

    @staticmethod
    def _learn(records: beam.PCollection, field: str, spec: WordsSpec) -> beam.PCollection:
        texts = records | f"WordTexts[{field}]" >> beam.FlatMap(field_texts, field=field)
        documents = texts | f"Documents[{field}]" >> beam.combiners.Count.Globally()
        return (
            texts
            | f"Batch[{field}]" >> beam.BatchElements(**_BATCH)
            | f"Terms[{field}]" >> beam.ParDo(_DistinctTermsFn(spec.ngrams))
            | f"DocumentFrequency[{field}]" >> beam.combiners.Count.PerElement()
            | f"Frequent[{field}]" >> beam.Filter(lambda item: item[1] >= spec.min_documents)
            | f"Top[{field}]" >> beam.combiners.Top.Of(spec.max_terms, key=_rank, reverse=True)
            | f"File[{field}]"
            >> beam.FlatMap(_file, beam.pvalue.AsSingleton(documents), spec=spec, field=field)
        )


def _file(
    terms: list[tuple[str, int]], documents: int, spec: WordsSpec, field: str
) -> Iterable[tuple[str, bytes]]:
    """The field's file; none without training text or without a term frequent enough,
    which the build then refuses by name."""
    if documents and terms:
        yield field, word_bag_file(terms, documents, spec)


class _DistinctTermsFn(beam.DoFn):
    """A batch of texts -> each text's distinct terms, by the graph's own function."""

    def __init__(self, ngrams: int) -> None:
        self._ngrams = ngrams
        self._terms: Any = None

    def setup(self) -> None:
        import tensorflow as tf

        from research.preprocessing.words import text_terms

        self._terms = tf.function(
            lambda texts: text_terms(texts, self._ngrams),
            input_signature=[tf.TensorSpec([None], tf.string)],
        )

    def process(self, texts: list[str]) -> Iterable[str]:
        for row in self._terms(texts).to_list():
            for term in set(row):
                yield term.decode("utf-8")


def words_fields(schema: Mapping[str, Any]) -> dict[str, WordsSpec]:
    """The text fields models read as bags of words, with their settings."""
    return {name: field.words for name, field in schema.items() if field.words is not None}
