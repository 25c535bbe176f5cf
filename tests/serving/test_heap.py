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


@pytest.fixture
def managed(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process's heap in the gateway's charge, as in ``slipway serve``."""
    monkeypatch.setattr(heap, "_managed", False)
    heap.manage()
    yield
    gc.unfreeze()


def test_an_embedded_gateway_leaves_its_hosts_collector_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(heap, "_managed", False)
    frozen = gc.get_freeze_count()
    dropped = Node()
    alive = weakref.ref(dropped)
    heap.freeze_loaded()
    heap.reclaim()
    assert gc.get_freeze_count() == frozen
    del dropped
    gc.collect()
    assert alive() is None


@pytest.mark.usefixtures("managed")
def test_a_loaded_model_is_frozen_out_of_later_collections() -> None:
    loaded = Node()
    assert any(thing is loaded for thing in gc.get_objects())
    heap.freeze_loaded()
    # Collections go over generations 0 to 2 only: the model is in none of them, and
    # what they still scan is a small part of what was frozen.
    assert not any(thing is loaded for thing in gc.get_objects())
    assert len(gc.get_objects()) < gc.get_freeze_count() / 10


@pytest.mark.usefixtures("managed")
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
