"""NumPy ``.npz`` and HDF5 sources: named arrays sharing their first dimension.

Index ``i`` of every array is record ``i``. Both formats go through ``array_records``,
so they check shapes, turn image stacks into PNGs and name bad input the same way.

- ``type: npz``: ``arrays`` maps array name -> field (empty: every array under its
  own name). The archive is loaded with ``allow_pickle=False``: an npz may come from
  anywhere and unpickling runs code.
- ``type: hdf5``: ``fields`` maps field -> dataset path in the file (``/images``; empty:
  every dataset, named by its path). Datasets are read ``READ_BYTES`` at a time with
  h5py, so a file larger than memory is never loaded whole; strings are decoded.

``images`` lists the fields holding image stacks (N x H x W or N x H x W x C, C in
1..4): they become one PNG per record, so they need whole numbers in 0..255.

A file whose arrays cannot be used together (a missing name, different first
dimensions, an image stack of the wrong shape, not an npz or HDF5 file at all) is
refused before the build by ``npz_columns`` and ``hdf5_columns``, which read only the
arrays' shapes; a row whose values do not fit is quarantined when read.
"""

from __future__ import annotations

import contextlib
import zipfile
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import h5py
import numpy as np

from contracts.yaml_config import ConfigError
from research.data import filesystems
from research.data.feature_names import closest_name
from research.data.reading import (
    SourceFile,
    UnreadableFile,
    encode_array_png,
    quarantined,
    source_record,
)
from research.data.spec import Hdf5Source, NpzSource

READ_BYTES = 16 * 2**20  # HDF5 rows read at once: as many as fit in this many bytes


@dataclass(frozen=True)
class ArrayColumn:
    """One field's array: its shape and dtype, and its rows read only when asked for."""

    shape: tuple[int, ...]
    dtype: np.dtype
    rows: Callable[[int, int], np.ndarray]  # (start, stop) -> array[start:stop]

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64)) * max(self.dtype.itemsize, 1)


def array_records(
    unit: SourceFile,
    kind: str,
    columns: Mapping[str, ArrayColumn],
    images: Sequence[str],
    rows_per_read: int,
) -> Iterator[dict[str, Any]]:
    """One record per index; a row that cannot be used is quarantined on its own.

    Rows are read in blocks; a block with a bad row is read again row by row, so the
    quarantine names (and the loss counts) each bad row, and the block's good rows are
    kept. ``UnreadableFile`` when the arrays cannot be used together (``_checked_length``).
    """
    try:
        length = _checked_length(columns, images)
    except ValueError as exc:
        raise UnreadableFile(unit.display, f"cannot use {kind} file: {exc}") from None
    first, last = unit.rows or (0, length)
    for start in range(first, min(last, length), rows_per_read):
        stop = min(last, length, start + rows_per_read)
        try:
            yield from _rows(unit, columns, images, start, stop)
        except ValueError:
            for position in range(start, stop):
                try:
                    yield from _rows(unit, columns, images, position, position + 1)
                except ValueError as exc:
                    origin = f"{unit.display}[{position}]"
                    yield quarantined(origin, f"cannot use {kind} file: {exc}", "")


def _rows(
    unit: SourceFile,
    columns: Mapping[str, ArrayColumn],
    images: Sequence[str],
    start: int,
    stop: int,
) -> list[dict[str, Any]]:
    """Records ``start`` to ``stop``; ValueError when any of them cannot be used."""
    block = {field: column.rows(start, stop) for field, column in columns.items()}
    for field in images:
        block[field] = _uint8_images(field, block[field])
    return [
        source_record(
            unit,
            start + offset,
            f"{unit.display}[{start + offset}]",
            {name: _plain(array[offset], image=name in images) for name, array in block.items()},
        )
        for offset in range(stop - start)
    ]


def _checked_length(columns: Mapping[str, ArrayColumn], images: Sequence[str]) -> int:
    """The common first dimension; ValueError naming the fields that do not fit."""
    unknown = [field for field in images if field not in columns]
    if unknown:
        raise ValueError(f"images: {', '.join(unknown)} not among fields {', '.join(columns)}")
    scalars = [field for field, column in columns.items() if not column.shape]
    if scalars:
        raise ValueError(f"arrays without a first dimension: {', '.join(scalars)}")
    lengths = {field: column.shape[0] for field, column in columns.items()}
    if len(set(lengths.values())) > 1:
        described = ", ".join(f"{field} ({length})" for field, length in lengths.items())
        raise ValueError(
            f"arrays must share their first dimension, got {described}: row i of every "
            "array is record i, so list only arrays with one row per record"
        )
    for field in images:
        shape = columns[field].shape
        if not (len(shape) == 3 or (len(shape) == 4 and shape[-1] in (1, 2, 3, 4))):
            raise ValueError(
                f"images: field {field!r} has shape {list(shape)}, "
                "expected N x H x W or N x H x W x C with C in 1..4"
            )
    return next(iter(lengths.values()), 0)


