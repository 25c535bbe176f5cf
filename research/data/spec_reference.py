"""The dataset spec reference (``docs/reference/data-spec.md``), generated from the spec's model.

Every key of ``research.data.spec.DatasetSpec`` with its type, constraints, default,
description and an example, so the reference cannot drift from what ``load_spec``
accepts: ``tests/research/test_spec_reference.py`` fails when the committed file and
this output differ. Regenerate it with::

    python -m research.data.spec_reference > docs/reference/data-spec.md

An example is the value a shipped spec in ``examples/data/`` gives the key, when one
does (real and known to build); otherwise it comes from ``EXAMPLES`` below.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from contracts.config_reference import (
    NESTED,
    Key,
    cell,
    config_keys,
    render_sections,
    yaml_value,
)
from research.data.spec import DatasetSpec

EXAMPLE_SPECS = Path(__file__).resolve().parents[2] / "examples" / "data"
EXAMPLE_CHARS = 80  # a longer example is cut: the spec it comes from has the rest
ANY_NAME = "<field>"  # a key the spec author chooses: a field name in ``schema``

# Examples for the keys no shipped spec sets, by key path (see ``Key.path``).
EXAMPLES: dict[str, Any] = {
    "exclude": ["row_id"],
    "quality.category_variants": "refuse",
    "quality.min_class_records": 20,
    "sources[csv].delimiter": ";",
    "sources[csv].comment": "#",
    "sources[csv].encoding": "latin-1",
    "sources[csv].na_values": ["", "NA", "missing"],
    "sources[csv].rename": {"Mean Radius": "mean_radius"},
    "sources[jsonl].rename": {"body": "text"},
    "sources[text].path": "reviews/*.txt",
    "sources[text].mode": "file",
    "sources[text].field": "review",
    "sources[text].encoding": "latin-1",
    "sources[text].label": "positive",
    "sources[text].label_field": "sentiment",
    "sources[image_folder].image_field": "photo",
    "sources[image_folder].label_field": "species",
    "sources[hdf5].path": "scans.h5",
    "sources[hdf5].fields": {"image": "/scans", "label": "/labels"},
    "sources[hdf5].images": ["image"],
    "schema.<field>.shape": [3],
    "schema.<field>.clip": [0, 1000000],
    "schema.<field>.transform": "log",
    "schema.<field>.non_finite": "keep",
    "schema.<field>.words.max_terms": 50000,
    "clean.unicode_normalization": "NFC",
    "clean.collapse_whitespace": False,
    "clean.pii.enabled": False,
    "clean.pii.kinds": ["email", "phone"],
    "clean.pii.phone_regions": ["US", "CA", "GB", "IN"],
    "dedup.near.num_perm": 256,
    "split.key": "user_id",
    "vocab.character_coverage": 1.0,
    "vocab.input_sentence_size": 200_000,
    "vocab.input_characters": 50_000_000,
}


def spec_keys() -> list[Key]:
    """Every key of the spec, in the order the model declares them."""
    return config_keys(DatasetSpec, any_name=ANY_NAME)


# ------------------------------------------------------------------------------- examples


def shipped_examples() -> dict[str, tuple[Any, str]]:
    """Key path -> (value, spec file name) for every key a spec in examples/data sets."""
    found: dict[str, tuple[Any, str]] = {}
    for path in sorted(EXAMPLE_SPECS.glob("*.yaml")):
        spec = yaml.safe_load(path.read_text(encoding="utf-8"))
        for key, value in _flatten(spec, ""):
            found.setdefault(key, (value, path.name))
    return found


def _flatten(value: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    """(key path, value) for every key of a spec, in ``Key.path`` notation."""
    if not isinstance(value, dict):
        return
    for name, item in value.items():
        path = f"{prefix}{name}"
        yield path, item
        if path == "sources":
            for source in item:
                yield from _flatten(source, f"sources[{source.get('type')}].")
        elif path in ("schema", "clean.length") and isinstance(item, dict):
            for field in item.values():
                yield from _flatten(field, f"{path}.{ANY_NAME}.")
        elif isinstance(item, dict):
            yield from _flatten(item, f"{path}.")


def example_for(key: Key, shipped: dict[str, tuple[Any, str]]) -> str | None:
    if key.path in shipped:
        value, source = shipped[key.path]
        return f"`{_shortened(yaml_value(value))}` ({source})"
    if key.path in EXAMPLES:
        return f"`{_shortened(yaml_value(EXAMPLES[key.path]))}`"
    return None


def _shortened(text: str) -> str:
    return text if len(text) <= EXAMPLE_CHARS else text[: EXAMPLE_CHARS - 1] + "…"


# ------------------------------------------------------------------------------- document

HEADER = """\
# Dataset spec reference

Every key of a dataset spec (`slipway data build SPEC.yaml`), generated from the spec's
model in `research/data/spec.py` by

    python -m research.data.spec_reference > docs/reference/data-spec.md

and checked by a test, so it cannot drift from what the build accepts. Paths in a spec are
relative to the spec file. `<field>` stands for a field name you choose. An example marked
with a file name is what that spec in `examples/data/` sets.
"""


def render() -> str:
    """The whole reference as Markdown: one table per section, in declaration order."""
    shipped = shipped_examples()

    def example(key: Key) -> str:
        return "see below" if key.type.startswith(NESTED) else example_for(key, shipped) or ""

    columns = (
        ("key", lambda key: f"`{key.path}`"),
        ("type", lambda key: key.type),
        ("default", lambda key: key.default),
        ("description", lambda key: cell(key.description)),
        ("example", example),
    )
    return "\n".join([HEADER, *render_sections(spec_keys(), columns)]) + "\n"


def main() -> None:
    print(render(), end="")


if __name__ == "__main__":
    main()
