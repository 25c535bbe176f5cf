"""Spellings of one category merged into its most common one (``category_variants: merge``).

``Class_1``, ``CLASS_1`` and ``class_1 `` are one class to the person who typed them. With
``quality.category_variants: merge`` every categorical field's values (labels included)
are counted over the whole input, grouped by what is left without case and spacing
(``research.data.category_checks.spelling_key``), and every spelling of a group becomes
the group's most common one (ties: the first in code-point order), before cleaning,
de-duplication and the split, so that records differing only in such a spelling are
duplicates too. The merges are written to the build directory for the report.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import apache_beam as beam

from research.data.category_checks import spelling_key
from research.data.records import Record

# (field, spelling) -> (the spelling it becomes, records that had it)
Merges = Mapping[tuple[str, str], tuple[str, int]]


def _spellings(record: Record, fields: Sequence[str]) -> Iterator[tuple[tuple[str, str], int]]:
    for field in fields:
        value = record.get(field)
        if isinstance(value, str):
            yield (field, value), 1


def _by_key(counted: tuple[tuple[str, str], int]) -> tuple[tuple[str, str], tuple[str, int]]:
    (field, value), count = counted
    return (field, spelling_key(value)), (value, count)


def _merges_of(
    group: tuple[tuple[str, str], Iterable[tuple[str, int]]],
) -> Iterator[tuple[tuple[str, str], tuple[str, int]]]:
    """Each spelling of a group of several, and what it becomes (the most common)."""
    (field, _), spellings = group
    ordered = sorted(spellings, key=lambda value_count: (-value_count[1], value_count[0]))
    if len(ordered) < 2:
        return
    canonical = ordered[0][0]
    for value, count in ordered[1:]:
        yield (field, value), (canonical, count)


def _merged(record: Record, fields: Sequence[str], merges: Merges) -> Record:
    renamed = {}
    for field in fields:
        value = record.get(field)
        if isinstance(value, str) and (field, value) in merges:
            renamed[field] = merges[(field, value)][0]
    return {**record, **renamed} if renamed else record


class MergeCategorySpellings(beam.PTransform):
    """Records with every spelling variant replaced; ``merges`` (a PCollection of
    ``((field, spelling), (canonical, count))``) is set by ``expand``."""

    def __init__(self, fields: Sequence[str]) -> None:
        super().__init__()
        self._fields = list(fields)
        self.merges: beam.PCollection | None = None

    def expand(self, records: beam.PCollection) -> beam.PCollection:
        fields = self._fields
        self.merges = (
            records
            | "Spellings" >> beam.FlatMap(_spellings, fields)
            | "CountSpellings" >> beam.CombinePerKey(sum)
            | "BySpellingKey" >> beam.Map(_by_key)
            | "GroupSpellings" >> beam.GroupByKey()
            | "Merges" >> beam.FlatMap(_merges_of)
        )
        return records | "Merge" >> beam.Map(_merged, fields, beam.pvalue.AsDict(self.merges))


def merge_notes(merges: Iterable[Sequence[Any]]) -> list[str]:
    """One report line per merged group: ``label: 'CLASS_1' (2), 'class_1' (1) merged into
    'Class_1'`` (from the ``[field, spelling, canonical, count]`` rows the build wrote)."""
    groups: dict[tuple[str, str], list[tuple[str, int]]] = {}
    for field, value, canonical, count in merges:
        groups.setdefault((field, canonical), []).append((value, int(count)))
    return [
        f"{field}: "
        + ", ".join(f"{value!r} ({count:,})" for value, count in sorted(spellings))
        + f" merged into {canonical!r} (quality.category_variants: merge)"
        for (field, canonical), spellings in sorted(groups.items())
    ]