def _uint8_images(field: str, array: np.ndarray) -> np.ndarray:
    """A block of images as uint8, if its values are whole numbers in 0..255."""
    if array.dtype == np.uint8:
        return array
    if array.dtype.kind in "biuf":
        values = array.astype(np.float64)
        if np.all(
            np.isfinite(values) & (values == np.round(values)) & (values >= 0) & (values <= 255)
        ):
            return array.astype(np.uint8)
    raise ValueError(
        f"images: field {field!r} has dtype {array.dtype} with values that are not "
        "whole numbers in 0..255; scale it to uint8"
    )


def _plain(value: Any, *, image: bool) -> Any:
    """Plain Python for Beam's coders: images -> PNG, scalars -> int/float/str, rows -> lists."""
    if image:
        return encode_array_png(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value.item() if isinstance(value, np.generic) else value  # h5py strings are str


def _missing(kind: str, where: str, names: Sequence[str], present: Sequence[str]) -> str:
    """'no array named X (arrays: x)', with the closest name when there is one."""
    described = ", ".join(names)
    close = [closest_name(name, present) for name in names]
    hints = "".join(f"; did you mean {hint!r}?" for hint in close if hint)
    return f"no {kind} named {described} ({where}: {', '.join(present) or 'none'}){hints}"


# --- npz ----------------------------------------------------------------------------


_NPZ_ERRORS = (ValueError, zipfile.BadZipFile, EOFError, zlib.error)


def read_npz(unit: SourceFile) -> Iterator[dict[str, Any]]:
    source: NpzSource = unit.source  # type: ignore[assignment]
    try:
        columns = _npz_columns(unit.path, source)
    except _NPZ_ERRORS as exc:
        raise UnreadableFile(unit.display, f"cannot use npz file: {exc}") from None
    length = max((column.shape[0] for column in columns.values() if column.shape), default=0)
    yield from array_records(unit, "npz", columns, source.images, max(length, 1))


@contextlib.contextmanager
def _open_npz(path: str) -> Iterator[np.lib.npyio.NpzFile]:
    with filesystems.open_for_read(path) as handle:
        loaded = np.load(handle, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            raise ValueError("not an .npz archive (a single .npy array?)")
        with loaded as archive:
            yield archive


def _npz_columns(path: str, source: NpzSource) -> dict[str, ArrayColumn]:
    with _open_npz(path) as archive:
        names = list(archive.files)
        mapping = source.arrays or {name: name for name in names}
        missing = [name for name in mapping if name not in names]
        if missing:
            raise ValueError(_missing("array", "arrays", missing, names))
        arrays = {field: archive[name] for name, field in mapping.items()}
    return {field: _in_memory(array) for field, array in arrays.items()}


def _in_memory(array: np.ndarray) -> ArrayColumn:
    return ArrayColumn(array.shape, array.dtype, lambda start, stop: array[start:stop])


def npz_columns(unit: SourceFile) -> list[str]:
    """The fields of one npz file; ConfigError for an ``arrays`` entry it does not have,
    or a file whose arrays cannot be used (only their headers are read)."""
    source: NpzSource = unit.source  # type: ignore[assignment]
    try:
        with _open_npz(unit.path) as archive:
            names = list(archive.files)
            missing = [name for name in source.arrays if name not in names]
            if missing:
                problem = _missing("array", "arrays", missing, names)
                raise ConfigError(f"sources.{unit.index}.arrays: {unit.display}: {problem}")
            mapping = source.arrays or {name: name for name in names}
            columns = {field: _npz_header(archive, name) for name, field in mapping.items()}
        _checked_length(columns, source.images)
    except ConfigError:
        raise
    except (OSError, *_NPZ_ERRORS) as exc:
        raise ConfigError(
            f"sources.{unit.index}: {unit.display}: cannot use npz file: {exc}"
        ) from None
    return list(columns)


def _npz_header(archive: np.lib.npyio.NpzFile, name: str) -> ArrayColumn:
    """An array's shape and dtype from its ``.npy`` header, its data left unread."""
    member = name + ".npy" if name + ".npy" in archive.zip.namelist() else name
    with archive.zip.open(member) as handle:
        version = np.lib.format.read_magic(handle)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(handle)
        elif version == (2, 0):
            shape, _, dtype = np.lib.format.read_array_header_2_0(handle)
        else:
            array = archive[name]  # a rarer format version: loaded to learn its shape
            shape, dtype = array.shape, array.dtype
    if dtype.hasobject:
        raise ValueError(
            f"array {name!r} holds Python objects, which are not loaded (allow_pickle=False)"
        )
    return ArrayColumn(tuple(shape), dtype, lambda start, stop: np.empty(0))


# --- HDF5 ---------------------------------------------------------------------------


def read_hdf5(unit: SourceFile) -> Iterator[dict[str, Any]]:
    source: Hdf5Source = unit.source  # type: ignore[assignment]
    with contextlib.ExitStack() as stack:
        try:
            handle = stack.enter_context(_open_hdf5(unit.path))
            columns = {
                field: _hdf5_column(handle, path) for field, path in _hdf5_fields(handle, source)
            }
        except (OSError, ValueError) as exc:
            raise UnreadableFile(unit.display, f"cannot use HDF5 file: {exc}") from None
        widest = max((column.row_bytes for column in columns.values()), default=1)
        rows_per_read = max(1, READ_BYTES // max(widest, 1))
        yield from array_records(unit, "HDF5", columns, source.images, rows_per_read)


@contextlib.contextmanager
def _open_hdf5(path: str) -> Iterator[h5py.File]:
    """The file, by h5py's own driver on local disk, else through Beam's FileSystems."""
    if filesystems.is_local(path):
        with h5py.File(path, "r") as handle:
            yield handle
        return
    with filesystems.open_for_read(path) as raw, h5py.File(raw, "r") as handle:
        yield handle


def hdf5_row_ranges(unit: SourceFile, range_bytes: int) -> list[tuple[int, int]] | None:
    """Row ranges of about ``range_bytes`` each, for reading a large file in parts;
    None when the file is small, or cannot be used (reading it whole says why)."""
    source: Hdf5Source = unit.source  # type: ignore[assignment]
    try:
        with _open_hdf5(unit.path) as handle:
            columns = {
                field: _hdf5_column(handle, path) for field, path in _hdf5_fields(handle, source)
            }
            length = _checked_length(columns, source.images)
    except (OSError, ValueError):
        return None
    step = max(1, range_bytes // max(sum(c.row_bytes for c in columns.values()), 1))
    if length <= step:
        return None
    return [(start, min(length, start + step)) for start in range(0, length, step)]


def _datasets(handle: h5py.File) -> list[str]:
    """Paths of every dataset in the file, in h5py's (alphabetical) order."""
    paths: list[str] = []
    handle.visititems(
        lambda name, item: paths.append("/" + name) if isinstance(item, h5py.Dataset) else None
    )
    return paths


def _hdf5_fields(handle: h5py.File, source: Hdf5Source) -> list[tuple[str, str]]:
    """(field, dataset path) pairs; ValueError naming a path the file does not have."""
    present = _datasets(handle)
    if not source.fields:
        return [(path.lstrip("/"), path) for path in present]
    wanted = {field: "/" + path.lstrip("/") for field, path in source.fields.items()}
    missing = [path for path in wanted.values() if path not in present]
    if missing:
        raise ValueError(_missing("dataset", "datasets", missing, present))
    return list(wanted.items())


def _hdf5_column(handle: h5py.File, path: str) -> ArrayColumn:
    dataset = handle[path]
    rows = dataset.asstr() if h5py.check_string_dtype(dataset.dtype) else dataset
    return ArrayColumn(dataset.shape, dataset.dtype, lambda start, stop: rows[start:stop])


def hdf5_columns(unit: SourceFile) -> list[str]:
    """The fields of one HDF5 file; ConfigError for a ``fields`` path it does not have,
    or a file whose datasets cannot be used (only their shapes are read)."""
    source: Hdf5Source = unit.source  # type: ignore[assignment]
    where = f"sources.{unit.index}: {unit.display}"
    try:
        with _open_hdf5(unit.path) as handle:
            try:
                fields = _hdf5_fields(handle, source)
            except ValueError as exc:
                raise ConfigError(f"sources.{unit.index}.fields: {unit.display}: {exc}") from None
            columns = {field: _hdf5_column(handle, path) for field, path in fields}
            _checked_length(columns, source.images)
    except ConfigError:
        raise
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{where}: cannot use HDF5 file: {exc}") from None
    return list(columns)
