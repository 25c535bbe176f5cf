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
    assert any(thing is loaded for thing in gc.get_objects())
    heap.freeze_loaded()
    # Collections go over generations 0 to 2 only: the model is in none of them, and
    # what they still scan is a small part of what was frozen.
    assert not any(thing is loaded for thing in gc.get_objects())
    assert len(gc.get_objects()) < gc.get_freeze_count() / 10


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
