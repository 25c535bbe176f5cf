"""Feature names for any column name, and the closest name to one mistyped.

A dataset's field names become model input names and serving signature keys, which
accept only names matching ``research.models.specs._NAME`` (a letter, then letters,
digits, ``_``, ``.``, ``-``). Columns are named by people and tools (``mean radius``,
``petal length (cm)``, ``1st``, ``a/b``), so every column gets a feature name, and the
manifest records the column it came from.

The rule, applied only to names that are not valid already (a valid name is kept):

1. accents are dropped (``température`` -> ``temperature``);
2. every run of characters other than letters, digits, ``_``, ``.`` and ``-`` becomes
   one ``_``, and ``_`` at either end goes (``petal length (cm)`` -> ``petal_length_cm``);
3. a name that does not start with a letter gets ``f_`` in front (``1st`` -> ``f_1st``,
   ``0`` -> ``f_0``); a name with nothing left is ``f``;
4. a name already taken, by a column whose name is valid or by an earlier column, gets
   the first free suffix ``_2``, ``_3``, ... (``a b`` beside ``a_b`` -> ``a_b_2``).

The result depends only on the columns and their order, so every build of a spec
names its features the same way.
"""

from __future__ import annotations

import difflib
import re
import unicodedata
from collections.abc import Iterable

from research.models.specs import _NAME

PREFIX = "f_"
_OUTSIDE_NAME = re.compile(r"[^A-Za-z0-9_.\-]+")


def is_feature_name(name: str) -> bool:
    """Whether ``name`` can name a model input and a signature key as it is."""
    return bool(_NAME.match(name))


def feature_name(column: str) -> str:
    """Rules 1-3 of the module docstring: the feature name of one column, alone."""
    if is_feature_name(column):
        return column
    ascii_only = unicodedata.normalize("NFKD", column).encode("ascii", "ignore").decode()
    name = _OUTSIDE_NAME.sub("_", ascii_only).strip("_")
    if not name[:1].isalpha():
        name = (PREFIX + name).rstrip("_")
    return name


def feature_names(columns: Iterable[str]) -> dict[str, str]:
    """Column -> feature name for every column, unique (rule 4 of the module docstring)."""
    columns = list(dict.fromkeys(columns))
    taken = {column for column in columns if is_feature_name(column)}
    names: dict[str, str] = {}
    for column in columns:
        if column in taken:
            names[column] = column
            continue
        base = feature_name(column)
        name, suffix = base, 2
        while name in taken:
            name, suffix = f"{base}_{suffix}", suffix + 1
        taken.add(name)
        names[column] = name
    return names


def closest_name(name: str, candidates: Iterable[str]) -> str | None:
    """The candidate ``name`` was most likely meant to be, or None if none is close.

    A candidate whose feature name is ``name`` wins outright (``mean_radius`` for the
    column ``mean radius``); otherwise difflib's closest match, ignoring case.
    """
    candidates = list(candidates)
    for candidate in candidates:
        if feature_name(candidate) == name:
            return candidate
    folded = {candidate.casefold(): candidate for candidate in candidates}
    matches = difflib.get_close_matches(name.casefold(), list(folded), n=1, cutoff=0.6)
    return folded[matches[0]] if matches else None
