"""What flows through the dataset pipeline, and how its transforms keep count.

A record is a plain ``dict`` (field name -> value) so that Beam encodes it compactly
between stages. Values are ``int``, ``float``, ``str``, ``bytes`` (encoded images),
lists of numbers (numeric vectors) or ``None`` (missing). Keys that start with an
underscore are bookkeeping and never reach the written Examples:

- ``_origin``: where the record came from, for people (``data/a.csv:42``).
- ``_rank``: a sortable string (source index, file, position); whenever the pipeline
  must choose one record among equals (de-duplication, shard order) it takes the
  smallest rank, so every run and every runner chooses the same one.
- ``_num_tokens``: text field -> the number of tokens its learned model makes of the
  record's text, for the token statistics (research.data.tokenizer).
- ``_table_dir``: for a record of a CSV or JSON Lines file, the file's directory, where
  image paths in its cells are taken from (research.data.image_cells).

Records that cannot be used are not dropped silently: they go to the quarantine
output as ``{"origin", "stage", "reason", "raw"}`` and are written to
``quarantine.jsonl`` beside the dataset; records removed on purpose (a clean rule, a
duplicate) go to the dropped output and ``dropped.jsonl`` (research.data.rejects).
Every rule counts what it did with a Beam counter in ``METRICS_NAMESPACE``; the data
report is made from those counters.
"""

from __future__ import annotations

import zlib
from typing import Any

import apache_beam as beam

Record = dict[str, Any]

ORIGIN = "_origin"
RANK = "_rank"
TOKEN_COUNTS = "_num_tokens"
TABLE_DIR = "_table_dir"
QUARANTINE_TAG = "quarantine"
DROPPED_TAG = "dropped"
METRICS_NAMESPACE = "slipway.data"
RAW_PREVIEW_CHARS = 1000
PACK_BATCH_SIZE = 512

_RECORDS_CODER = beam.coders.FastPrimitivesCoder()


def make_rank(source_index: int, path: str, position: int) -> str:
    """Sortable identity of a record's place in the inputs."""
    return f"{source_index:04d}|{path}|{position:012d}"


def is_bookkeeping(key: str) -> bool:
    """Whether a record key is the pipeline's own (``_origin``, ``_rank``, …), not a field."""
    return key.startswith("_")


def public_fields(record: Record) -> dict[str, Any]:
    """The record without its bookkeeping keys."""
    return {key: value for key, value in record.items() if not is_bookkeeping(key)}


def quarantine_entry(origin: str, stage: str, reason: str, raw: Any) -> dict[str, str]:
    """A quarantine line: enough to find the bad input and know why it was refused."""
    if isinstance(raw, bytes):
        preview = f"<{len(raw)} bytes>"
    else:
        preview = str(raw)
        if len(preview) > RAW_PREVIEW_CHARS:
            preview = preview[:RAW_PREVIEW_CHARS] + "…"
    return {"origin": origin, "stage": stage, "reason": reason, "raw": preview}


def dropped_entry(record: Record, stage: str, rule: str, reason: str, **details: Any) -> dict:
    """A dropped.jsonl line: the record removed at ``stage`` by ``rule`` (its counter), why,
    and ``details`` such as the duplicate's ``kept`` record."""
    preview = {
        name: f"<{len(value)} bytes>" if isinstance(value, bytes) else value
        for name, value in public_fields(record).items()
    }
    entry = quarantine_entry(str(record.get(ORIGIN, "")), stage, reason, preview)
    return {"origin": entry["origin"], "stage": stage, "rule": rule, **details, **entry}


def count(name: str, value: int = 1) -> None:
    """Add to the pipeline counter ``name`` (e.g. ``clean.masked.email``)."""
    beam.metrics.Metrics.counter(METRICS_NAMESPACE, name).inc(value)


def canonical_bytes(value: Any) -> bytes:
    """A stable byte form of a field value, for hashing (never Python's salted ``hash``)."""
    if value is None:
        return b"\x00"
    if isinstance(value, bytes):
        return b"b" + value
    if isinstance(value, str):
        return b"s" + value.encode("utf-8")
    if isinstance(value, bool | int):
        return b"i" + str(int(value)).encode()
    if isinstance(value, float):
        return b"f" + repr(value).encode()
    if isinstance(value, list | tuple):
        # A vector of one plain number type, joined at C speed into the same bytes.
        kinds = set(map(type, value))
        if kinds == {float}:
            return ("lf" + "\x1ff".join(map(float.__repr__, value))).encode()
        if kinds == {int}:
            return ("li" + "\x1fi".join(map(int.__repr__, value))).encode()
        return b"l" + b"\x1f".join(canonical_bytes(item) for item in value)
    return b"r" + repr(value).encode("utf-8")


def content_digest(record: Record, fields: list[str] | None = None) -> bytes:
    """SHA-256 over the chosen public fields (all of them by default), in name order."""
    import hashlib

    names = sorted(fields) if fields is not None else sorted(public_fields(record))
    digest = hashlib.sha256()
    for name in names:
        digest.update(name.encode("utf-8") + b"\x1e" + canonical_bytes(record.get(name)) + b"\x1d")
    return digest.digest()


def pack_records(batch: list[Record]) -> bytes:
    """A batch of records as one compressed element.

    Records that must wait (for a side input such as the tokenizers, or for a dedup
    verdict) are held in memory by Beam's in-process runner; compressed batches are about
    a quarter of the records' encoded size.
    """
    return zlib.compress(_RECORDS_CODER.encode(batch), 1)


def unpack_records(packed: bytes) -> list[Record]:
    return _RECORDS_CODER.decode(zlib.decompress(packed))


class PackRecords(beam.PTransform):
    """Records -> compressed batches of records (see ``pack_records``)."""

    def expand(self, pcoll: beam.PCollection) -> beam.PCollection:
        return (
            pcoll
            | "Batch"
            >> beam.BatchElements(
                min_batch_size=PACK_BATCH_SIZE, max_batch_size=PACK_BATCH_SIZE, record_metrics=False
            )
            | "Pack" >> beam.Map(pack_records)
        )
