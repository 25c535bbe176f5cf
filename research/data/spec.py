"""The dataset spec: what `slipway data build SPEC.yaml` reads.

A spec names the sources, the schema (declared, inferred, or a mix), the cleaning
rules, de-duplication, the split, the subword vocabulary and the sharding. Paths in
a spec are relative to the spec file so a spec and its data can move together.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from contracts.yaml_config import ConfigError, StrictModel, load_yaml_model

FieldType = Literal["numeric", "categorical", "text", "image"]
PiiKind = Literal["email", "phone", "ipv4", "card"]
PII_KINDS: tuple[PiiKind, ...] = ("email", "phone", "ipv4", "card")


class CsvSource(StrictModel):
    type: Literal["csv"]
    path: str = Field(description="file or glob, relative to the spec file")
    delimiter: str = ","
    rename: dict[str, str] = Field(default_factory=dict, description="source column -> field")


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


Source = Annotated[
    CsvSource | JsonlSource | TextSource | ImageFolderSource | NpzSource,
    Field(discriminator="type"),
]


class FieldSchema(StrictModel):
    """One field of a record, as declared in the spec or inferred from the sources."""

    type: FieldType
    dtype: Literal["float32", "int64"] = "float32"
    shape: list[int] = Field(default_factory=list, description="numeric only: [] or [n]")
    height: int | None = Field(default=None, gt=0)
    width: int | None = Field(default=None, gt=0)
    channels: Literal[1, 3] | None = None

    @model_validator(mode="after")
    def _check_kind_specific(self) -> FieldSchema:
        if self.type == "image" and None in (self.height, self.width, self.channels):
            raise ValueError("an image field needs height, width and channels")
        if self.type != "numeric" and self.shape:
            raise ValueError("shape applies to numeric fields only")
        if len(self.shape) > 1:
            raise ValueError("numeric fields are scalars or vectors: shape [] or [n]")
        return self


class LengthBounds(StrictModel):
    min: int = Field(default=0, ge=0)
    max: int | None = Field(default=None, gt=0)


class PiiSpec(StrictModel):
    enabled: bool = True
    fields: list[str] | None = Field(default=None, description="default: every text field")
    kinds: list[PiiKind] = Field(default_factory=lambda: list(PII_KINDS))


class CleanSpec(StrictModel):
    required: list[str] = Field(default_factory=list)
    unicode_normalization: Literal["NFKC", "NFC", "none"] = "NFKC"
    collapse_whitespace: bool = True
    length: dict[str, LengthBounds] = Field(
        default_factory=dict, description="text field -> bounds in characters"
    )
    pii: PiiSpec = Field(default_factory=PiiSpec)


class ExactDedupSpec(StrictModel):
    enabled: bool = True
    fields: list[str] | None = Field(
        default=None, description="fields hashed together; default every field"
    )


class NearDedupSpec(StrictModel):
    field: str
    threshold: float = Field(default=0.8, gt=0.0, le=1.0, description="Jaccard similarity")
    num_perm: int = Field(default=128, ge=16, le=1024)
    shingle: Literal["word", "char"] = "word"
    ngram: int = Field(default=3, ge=1, le=32)


class DedupSpec(StrictModel):
    exact: ExactDedupSpec = Field(default_factory=ExactDedupSpec)
    near: NearDedupSpec | None = None


class SplitSpec(StrictModel):
    ratios: dict[str, float] = Field(
        default_factory=lambda: {"train": 0.8, "validation": 0.1, "test": 0.1}
    )
    key: str | None = Field(
        default=None, description="field whose hash picks the split; default the record content"
    )
    seed: str = "slipway"

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
    fields: list[str] | None = Field(default=None, description="default: every text field")
    size: int = Field(default=8000, ge=16)
    min_frequency: int = Field(default=2, ge=1)
    lowercase: bool = True


class OutputSpec(StrictModel):
    num_shards: int | dict[str, int] = 1
    compression: Literal["none", "gzip"] = "none"

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


class DatasetSpec(StrictModel):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    sources: list[Source] = Field(min_length=1)
    schema_: dict[str, FieldSchema] = Field(default_factory=dict, alias="schema")
    infer_schema: bool = Field(
        default=True, description="infer the fields the schema does not declare"
    )
    labels: list[str] = Field(default_factory=list)
    clean: CleanSpec = Field(default_factory=CleanSpec)
    dedup: DedupSpec = Field(default_factory=DedupSpec)
    split: SplitSpec = Field(default_factory=SplitSpec)
    vocab: VocabSpec = Field(default_factory=VocabSpec)
    output: OutputSpec = Field(default_factory=OutputSpec)
    base_dir: str = Field(default=".", exclude=True, description="set from the spec's location")

    def resolve(self, path: str) -> Path:
        """A source path as the spec means it: relative to the spec file."""
        candidate = Path(path).expanduser()
        return candidate if candidate.is_absolute() else Path(self.base_dir) / candidate

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


def _exists(pattern: Path) -> bool:
    if any(char in str(pattern) for char in "*?["):
        return any(Path(pattern.anchor).glob(str(pattern.relative_to(pattern.anchor))))
    return pattern.exists()
