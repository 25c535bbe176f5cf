"""The two logs of records that never reach the shards, so every input can be accounted for.

- ``quarantine.jsonl``: inputs the build could not use — unreadable, malformed, or not
  fitting the schema. Each line is ``{"origin", "stage", "reason", "raw"}``.
- ``dropped.jsonl``: records that were read and typed, then removed on purpose. Each line
  is ``{"origin", "stage", "rule", "reason", "raw"}`` where ``rule`` is the report's
  counter that counted it; a duplicate adds ``kept`` (the origin of the record kept in
  its place, which survived that rule) and ``similarity`` (1.0 for exact duplicates, the
  MinHash estimate of the Jaccard similarity for near ones).

Both logs are written in input order (file, then line), whatever order the runner's
bundles ran in, so two builds of the same inputs write the same bytes, and each holds
exactly as many lines as ``report.json`` counts quarantined, or dropped and merged.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from contracts.dataset_manifest import DatasetError

QUARANTINE_FILE = "quarantine.jsonl"
DROPPED_FILE = "dropped.jsonl"


def input_order(entry: dict[str, Any]) -> tuple[Any, ...]:
    """Sort key: origin with its numbers compared as numbers (``a.csv:9`` before ``a.csv:10``)."""
    parts = re.split(r"(\d+)", entry["origin"])
    natural = [int(part) if index % 2 else part for index, part in enumerate(parts)]
    return natural, entry["stage"], entry.get("rule", ""), entry["reason"]


def write_entries(entries: list[dict[str, Any]], path: str) -> str:
    """Write log entries as JSON lines in input order, atomically; returns ``path``.

    Runs on one worker, which holds the list; each entry's raw text is capped
    (records.quarantine_entry), so the list stays small next to the records themselves.
    """
    # Imported here: the logs' readers (``slipway data validate``) need no Beam.
    from research.data import filesystems

    ordered = sorted(entries, key=input_order)
    lines = "".join(json.dumps(entry, ensure_ascii=False) + "\n" for entry in ordered)
    filesystems.write_bytes(path, lines.encode("utf-8"))
    return path


def read_entries(path: Path) -> list[dict[str, Any]]:
    """The entries of a log; DatasetError naming the file and line when it cannot be read."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise DatasetError(f"{path}: missing") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{path}: unreadable: {exc}") from None
    entries = []
    for number, line in enumerate(lines, start=1):
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{path}:{number}: not a JSON line: {exc.msg}") from None
        if not isinstance(entry, dict) or not isinstance(entry.get("origin"), str):
            raise DatasetError(f"{path}:{number}: expected an object with an 'origin'")
        entries.append(entry)
    return entries
