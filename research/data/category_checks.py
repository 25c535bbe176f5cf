"""Categories a person would call one, and classes too small to learn, found after a build.

``Class_1``, ``CLASS_1`` and ``class_1`` are three categories to a vocabulary, and a
model then learns two of them from a record each, without a word to anyone. After the
build, the values of every categorical field (counted over all splits, from the
manifest's statistics) are grouped by what is left of them without case and spacing;
a group of several spellings is a finding, with each spelling's count. So is a label
class with fewer than ``quality.min_class_records`` records. Findings are warnings in
the report and on screen; ``quality.category_variants: refuse`` refuses the build
instead.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

VARIANTS_SHOWN = 4  # spellings named per group, then "…"
GROUPS_SHOWN = 5  # groups named per field, then "and N more"


def spelling_key(value: str) -> str:
    """What two spellings of one category share: no case, single spaces, no ends."""
    return " ".join(value.split()).casefold()


def value_counts(statistics: Mapping[str, Any], field: str) -> Counter[str]:
    """A categorical field's records per value, over every split."""
    counts: Counter[str] = Counter()
    for split in statistics.values():
        stats = ((split or {}).get("features") or {}).get(field) or {}
        counts.update(stats.get("frequencies") or {})
    return counts


def variant_groups(counts: Mapping[str, int]) -> list[list[tuple[str, int]]]:
    """Groups of two or more values with one ``spelling_key``; most records first."""
    groups: dict[str, list[tuple[str, int]]] = {}
    for value, count in counts.items():
        groups.setdefault(spelling_key(value), []).append((value, count))
    found = [sorted(g, key=lambda vc: (-vc[1], vc[0])) for g in groups.values() if len(g) > 1]
    return sorted(found, key=lambda g: (-sum(count for _, count in g), g[0][0]))


def variants_finding(field: str, groups: list[list[tuple[str, int]]]) -> str:
    """``colour: 'Red' (40), 'red' (2) differ only in case or spacing``, and the fix."""
    described = []
    for group in groups[:GROUPS_SHOWN]:
        names = ", ".join(f"{value!r} ({count:,})" for value, count in group[:VARIANTS_SHOWN])
        described.append(names + (", …" if len(group) > VARIANTS_SHOWN else ""))
    more = f"; and {len(groups) - GROUPS_SHOWN} more groups" if len(groups) > GROUPS_SHOWN else ""
    return (
        f"{field}: {'; '.join(described)}{more} differ only in case or spacing, and each "
        "spelling is a category of its own; write each category one way in the sources, "
        "or set quality.category_variants: merge"
    )


def rare_classes_finding(field: str, counts: Mapping[str, int], minimum: int) -> str | None:
    """Label classes with fewer than ``minimum`` records, named with their counts."""
    rare = sorted((count, value) for value, count in counts.items() if count < minimum)
    if not rare:
        return None
    listed = ", ".join(f"{value!r} ({count:,})" for count, value in rare[:GROUPS_SHOWN])
    more = f" and {len(rare) - GROUPS_SHOWN} more" if len(rare) > GROUPS_SHOWN else ""
    return (
        f"{field}: class(es) {listed}{more} have fewer than {minimum} records "
        "(quality.min_class_records): too few to learn or to measure"
    )


def category_findings(
    statistics: Mapping[str, Any],
    categorical: Iterable[str],
    labels: Iterable[str],
    min_class_records: int,
) -> tuple[list[str], list[str]]:
    """(spelling variants, rare classes): one line per field with a finding."""
    label_set = set(labels)
    variants, rare = [], []
    for field in categorical:
        counts = value_counts(statistics, field)
        groups = variant_groups(counts)
        if groups:
            variants.append(variants_finding(field, groups))
        if field in label_set:
            finding = rare_classes_finding(field, counts, min_class_records)
            if finding:
                rare.append(finding)
    return variants, rare
