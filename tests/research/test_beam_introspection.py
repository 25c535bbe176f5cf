"""Beam's parameter and state lookups, remembered: the same answers, asked once, freed."""

from __future__ import annotations

import functools
import gc
import weakref

import apache_beam as beam
import pytest
from apache_beam.coders import VarIntCoder
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import core
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec

from research.data import beam_introspection
from research.data.runners import IN_PROCESS_RUNNER


def plain(element, side=beam.DoFn.TimestampParam, *rest, key=None):  # noqa: ANN001, ANN201
    return element


class Counting(beam.DoFn):
    """A stateful DoFn: Beam must still find its state spec through the cache."""

    SEEN = ReadModifyWriteStateSpec("seen", VarIntCoder())

    def process(self, element, seen=beam.DoFn.StateParam(SEEN)):  # noqa: ANN001, ANN201, B008
        count = (seen.read() or 0) + 1
        seen.write(count)
        yield element[0], count


class Callable_:
    def __call__(self, element, extra=3):  # noqa: ANN001, ANN204
        return element


@pytest.mark.parametrize(
    "function",
    [
        plain,
        lambda element, other=2: element,
        Counting().process,
        Callable_(),
        functools.partial(plain, side=None),
        str.strip,
    ],
    ids=["function", "lambda", "bound method", "callable object", "partial", "builtin"],
)
def test_answers_are_beams_own(function: object) -> None:
    assert beam_introspection.function_args_defaults(function) == beam_introspection._inspect(
        function
    )


def asked_of(monkeypatch: pytest.MonkeyPatch, lookup: str) -> list[object]:
    """Everything Beam's own ``lookup`` (as beam_introspection holds it) is asked about."""
    asked: list[object] = []
    original = getattr(beam_introspection, lookup)

    def counted(subject: object) -> object:
        asked.append(subject)
        return original(subject)

    monkeypatch.setattr(beam_introspection, lookup, counted)
    return asked


def test_a_function_is_inspected_once_and_each_caller_gets_its_own_lists(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inspected = asked_of(monkeypatch, "_inspect")

    def fresh(element, scale=2):  # noqa: ANN001, ANN202
        return element * scale

    first = beam_introspection.function_args_defaults(fresh)
    first[0].append("edited")
    second = beam_introspection.function_args_defaults(fresh)

    class Local(beam.DoFn):
        def process(self, element, window=beam.DoFn.WindowParam):  # noqa: ANN001, ANN202
            yield element

    # Bound methods of two instances are one function underneath: one inspection.
    answers = [beam_introspection.function_args_defaults(Local().process) for _ in range(2)]

    assert second == (["element", "scale"], [2])
    assert answers[0] == answers[1] == (["element", "window"], [beam.DoFn.WindowParam])
    assert [type(f).__name__ for f in inspected] == ["function", "method"]


def test_the_cache_does_not_keep_a_pipelines_functions_alive() -> None:
    def transient(element):  # noqa: ANN001, ANN202
        return element

    beam_introspection.function_args_defaults(transient)
    alive = weakref.ref(transient)
    del transient
    gc.collect()

    assert alive() is None


def test_a_stateful_dofn_keeps_its_state_through_the_cache() -> None:
    beam_introspection.install()
    assert core.get_function_args_defaults is beam_introspection.function_args_defaults
    assert beam.transforms.userstate.get_dofn_specs is beam_introspection.dofn_specs

    with TestPipeline(runner=IN_PROCESS_RUNNER) as pipeline:
        counts = (
            pipeline
            | beam.Create([("a", 1), ("a", 2), ("b", 3)])
            | beam.ParDo(Counting())
            | beam.CombinePerKey(max)
        )
        assert_that(counts, equal_to([("a", 2), ("b", 1)]))


class Holder:
    """An object whose stateful method a Map wraps: the DoFn holds it bound."""

    def count(self, element, seen=beam.DoFn.StateParam(Counting.SEEN)):  # noqa: ANN001, ANN201, B008
        return element


@pytest.mark.parametrize(
    "dofn",
    [
        Counting(),
        core.CallableWrapperDoFn(lambda element: element),
        core.CallableWrapperDoFn(Holder().count),
    ],
    ids=["stateful class", "wrapped lambda", "wrapped stateful bound method"],
)
def test_dofn_specs_are_beams_own(dofn: beam.DoFn) -> None:
    assert beam_introspection.dofn_specs(dofn) == beam_introspection._dofn_specs(dofn)


def test_dofn_specs_are_asked_once_per_class_unless_a_bound_method_is_held(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked = asked_of(monkeypatch, "_dofn_specs")

    class Fresh(beam.DoFn):
        def process(self, element, seen=beam.DoFn.StateParam(Counting.SEEN)):  # noqa: ANN001, ANN202, B008
            yield element

    first = beam_introspection.dofn_specs(Fresh())
    first[0].clear()
    second = beam_introspection.dofn_specs(Fresh())
    holders = [core.CallableWrapperDoFn(Holder().count) for _ in range(2)]
    for holder in holders:
        beam_introspection.dofn_specs(holder)

    assert second == ({Counting.SEEN}, set())
    assert len(asked) == 3  # Fresh once; each bound-method holder on its own
