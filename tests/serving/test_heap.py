"""The gateway's heap: what is loaded is frozen out of full collections, and what an
unloaded version leaves in reference cycles is still reclaimed."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from serving import heap


class Node:
    """An object in a reference cycle: only the cyclic collector can free it."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    yield
    gc.unfreeze()


def test_a_loaded_model_is_frozen_out_of_later_collections() -> None:
    loaded = Node()
    heap.freeze_loaded()
    assert gc.get_freeze_count() > 0
    assert gc.is_tracked(loaded)
    # A full collection no longer scans it: only what came after the freeze.
    before = gc.get_freeze_count()
    gc.collect()
    assert gc.get_freeze_count() == before


def test_an_unloaded_models_cycles_are_reclaimed() -> None:
    model = Node()
    alive = weakref.ref(model)
    heap.freeze_loaded()
    del model
    gc.collect()
    assert alive() is not None  # frozen: a collection alone cannot free it
    heap.reclaim()
    assert alive() is None
    assert gc.get_freeze_count() > 0  # the survivors are frozen again
