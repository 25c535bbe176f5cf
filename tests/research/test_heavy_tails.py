"""A heavy-tailed column declared ``transform: log`` and ``clip``: built, read by the
input pipeline and by the served preprocessing alike, standardized as the model reads it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from contracts.dataset_manifest import load_manifest
from research.data.input_pipeline import make_dataset, training_means
from research.data.pipeline import build_dataset
from research.data.spec import load_spec
from research.preprocessing.preprocessor import FeaturePreprocessor
from tests.support.raw_data import write_spec
from tests.support.shards import read_examples

CLIP = (0.0, 5e6)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Incomes spread over six orders of magnitude, one absurd outlier, and a label."""
    directory = tmp_path_factory.mktemp("incomes")
    rng = np.random.default_rng(5)
    incomes = np.exp(rng.normal(10.0, 1.5, 600))
    incomes[17] = 3e9
    lines = ["income,age,rich"]
    for row, income in enumerate(incomes):
        lines.append(f"{income:.2f},{rng.integers(18, 90)},{int(income > 30_000)}")
        if row == 40:
            lines.append(f",{rng.integers(18, 90)},0")  # a missing income
    (directory / "incomes.csv").write_text("\n".join(lines) + "\n")
    spec = write_spec(
        directory / "incomes.yaml",
        {
            "name": "incomes",
            "sources": [{"type": "csv", "path": "incomes.csv"}],
            "schema": {"income": {"type": "numeric", "transform": "log", "clip": list(CLIP)}},
            "labels": ["rich"],
            "dedup": {"exact": {"enabled": False}},
        },
    )
    build_dataset(load_spec(spec), directory / "dataset")
    return directory / "dataset"


def split_values(dataset: Path, *, raw: bool) -> np.ndarray:
    batches = make_dataset(dataset, "train", batch_size=256, features=["income"], raw=raw)
    return np.concatenate([features["income"].numpy() for features, _ in batches])


def test_the_manifest_records_how_the_model_reads_the_feature(dataset: Path) -> None:
    manifest = load_manifest(dataset)
    income = manifest.features["income"]
    assert (income.transform, income.clip) == ("log", CLIP)
    stats = manifest.statistics["train"]["features"]["income"]
    records = read_examples(dataset, "train")["train"]
    present = np.array([record["income"][0] for record in records if "income" in record])
    assert stats["missing"] == len(records) - len(present) == 1
    assert stats["max"] == pytest.approx(present.max(), rel=1e-6)  # the data as it is
    read = np.log1p(np.clip(present, *CLIP))
    assert stats["as_read"]["mean"] == pytest.approx(read.mean(), rel=1e-5)
    assert stats["as_read"]["std"] == pytest.approx(read.std(), rel=1e-5)


def test_the_model_sees_the_tail_standardized_and_serving_reads_it_the_same(
    dataset: Path,
) -> None:
    seen = split_values(dataset, raw=False)
    # Standardized with the statistics of the values as read, the outlier no longer
    # squeezes the rest: the bulk spreads over about one unit.
    assert abs(seen.mean()) < 0.05 and 0.9 < seen.std() < 1.1
    assert seen.max() < 5.0
    manifest = load_manifest(dataset)
    served = FeaturePreprocessor.for_inputs(manifest, ["income"], dataset_dir=dataset)
    raw = split_values(dataset, raw=True)
    # One graph, batched otherwise: vectorized and scalar log differ in the last bit.
    np.testing.assert_allclose(served({"income": raw})["income"].numpy(), seen, atol=2e-6)


def test_a_missing_value_reads_as_the_mean_of_the_values_as_read(dataset: Path) -> None:
    manifest = load_manifest(dataset)
    served = FeaturePreprocessor.for_inputs(manifest, ["income"], dataset_dir=dataset)
    filled = training_means(manifest, manifest.features)["income"]
    missing = [filled, float("nan")]  # in a training record; from a client
    np.testing.assert_allclose(served({"income": np.array(missing)})["income"], [0, 0], atol=1e-6)


@pytest.mark.parametrize("non_finite", ["quarantine", "keep"])
def test_infinities_are_quarantined_with_the_fix_unless_the_field_keeps_them(
    tmp_path: Path, non_finite: str
) -> None:
    lines = ["reading,label"] + [f"{i * 0.5},{i % 2}" for i in range(40)]
    lines[8] = "inf,1"
    lines[9] = "-Infinity,0"
    (tmp_path / "sensor.csv").write_text("\n".join(lines) + "\n")
    spec = write_spec(
        tmp_path / "sensor.yaml",
        {
            "name": "sensor",
            "sources": [{"type": "csv", "path": "sensor.csv"}],
            "schema": {"reading": {"type": "numeric", "non_finite": non_finite}},
            "labels": ["label"],
            "dedup": {"exact": {"enabled": False}},
        },
    )

    result = build_dataset(load_spec(spec), tmp_path / "out")

    readings = [v for split in read_examples(tmp_path / "out").values() for e in split
                for v in e["reading"]]  # fmt: skip
    quarantined = (tmp_path / "out" / "quarantine.jsonl").read_text().splitlines()
    statistics = [s["features"]["reading"] for s in result.manifest.statistics.values()]
    assert all(np.isfinite(s["mean"]) for s in statistics if s["count"])  # they skip infinities
    if non_finite == "keep":
        assert not quarantined and len(readings) == 40
        assert sorted(r for r in readings if not np.isfinite(r)) == [-np.inf, np.inf]
        return
    assert len(quarantined) == 2 and len(readings) == 38 and np.isfinite(readings).all()
    assert "not finite (inf); the field's non_finite: keep would keep it" in quarantined[0]
