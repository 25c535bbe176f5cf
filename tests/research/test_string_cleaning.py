"""Strings a client sends are cleaned in the graph as the build cleaned the training data:
the same Unicode form and whitespace, so lookups and tokens match."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import numpy as np
import pytest

from contracts.dataset_manifest import load_manifest
from research.data.clean import normalize_text
from research.data.pipeline import build_dataset
from research.data.spec import load_spec
from research.preprocessing.preprocessor import FeaturePreprocessor
from research.preprocessing.strings import StringCleaner
from tests.support.raw_data import write_spec

# Every character Python's str.split() splits on, and some that look alike but are not.
WHITESPACE = [chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace()]
NOT_WHITESPACE = ["\u200b", "\u180e", "\ufeff", "_", "-"]
PIECES = [
    "plain",
    "ＦＵＬＬ",  # full-width
    "ﬁne",  # a ligature NFKC splits
    "e\u0301",  # e + combining acute: NFC composes it
    "Å",
    "x²",
    "①",
    "naïve",
    "東京",
    "😀",
]


def random_strings(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randint(0, 6)):
            parts.append(rng.choice(PIECES + NOT_WHITESPACE))
            parts.append("".join(rng.choices(WHITESPACE, k=rng.randint(0, 3))))
        out.append("".join(parts))
    return out


@pytest.mark.parametrize(("form", "collapse"), [("NFKC", True), ("NFC", True), ("NFKC", False)])
def test_the_graph_cleans_as_the_build_does(form: str, collapse: bool) -> None:
    texts = random_strings(1000, seed=len(form) + collapse)
    cleaned = StringCleaner(form, collapse)(np.array(texts, dtype=object)).numpy()
    expected = [normalize_text(text, form, collapse) for text in texts]
    assert [value.decode("utf-8") for value in cleaned] == expected


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("strings")
    rng = random.Random(2)
    words = ["river", "stone", "quick", "fox", "garden", "lamp", "north", "window", "café"]
    lines = ["country,note,label"]
    for row in range(300):
        note = " ".join(rng.choices(words, k=rng.randint(3, 9)))
        lines.append(f"{rng.choice(['FR', 'DE', 'Ωmega'])},{note},{row % 2}")
    (directory / "rows.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    spec = write_spec(
        directory / "rows.yaml",
        {
            "name": "strings",
            "sources": [{"type": "csv", "path": "rows.csv"}],
            "schema": {"country": {"type": "categorical"}, "note": {"type": "text"}},
            "labels": ["label"],
            "dedup": {"exact": {"enabled": False}},
            "vocab": {"size": 40},
        },
    )
    build_dataset(load_spec(spec), directory / "dataset")
    return directory / "dataset"


def test_string_features_record_their_cleaning_and_serving_repeats_it(dataset: Path) -> None:
    manifest = load_manifest(dataset)
    for name in ("country", "note"):
        feature = manifest.features[name]
        assert (feature.normalization, feature.collapse_whitespace) == ("NFKC", True)
    served = FeaturePreprocessor.for_inputs(manifest, ["country", "note"], dataset_dir=dataset)

    def ids(country: list[str], note: list[str]) -> dict[str, np.ndarray]:
        result = served({"country": np.array(country, object), "note": np.array(note, object)})
        return {name: value.numpy() for name, value in result.items()}

    stored = ids(["FR", "Ωmega"], ["quick fox café", "river stone"])
    sent = ids([" ＦＲ\u00a0", "Ωmega\t"], ["quick\u3000 fox\n cafe\u0301 ", "\u2003river  stone"])
    np.testing.assert_array_equal(sent["country"], stored["country"])
    np.testing.assert_array_equal(sent["note"], stored["note"])
    assert stored["country"].min() > 0  # real categories, not the OOV id
