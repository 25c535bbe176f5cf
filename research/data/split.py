"""Deterministic train/validation/test assignment.

A record's split is a pure function of its key and the spec's seed, so the same record
lands in the same split on every run and on every runner, and duplicates (which share
their content) can never straddle train and test.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import apache_beam as beam

from research.data import records
from research.data.records import Record
from research.data.spec import SplitSpec

SPLIT = "_split"


def split_for_key(key: bytes, ratios: Mapping[str, float], seed: str) -> str:
    """Map a key to a split by where its hash falls in the cumulative ratios."""
    digest = hashlib.sha256(seed.encode("utf-8") + b"\x00" + key).digest()
    point = int.from_bytes(digest[:8], "big") / 2**64
    cumulative = 0.0
    names = list(ratios)
    for name in names:
        cumulative += ratios[name]
        if point < cumulative:
            return name
    return names[-1]


def record_key(record: Record, key_field: str | None) -> bytes:
    """The bytes a record's split is decided by: its key field, or its whole content."""
    if key_field is None:
        return records.content_digest(record)
    return records.canonical_bytes(record.get(key_field))


class AssignSplit(beam.PTransform):
    """Tag every record with its split under the ``_split`` bookkeeping key."""

    def __init__(self, spec: SplitSpec) -> None:
        super().__init__()
        self._spec = spec

    def expand(self, pcoll: beam.PCollection) -> beam.PCollection:
        spec = self._spec

        def assign(record: Record) -> Record:
            name = split_for_key(record_key(record, spec.key), spec.ratios, spec.seed)
            records.count(f"split.{name}")
            return {**record, SPLIT: name}

        return pcoll | "Assign" >> beam.Map(assign)
