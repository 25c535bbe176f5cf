"""Test files of the process tier first, so that their long child runs overlap the fast tier.

pytest-xdist (``--dist loadfile``) hands whole files to workers in collection order. A file
that trains on meshes or replica groups waits minutes on its children; collected last, as
``tests/training`` is, it runs alone at the end of ``make test-all`` while the other workers
have finished. Moved to the front, it runs while the fast files fill the CPU around it.
Files keep their relative order, and each file's tests theirs.
"""

from __future__ import annotations

import pytest

from tests.support.tiers import PROCESS_MARKER


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    in_process_tier = {
        item.path for item in items if item.get_closest_marker(PROCESS_MARKER) is not None
    }
    items.sort(key=lambda item: item.path not in in_process_tier)
