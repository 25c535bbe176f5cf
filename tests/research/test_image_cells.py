"""Images in tables: file paths relative to a CSV, base64 in JSON Lines, checked like folders."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from research.data.image_cells import ImageCellError, image_cell_bytes
from research.data.pipeline import build_dataset
from research.data.spec import load_spec
from tests.support.raw_data import write_digits, write_spec
from tests.support.shards import all_examples

IMAGE = {"type": "image", "height": 8, "width": 8, "channels": 1}


def png(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels, mode="L").save(buffer, format="PNG")
    return buffer.getvalue()


def pixels_of(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)))


# -- one cell ---------------------------------------------------------------------------


def test_a_cell_names_an_image_by_path_or_carries_it_as_base64(tmp_path: Path) -> None:
    data = png(np.arange(64, dtype=np.uint8).reshape(8, 8))
    (tmp_path / "shots").mkdir()
    (tmp_path / "shots" / "a.png").write_bytes(data)
    text = base64.b64encode(data).decode()

    assert image_cell_bytes("shots/a.png", str(tmp_path)) == data  # beside the table
    assert image_cell_bytes(str(tmp_path / "shots" / "a.png"), "/elsewhere") == data
    assert image_cell_bytes(text, str(tmp_path)) == data
    assert image_cell_bytes(f"data:image/png;base64,{text}", None) == data
    assert image_cell_bytes({"b64": text}, None) == data  # as TF Serving's REST API writes it
    assert image_cell_bytes(text[:40] + "\n" + text[40:], None) == data  # wrapped base64


@pytest.mark.parametrize(
    ("cell", "message"),
    [
        ("shots/missing.png", r"neither an image file \(.*shots/missing.png does not exist\)"),
        ("cat", "'cat' is neither an image file"),
        ({"b64": "@@@@"}, "'@@@@' is not valid base64"),
        ({"png": "abcd"}, 'one key, "b64"'),
        ("data:image/png,rawtext", "must be base64"),
        (12, "expected a file path or base64 text, got int"),
    ],
)
def test_a_cell_naming_no_image_says_what_was_tried(
    tmp_path: Path, cell: object, message: str
) -> None:
    with pytest.raises(ImageCellError, match=message):
        image_cell_bytes(cell, str(tmp_path))


# -- whole builds -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """scikit-learn's digits as PNG files, a CSV naming them by relative path, and a JSON
    Lines file holding them as base64 in each of its three spellings."""
    directory = tmp_path_factory.mktemp("tables")
    images, labels = write_digits(directory / "raw", duplicates=[])
    paths = sorted((directory / "raw" / "digits_images").rglob("*.png"))
    by_index = {int(path.stem): path for path in paths}
    count = 240
    lines = ["id,image,label"]
    rows = []
    for index in range(count):
        relative = by_index[index].relative_to(directory)
        lines.append(f"{index},{relative},{labels[index]}")
        text = base64.b64encode(by_index[index].read_bytes()).decode()
        cell = [text, f"data:image/png;base64,{text}", {"b64": text}][index % 3]
        rows.append(json.dumps({"id": index, "image": cell, "label": int(labels[index])}))
    lines.append(f"{count},raw/no-such-file.png,1")  # one cell naming nothing
    (directory / "table.csv").write_text("\n".join(lines) + "\n")
    (directory / "table.jsonl").write_text("\n".join(rows) + "\n")
    np.save(directory / "pixels.npy", images[:count])
    return directory


def build(tables: Path, kind: str) -> Path:
    spec = {
        "name": "digits-table",
        "sources": [{"type": kind, "path": f"table.{kind}"}],
        "schema": {"id": {"type": "numeric", "dtype": "int64"}, "image": IMAGE,
                   "label": {"type": "categorical"}},
        "labels": ["label"],
        "dedup": {"exact": {"enabled": False}},
        "split": {"key": "id"},
    }  # fmt: skip
    output = tables / f"dataset-{kind}"
    build_dataset(load_spec(write_spec(tables / f"{kind}.yaml", spec)), output, overwrite=True)
    return output


def images_by_id(dataset: Path) -> dict[int, bytes]:
    return {example["id"][0]: example["image"][0] for example in all_examples(dataset)}


def test_image_paths_in_a_csv_and_base64_in_json_lines_build_the_same_images(
    tables: Path,
) -> None:
    from_csv = images_by_id(build(tables, "csv"))
    from_jsonl = images_by_id(build(tables, "jsonl"))

    assert from_csv == from_jsonl
    originals = np.load(tables / "pixels.npy")
    assert sorted(from_csv) == list(range(len(originals)))
    for index, data in from_csv.items():
        np.testing.assert_array_equal(pixels_of(data), originals[index])


def test_a_cell_naming_a_missing_file_is_quarantined_with_the_path(tables: Path) -> None:
    dataset = build(tables, "csv")

    (entry,) = [
        json.loads(line) for line in (dataset / "quarantine.jsonl").read_text().splitlines()
    ]
    assert entry["origin"] == "table.csv:242"
    assert "raw/no-such-file.png does not exist" in entry["reason"]
