"""Training shards are hashed against their manifest once per run, not at every start.

Reading a shard whose bytes differ from the manifest's SHA-256 must fail before any
step. But hashing every shard costs a full read of the split, and a run starts many
times: each resume, each restart of a worker group by its supervisor. So the first
start that hashes the shards records what it verified in the run directory — the
manifest's own digest and each shard's path, size and modification time — and a later
start of the same run that finds exactly those files only compares sizes. A shard
rewritten since (a new modification time) or another dataset is hashed again.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from contracts.atomic_files import write_json_atomically
from contracts.dataset_manifest import MANIFEST_FILE
from contracts.digests import file_sha256
from research.data.input_pipeline import Verify, verify_shards
from research.experiments.task import ExperimentTask

RECORD_FILE = "verified-shards.json"


def _record_path(task: ExperimentTask) -> Path:
    return task.config.run_path / RECORD_FILE


def _fingerprint(task: ExperimentTask) -> dict[str, Any]:
    """The files a verification covered, as they are on disk now."""
    config = task.config
    dataset = config.resolve(config.data.dataset)
    split = config.data.train_split
    shards = []
    for path in task.manifest.shard_paths(dataset, split):
        stat = os.stat(path)
        shards.append({"path": str(path), "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns})
    return {
        "manifest_sha256": file_sha256(dataset / MANIFEST_FILE),
        "split": split,
        "shards": shards,
    }


def training_verification(task: ExperimentTask) -> Verify:
    """How far this start checks the training shards: the task's ``verify``, lowered
    from ``sha256`` to ``size`` when this run already hashed these very files."""
    if task.verify != "sha256":
        return task.verify
    try:
        recorded = json.loads(_record_path(task).read_text(encoding="utf-8"))
        current = _fingerprint(task)
    except (OSError, ValueError):
        return "sha256"  # nothing recorded, or a shard is missing: the full check says which
    return "size" if recorded == current else "sha256"


def record_verification(task: ExperimentTask) -> None:
    """Remember that the training shards, as they are now, matched their SHA-256."""
    path = _record_path(task)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomically(path, _fingerprint(task))


def verify_training_shards(task: ExperimentTask, *, record: bool) -> Verify:
    """Check the training shards as far as this start must (``training_verification``),
    recording a full check when ``record``; returns how far the input pipelines built
    afterwards still check them: sizes, unless the task asks for no check at all."""
    how = training_verification(task)
    config = task.config
    verify_shards(config.resolve(config.data.dataset), task.manifest, config.data.train_split, how)
    if how == "sha256" and record:
        record_verification(task)
    return "none" if how == "none" else "size"
