"""A source file's records as the dataset build reads them, without running a build.

Source tests describe one source in a spec and read its records and its quarantine
entries, to check the reader alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from research.data.sources import check_sources, is_record, read_source_file
from research.data.spec import DatasetSpec


def make_spec(base: Path, source: dict[str, Any], **extra: Any) -> DatasetSpec:
    """A one-source dataset spec rooted at ``base``."""
    return DatasetSpec.model_validate(
        {"name": "t", "sources": [source], "base_dir": str(base), **extra}
    )


def read(spec: DatasetSpec) -> tuple[list[dict], list[dict]]:
    """Every record and every quarantine entry the spec's sources yield, in order."""
    records, quarantined = [], []
    for unit in check_sources(spec):
        for item in read_source_file(unit):
            (records if is_record(item) else quarantined).append(item)
    return records, quarantined


def public(record: dict) -> dict:
    """A record without its bookkeeping keys."""
    return {key: value for key, value in record.items() if not key.startswith("_")}
