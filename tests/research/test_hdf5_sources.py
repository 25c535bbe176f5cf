"""HDF5 sources: datasets by path, read in chunks, built like the same data as npz."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from contracts.yaml_config import ConfigError
from research.data import array_sources
from research.data.pipeline import build_dataset
from research.data.records import ORIGIN
from research.data.schema import resolve_schema
from research.data.spec import load_spec
from tests.support.raw_data import write_spec
from tests.support.shards import read_examples
from tests.support.source_records import make_spec, public, read


def digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    data = load_digits()
    return np.round(data.images * (255 / 16)).astype(np.uint8), data.target


def write_digits(directory: Path) -> None:
    """The same digits as ``digits.h5`` (/images, /labels) and ``digits.npz``."""
    images, labels = digits()
    directory.mkdir(parents=True, exist_ok=True)
    with h5py.File(directory / "digits.h5", "w") as handle:
        handle.create_dataset("images", data=images, chunks=(64, 8, 8))
        handle.create_dataset("labels", data=labels)
    np.savez(directory / "digits.npz", images=images, target=labels)


H5_SOURCE = {
    "type": "hdf5",
    "path": "digits.h5",
    "fields": {"image": "/images", "label": "/labels"},
    "images": ["image"],
}
NPZ_SOURCE = {
    "type": "npz",
    "path": "digits.npz",
    "arrays": {"images": "image", "target": "label"},
    "images": ["image"],
}


def test_hdf5_reads_in_chunks_what_npz_reads_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_digits(tmp_path)
    monkeypatch.setattr(array_sources, "READ_BYTES", 64 * 100)  # 100 images per read
    from_h5, quarantined = read(make_spec(tmp_path, H5_SOURCE))
    from_npz, _ = read(make_spec(tmp_path, NPZ_SOURCE))
    assert quarantined == []
    assert len(from_h5) == 1797
    assert [public(r) for r in from_h5] == [public(r) for r in from_npz]
    assert from_h5[150][ORIGIN] == "digits.h5[150]"


def test_hdf5_digits_build_like_the_npz_digits(tmp_path: Path) -> None:
    write_digits(tmp_path)
    written = {}
    for name, source in [("h5", H5_SOURCE), ("npz", NPZ_SOURCE)]:
        spec = {
            "name": f"digits-{name}",
            "sources": [source],
            "labels": ["label"],
            "split": {"ratios": {"train": 0.8, "test": 0.2}, "seed": "s"},
        }
        build_dataset(
            load_spec(write_spec(tmp_path / f"{name}.yaml", spec)), tmp_path / f"out-{name}"
        )
        written[name] = {
            split: sorted((example["label"], example["image"]) for example in examples)
            for split, examples in read_examples(tmp_path / f"out-{name}").items()
        }
    assert written["h5"] == written["npz"]  # same records in the same splits
    assert sum(len(examples) for examples in written["h5"].values()) > 1700  # duplicates merged


def test_every_dataset_by_default_named_by_its_path_and_strings_decoded(tmp_path: Path) -> None:
    with h5py.File(tmp_path / "t.h5", "w") as handle:
        handle.create_dataset("x", data=np.arange(6, dtype=np.float32).reshape(3, 2))
        handle.create_dataset("meta/name", data=["ann", "bob", "cy"], dtype=h5py.string_dtype())
        handle.create_dataset("meta/code", data=np.array([b"a", b"b", b"c"], dtype="S1"))
    records, quarantined = read(make_spec(tmp_path, {"type": "hdf5", "path": "t.h5"}))
    assert quarantined == []
    assert [public(r) for r in records] == [
        {"meta/code": "a", "meta/name": "ann", "x": [0.0, 1.0]},
        {"meta/code": "b", "meta/name": "bob", "x": [2.0, 3.0]},
        {"meta/code": "c", "meta/name": "cy", "x": [4.0, 5.0]},
    ]
    resolved = resolve_schema(make_spec(tmp_path, {"type": "hdf5", "path": "t.h5"}))
    assert resolved.columns == {"meta_code": "meta/code", "meta_name": "meta/name"}


def test_a_dataset_path_the_file_lacks_is_a_config_error_with_the_closest(
    tmp_path: Path,
) -> None:
    write_digits(tmp_path)
    source = {**H5_SOURCE, "fields": {"image": "/image", "label": "/labels"}}
    with pytest.raises(ConfigError) as raised:
        resolve_schema(make_spec(tmp_path, source))
    assert str(raised.value) == (
        "sources.0.fields: digits.h5: no dataset named /image (datasets: /images, /labels); "
        "did you mean '/images'?"
    )
    _, quarantined = read(make_spec(tmp_path, source))
    assert quarantined[0]["reason"].startswith("cannot use HDF5 file: no dataset named /image")


def test_an_unusable_image_is_quarantined_alone_and_the_rest_of_its_block_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pixels = np.zeros((6, 2, 2), dtype=np.float32)
    pixels[4, 0, 0] = 0.5
    with h5py.File(tmp_path / "f.h5", "w") as handle:
        handle.create_dataset("img", data=pixels)
    monkeypatch.setattr(array_sources, "READ_BYTES", 2 * 2 * 4 * 2)  # two images per read
    source = {"type": "hdf5", "path": "f.h5", "images": ["img"]}
    records, quarantined = read(make_spec(tmp_path, source))
    assert [r[ORIGIN] for r in records] == [f"f.h5[{i}]" for i in (0, 1, 2, 3, 5)]
    assert [q["origin"] for q in quarantined] == ["f.h5[4]"]
    assert "not whole numbers in 0..255" in quarantined[0]["reason"]


def test_a_file_that_is_not_hdf5_is_quarantined(tmp_path: Path) -> None:
    (tmp_path / "fake.h5").write_text("not hdf5")
    records, quarantined = read(make_spec(tmp_path, {"type": "hdf5", "path": "fake.h5"}))
    assert records == []
    assert quarantined[0]["origin"] == "fake.h5"
    assert quarantined[0]["reason"].startswith("cannot use HDF5 file:")


def test_a_large_hdf5_file_is_read_in_row_ranges_that_add_up_to_it(tmp_path: Path) -> None:
    from research.data.sources import check_sources, file_parts, read_source_file

    write_digits(tmp_path)
    (unit,) = check_sources(make_spec(tmp_path, H5_SOURCE))

    parts = file_parts(unit, range_bytes=300 * 64)

    # a row: 64 bytes of image and an 8-byte label
    assert [part.rows for part in parts[:2]] == [(0, 266), (266, 532)]
    assert parts[-1].rows[1] == len(digits()[1])
    whole = list(read_source_file(unit))
    assert [item for part in parts for item in read_source_file(part)] == whole
    assert file_parts(unit, range_bytes=1 << 30) == [unit]


def test_array_files_are_read_from_a_uri(tmp_path: Path) -> None:
    from tests.support.memory_filesystem import MemoryFileSystem

    write_digits(tmp_path)
    MemoryFileSystem.files.clear()
    for name in ("digits.h5", "digits.npz"):
        MemoryFileSystem.files[f"memtest://bucket/{name}"] = (tmp_path / name).read_bytes()
    for source in (H5_SOURCE, NPZ_SOURCE):
        local, _ = read(make_spec(tmp_path, source))
        remote, quarantined = read(
            make_spec(tmp_path, {**source, "path": f"memtest://bucket/{source['path']}"})
        )
        assert quarantined == []
        assert [public(record) for record in remote] == [public(record) for record in local]
