"""Training shards are hashed once per run: later starts of the run compare sizes, unless
a shard changed on disk since."""

from __future__ import annotations

import os

import pytest

from contracts.dataset_manifest import DatasetError
from tests.support.artefacts import private_copy
from tests.support.experiments import make_trainer, write_experiment
from training.verification import RECORD_FILE


def test_a_run_hashes_its_shards_once_and_again_only_after_they_change(tmp_path, digits_dataset):
    dataset = private_copy(digits_dataset, tmp_path)  # its shards are changed below
    path = write_experiment(tmp_path, dataset, training__steps=2)
    make_trainer(path)
    assert (tmp_path / "run" / RECORD_FILE).exists()

    # The same bytes count, size and modification time: only SHA-256 could tell.
    shard = next(dataset.glob("train-*"))
    stat = shard.stat()
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    make_trainer(path)  # a later start of the run: sizes only

    with pytest.raises(DatasetError, match="SHA-256"):
        make_trainer(write_experiment(tmp_path / "another-run", dataset, training__steps=2))
    os.utime(shard)  # rewritten since the run verified it
    with pytest.raises(DatasetError, match="SHA-256"):
        make_trainer(path)
