"""The dataset spec: what `slipway data build SPEC.yaml` reads.

A spec names the sources, the schema (declared, inferred, or a mix), the cleaning
rules, de-duplication, the split, the subword vocabulary and the sharding. Paths in
a spec are relative to the spec file so a spec and its data can move together.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Annotated, ClassVar, Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from contracts.yaml_config import ConfigError, StrictModel, load_yaml_model

FieldType = Literal["numeric", "categorical", "text", "image"]
PiiKind = Literal["email", "phone", "ipv4", "card"]
PII_KINDS: tuple[PiiKind, ...] = ("email", "phone", "ipv4", "card")
# Regions whose national phone formats are masked by default: North American numbers
# and the three largest European numbering plans. Numbers written with "+" and a country
# code are masked whatever the list holds.
DEFAULT_PHONE_REGIONS: tuple[str, ...] = ("US", "GB", "FR", "DE")


# Cell values that mean "missing" in CSV files as people write them ("?" is the UCI
# repository's marker; NaN needs none: it parses as a number and is read as missing).
DEFAULT_NA_VALUES: tuple[str, ...] = ("", "NA", "N/A", "n/a", "null", "?", "-")


class CsvSource(StrictModel):
    """A CSV file (or glob); research.data.csv_source documents every option."""

    type: Literal["csv"]
    path: str = Field(description="file or glob, relative to the spec file")
    delimiter: str = ","
    header: Literal["first_row", "none"] = Field(
        default="first_row", description="first_row: the first line read names the columns"
    )
    skip_lines: int = Field(
        default=0, ge=0, description="lines skipped at the top of each file, before anything"
    )
    names: list[str] | None = Field(
        default=None, description="column names; replace the header row's names if there is one"
    )
    comment: str | None = Field(
        default=None, min_length=1, description="lines starting with this text are ignored"
    )
    encoding: str = "utf-8"
    na_values: list[str] = Field(
        default_factory=lambda: list(DEFAULT_NA_VALUES),
        description="cell values (compared without surrounding spaces) that mean missing",
    )
    rename: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "source column -> field. An unnamed first column of increasing integers (the "
            "index pandas' to_csv writes) is left out, unless renamed from ''"
        ),
    )


class JsonlSource(StrictModel):
    type: Literal["jsonl"]
    path: str
    rename: dict[str, str] = Field(default_factory=dict)


class TextSource(StrictModel):
    type: Literal["text"]
    path: str
    mode: Literal["line", "file"] = "line"
    field: str = "text"
    encoding: str = "utf-8"
    label: str | None = Field(
        default=None, description="constant value of `label_field` for every document"
    )
    label_field: str = "label"


class ImageFolderSource(StrictModel):
    type: Literal["image_folder"]
    path: str = Field(description="a folder with one sub-folder per class")
    image_field: str = "image"
    label_field: str = "label"


class NpzSource(StrictModel):
    type: Literal["npz"]
    path: str
    arrays: dict[str, str] = Field(
        default_factory=dict,
        description="array name -> field name; empty means every array, under its own name",
    )
    images: list[str] = Field(
        default_factory=list, description="fields whose arrays are images (HxW or HxWxC)"
    )


class Hdf5Source(StrictModel):
    """An HDF5 file (or glob) of datasets sharing their first dimension, read in chunks."""

    type: Literal["hdf5"]
    path: str
    fields: dict[str, str] = Field(
        default_factory=dict,
        description="field name -> dataset path in the file (/images); empty means every "
        "dataset, named by its path",
    )
    images: list[str] = Field(
        default_factory=list, description="fields whose datasets are images (HxW or HxWxC)"
    )


Source = Annotated[
    CsvSource | JsonlSource | TextSource | ImageFolderSource | NpzSource | Hdf5Source,
    Field(discriminator="type"),
]


class WordsSpec(StrictModel):
    """A text field read as a TF-IDF bag of word n-grams, whose terms the build learns
    from the training split: for few texts a linear model over it beats a sequence model."""

    ngrams: int = Field(default=2, ge=1, le=3, description="longest run of words a term is")
    min_documents: int = Field(
        default=2, ge=1, description="training texts a term must occur in to be kept"
    )
    max_terms: int = Field(
        default=20_000, ge=1, description="most terms kept, those in the most texts first"
    )


class FieldSchema(StrictModel):
    """One field of a record, as declared in the spec or inferred from the sources."""

    type: FieldType = Field(description="what the values are; decides the encoding")
    dtype: Literal["float32", "int64"] = Field(default="float32", description="numeric only")
    shape: list[int] = Field(default_factory=list, description="numeric only: [] or [n]")
    height: int | None = Field(default=None, gt=0, description="image only: pixels")
    width: int | None = Field(default=None, gt=0, description="image only: pixels")
    channels: Literal[1, 3] | None = Field(
        default=None, description="image only: 1 grey, 3 RGB; images are converted to it"
    )
    clip: tuple[float, float] | None = Field(
        default=None,
        description="numeric only: [low, high] a model clips values to (outliers); the data "
        "keeps them as they are",
    )
    transform: Literal["log"] | None = Field(
        default=None,
        description="numeric only: log reads sign(x) * log(1 + |x|), after clip, for heavy "
        "tails (incomes, counts); the statistics a model standardizes with are of these values",
    )
    words: WordsSpec | None = Field(
        default=None,
        description="text only: models read the field as a TF-IDF bag of word n-grams "
        "learned from the training split, instead of subword ids",
    )
    non_finite: Literal["quarantine", "keep"] = Field(
        default="quarantine",
        description="numeric float32 only: a value of inf or -inf (or NaN inside a vector) "
        "quarantines its record, or is kept as it is (statistics skip it; a training step "
        "it makes non-finite is skipped)",
    )

    @model_validator(mode="after")
    def _check_kind_specific(self) -> FieldSchema:
        if self.type != "numeric" and (self.clip is not None or self.transform is not None):
            raise ValueError("clip and transform apply to numeric fields only")
        if self.type != "text" and self.words is not None:
            raise ValueError("words applies to text fields only")
        if self.non_finite == "keep" and (self.type != "numeric" or self.dtype != "float32"):
            raise ValueError("non_finite: keep applies to numeric float32 fields only")
        if self.clip is not None and not (
            math.isfinite(self.clip[0])
            and math.isfinite(self.clip[1])
            and self.clip[0] < self.clip[1]
        ):
            raise ValueError(f"clip must be two finite numbers, low < high; got {list(self.clip)}")
        if self.type == "image" and None in (self.height, self.width, self.channels):
            raise ValueError("an image field needs height, width and channels")
        if self.type != "numeric" and self.shape:
            raise ValueError("shape applies to numeric fields only")
        if len(self.shape) > 1:
            raise ValueError("numeric fields are scalars or vectors: shape [] or [n]")
        return self


class LengthBounds(StrictModel):
    min: int = Field(default=0, ge=0, description="a shorter value drops the record")
    max: int | None = Field(default=None, gt=0, description="a longer value drops the record")


class PiiSpec(StrictModel):
    enabled: bool = Field(default=True, description="mask personal data in text fields")
    fields: list[str] | None = Field(
        default=None, description="default: every text field not read as words"
    )
    kinds: list[PiiKind] = Field(
        default_factory=lambda: list(PII_KINDS), description="what is masked"
    )
    phone_regions: list[str] = Field(
        default_factory=lambda: list(DEFAULT_PHONE_REGIONS),
        description="ISO 3166 regions whose national phone formats are recognised",
    )

    @field_validator("phone_regions")
    @classmethod
    def _known_regions(cls, regions: list[str]) -> list[str]:
        import phonenumbers

        unknown = [region for region in regions if region not in phonenumbers.SUPPORTED_REGIONS]
        if unknown:
            raise ValueError(
                f"unknown phone region(s) {', '.join(map(repr, unknown))}; use upper-case "
                "ISO 3166 codes such as 'US', 'GB', 'FR'"
            )
        return regions


class CleanSpec(StrictModel):
    required: list[str] = Field(
        default_factory=list,
        description="fields a record must have, besides labels and images; else it is dropped",
    )
    unicode_normalization: Literal["NFKC", "NFC", "none"] = Field(
        default="NFKC", description="Unicode form of text and categorical values"
    )
    collapse_whitespace: bool = Field(
        default=True, description="runs of whitespace become one space; ends are stripped"
    )
    length: dict[str, LengthBounds] = Field(
        default_factory=dict, description="text field -> bounds in characters"
    )
    pii: PiiSpec = Field(default_factory=PiiSpec, description="personal data masking")


class ExactDedupSpec(StrictModel):
    enabled: bool = Field(default=True, description="keep one record per identical content")
    fields: list[str] | None = Field(
        default=None, description="fields hashed together; default every field"
    )


class NearDedupSpec(StrictModel):
    field: str = Field(description="the text field compared")
    threshold: float = Field(default=0.8, gt=0.0, le=1.0, description="Jaccard similarity")
    num_perm: int = Field(
        default=128, ge=16, le=1024, description="MinHash permutations: more is more exact"
    )
    shingle: Literal["word", "char"] = Field(default="word", description="n-grams of what")
    ngram: int = Field(default=3, ge=1, le=32, description="shingle length")


class DedupSpec(StrictModel):
    exact: ExactDedupSpec = Field(default_factory=ExactDedupSpec, description="identical records")
    near: NearDedupSpec | None = Field(
        default=None, description="near-duplicate texts (MinHash + LSH); off when absent"
    )


class SplitSpec(StrictModel):
    ratios: dict[str, float] = Field(
        default_factory=lambda: {"train": 0.8, "validation": 0.1, "test": 0.1},
        description="split name -> share of the records; the shares sum to 1",
    )
    key: str | None = Field(
        default=None, description="field whose hash picks the split; default the record content"
    )
    seed: str = Field(default="slipway", description="another seed makes another split")

    @field_validator("ratios")
    @classmethod
    def _ratios_sum_to_one(cls, ratios: dict[str, float]) -> dict[str, float]:
        if not ratios:
            raise ValueError("at least one split is needed")
        if any(value <= 0 for value in ratios.values()):
            raise ValueError("every split ratio must be positive")
        if abs(sum(ratios.values()) - 1.0) > 1e-6:
            raise ValueError(f"split ratios must sum to 1, got {sum(ratios.values()):g}")
        return ratios


class VocabSpec(StrictModel):
    """A sentencepiece model per text field, learned from the training split."""

    removed_keys: ClassVar[dict[str, str]] = {
        "min_frequency": "sentencepiece keeps the pieces that best cover the training text, "
        "without a frequency cut-off: set vocab.size (fewer pieces drop the rarest) and "
        "vocab.character_coverage instead",
    }

    fields: list[str] | None = Field(
        default=None, description="default: every text field not read as words"
    )
    size: int = Field(
        default=8000,
        ge=16,
        description="subword tokens per vocabulary; a corpus too small to fill it gets fewer",
    )
    model_type: Literal["unigram", "bpe"] = Field(
        default="unigram",
        description=(
            "sentencepiece algorithm; the graph's fast kernel (TFLite's too) segments unigram "
            "models exactly as sentencepiece, BPE ones on a few texts differently"
        ),
    )
    character_coverage: float = Field(
        default=0.9995,
        gt=0.0,
        le=1.0,
        description="share of the characters seen that get a token; the rarest others are unknown",
    )
    input_sentence_size: int = Field(
        default=1_000_000,
        ge=1,
        description="texts the model is learned from at most: a sample fixed by their content",
    )
    input_characters: int = Field(
        default=10_000_000,
        ge=1,
        description=(
            "characters of that sample at most; learning takes about 20 bytes of memory "
            "per character (unigram), so this bounds the build's largest task"
        ),
    )


class OutputSpec(StrictModel):
    num_shards: int | dict[str, int] = Field(
        default=1, description="TFRecord files per split, or split -> files (1 if unlisted)"
    )
    compression: Literal["none", "gzip"] = Field(default="none", description="of the shards")

    def shards_for(self, split: str) -> int:
        if isinstance(self.num_shards, int):
            return self.num_shards
        return self.num_shards.get(split, 1)

    @field_validator("num_shards")
    @classmethod
    def _positive(cls, value: int | dict[str, int]) -> int | dict[str, int]:
        counts = value.values() if isinstance(value, dict) else [value]
        if any(count < 1 for count in counts):
            raise ValueError("shard counts must be at least 1")
        return value


class QualitySpec(StrictModel):
    """When a finished build is refused instead of published (research.data.quality)."""

    max_quarantine_fraction: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description="largest share of the input records that may be quarantined or dropped "
        "by a clean rule; duplicates merged by dedup are not a loss",
    )
    category_variants: Literal["warn", "refuse", "merge"] = Field(
        default="warn",
        description="categorical values that differ only in case or spacing ('Red', 'RED'): "
        "warn names them with their counts; refuse refuses the build; merge makes each the "
        "most common spelling, labels included, and the report names the merges",
    )
    min_class_records: int = Field(
        default=5,
        ge=0,
        description="a label class with fewer records is named in a warning",
    )


class DatasetSpec(StrictModel):
    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", description="default output: datasets/<name>"
    )
    sources: list[Source] = Field(min_length=1, description="where the records come from")
    schema_: dict[str, FieldSchema] = Field(
        default_factory=dict, alias="schema", description="field name -> declared field"
    )
    infer_schema: bool = Field(
        default=True, description="infer the fields the schema does not declare"
    )
    exclude: list[str] = Field(
        default_factory=list,
        description="source columns that are not fields (never inferred nor written); "
        "split.key may still name one",
    )
    labels: list[str] = Field(
        default_factory=list, description="fields a model predicts; a record needs them all"
    )
    clean: CleanSpec = Field(default_factory=CleanSpec, description="cleaning rules")
    dedup: DedupSpec = Field(default_factory=DedupSpec, description="de-duplication")
    split: SplitSpec = Field(default_factory=SplitSpec, description="the deterministic split")
    vocab: VocabSpec = Field(default_factory=VocabSpec, description="subword vocabularies")
    output: OutputSpec = Field(default_factory=OutputSpec, description="the shards")
    quality: QualitySpec = Field(
        default_factory=QualitySpec, description="when a build is refused, not published"
    )
    base_dir: str = Field(default=".", exclude=True, description="set from the spec's location")

    @model_validator(mode="after")
    def _shards_of_known_splits(self) -> DatasetSpec:
        """``output.num_shards`` may name only splits of ``split.ratios``: a misspelt name
        would otherwise leave its split one shard, silently."""
        from research.data.feature_names import closest_name

        counts = self.output.num_shards
        splits = list(self.split.ratios)
        unknown = (
            [name for name in counts if name not in splits] if isinstance(counts, dict) else []
        )
        if not unknown:
            return self
        errors = []
        for name in unknown:
            close = closest_name(name, splits)
            hint = f"; did you mean {close!r}?" if close else ""
            message = f"no split {name!r} in split.ratios ({', '.join(splits)}){hint}"
            errors.append(
                InitErrorDetails(
                    type=PydanticCustomError("value_error", "{message}", {"message": message}),
                    loc=("output", "num_shards", name),
                    input=counts[name],
                )
            )
        raise ValidationError.from_exception_data(type(self).__name__, errors)

    def resolve(self, path: str) -> str:
        """A source path as the spec means it: a URI as written, a local path relative
        to the spec file. (A string, not a ``Path``, which would mangle ``gs://``.)"""
        if "://" in path:
            return path
        candidate = Path(path).expanduser()
        return str(candidate if candidate.is_absolute() else Path(self.base_dir) / candidate)

    def spec_hash(self) -> str:
        """SHA-256 of the canonical spec: two builds with the same hash ran the same recipe."""
        canonical = json.dumps(
            self.model_dump(mode="json", by_alias=True), sort_keys=True, separators=(",", ":")
        )
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def load_spec(path: str | Path) -> DatasetSpec:
    """Read and validate a dataset spec; ConfigError names the file, line and key."""
    path = Path(path)
    spec = load_yaml_model(path, DatasetSpec)
    spec = spec.model_copy(update={"base_dir": str(path.resolve().parent)})
    for index, source in enumerate(spec.sources):
        pattern = spec.resolve(source.path)
        if not _exists(pattern):
            raise ConfigError(f"{path}: sources.{index}.path: no such file or folder: {pattern}")
    return spec


def _exists(pattern: str) -> bool:
    from research.data import filesystems  # Beam: only once a spec names its sources

    return filesystems.anything_at(pattern)
