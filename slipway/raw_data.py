"""Raw files the example dataset specs are built from, made from what is installed here.

Nothing is downloaded: scikit-learn ships its small tables and the 8x8 digits inside
the wheel (its ``load_*`` functions, never ``fetch_*``), and a text task comes from the
Python standard library's own docstrings. Every writer is deterministic, so a dataset
built from these files is the same on every machine with the same packages.
"""

from __future__ import annotations

import ast
import json
import random
import shutil
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

# Standard-library packages about distinct subjects, each with well over a hundred
# documented functions and classes: the docstring says which package it is from.
DOCSTRING_PACKAGES = ("asyncio", "email", "http", "logging", "tkinter", "unittest", "xml")
# Shorter docstrings ("Return self.", "Close the file.") say nothing about their package.
MIN_DOCSTRING_CHARS = 40
# Caps the largest packages so that no class dominates the task.
MAX_DOCSTRINGS_PER_PACKAGE = 300
DOCSTRING_SEED = 20240601
# Tests shipped inside packages document tests, not their package's subject.
TEST_DIRECTORIES = frozenset({"test", "tests", "idle_test"})


def sklearn_csv(name: str) -> Path:
    """One of the CSV tables inside scikit-learn's wheel (``breast_cancer.csv``, ...)."""
    import sklearn

    return Path(sklearn.__file__).parent / "datasets" / "data" / name


def copy_sklearn_csv(name: str, raw: Path) -> Path:
    """The table exactly as scikit-learn ships it: a count line first, then the rows."""
    raw.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copyfile(sklearn_csv(name), raw / name))


def write_diabetes_csv(raw: Path) -> Path:
    """scikit-learn's diabetes table in its original units (ages in years, blood pressure
    in mm Hg): ten measurements and a disease-progression score a year later, with a
    header line, one row per patient."""
    import csv

    from sklearn.datasets import load_diabetes

    table = load_diabetes(scaled=False)
    raw.mkdir(parents=True, exist_ok=True)
    path = raw / "diabetes.csv"
    with path.open("w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow([*table.feature_names, "progression"])
        for values, target in zip(table.data, table.target, strict=True):
            writer.writerow([f"{value:g}" for value in (*values, target)])
    return path


def write_digits_npz(raw: Path) -> Path:
    """scikit-learn's 8x8 digits as 8-bit grey images (0-255) with their labels."""
    import numpy as np

    raw.mkdir(parents=True, exist_ok=True)
    images, target = digit_images()
    path = raw / "digits.npz"
    np.savez(path, images=images, target=target)
    return path


def write_digits_folder(raw: Path) -> Path:
    """The same digits as an image folder: one sub-folder of PNG files per class."""
    from PIL import Image

    folder = raw / "digits_images"
    images, target = digit_images()
    for index, (image, label) in enumerate(zip(images, target, strict=True)):
        (folder / str(label)).mkdir(parents=True, exist_ok=True)
        Image.fromarray(image, mode="L").save(folder / str(label) / f"{index:04d}.png")
    return folder


def digit_images() -> tuple[np.ndarray, np.ndarray]:
    """The digits' images scaled from scikit-learn's 0-16 to 0-255, and their labels."""
    import numpy as np
    from sklearn.datasets import load_digits

    digits = load_digits()
    return np.round(digits.images * (255.0 / 16.0)).astype(np.uint8), digits.target


def stdlib_docstrings(
    packages: tuple[str, ...] = DOCSTRING_PACKAGES,
    *,
    per_package: int = MAX_DOCSTRINGS_PER_PACKAGE,
    seed: int = DOCSTRING_SEED,
) -> list[dict[str, str]]:
    """Docstrings of the functions and classes of ``packages``, labelled by package.

    Read from the source files with ``ast`` (nothing is imported, so no module runs),
    in sorted file order; a package with more than ``per_package`` docstrings keeps a
    seeded sample of them, in that order.
    """
    records = []
    for package in packages:
        texts = list(_docstrings(_stdlib_root() / package))
        if len(texts) > per_package:
            keep = sorted(random.Random(f"{seed}-{package}").sample(range(len(texts)), per_package))
            texts = [texts[index] for index in keep]
        records.extend({"text": text, "package": package} for text in texts)
    return records


def write_docstrings_jsonl(raw: Path) -> Path:
    """The standard-library docstring task as JSON Lines: ``{"text", "package"}``."""
    raw.mkdir(parents=True, exist_ok=True)
    path = raw / "docstrings.jsonl"
    lines = (json.dumps(record, ensure_ascii=False) for record in stdlib_docstrings())
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return path


def _stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _docstrings(package_dir: Path) -> Iterator[str]:
    if not package_dir.is_dir():
        raise FileNotFoundError(f"no standard-library package at {package_dir}")
    for path in sorted(package_dir.rglob("*.py")):
        if TEST_DIRECTORIES & set(path.relative_to(package_dir).parts):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                text = ast.get_docstring(node)
                if text and len(text) >= MIN_DOCSTRING_CHARS:
                    yield text
