"""A Beam pipeline as one Dask graph, for ``research.data.dask_runner.DaskRunner``.

Beam's Dask runner (2.77) turns ``Create``, ``ParDo``, ``GroupByKey`` and ``Flatten``
into ``dask.bag`` operations, but a dataset build does not survive its ``ParDo``:

- **finish_bundle outputs** are dropped (results are collected before
  ``finish_bundle`` runs): the last batch of every ``BatchElements`` bundle is lost.
- **Tagged outputs** reach every consumer (a ``ParDo`` is one bag), so quarantined
  and dropped inputs would flow on as records.
- **Side inputs** are recomputed, upstream graph and all, inside every task that
  reads them.
- **Metrics** are not collected (``metrics()`` raises), so there is no data report.
- **Only the last transform visited runs** (the runner computes the last bag it
  built), so most side files would never be written.

This module keeps Beam's overrides (``Create``, ``Reshuffle``, ``Flatten`` as
runner-side primitives) and translates them itself. Each partition is one bundle: the
DoFn runs under a metrics container, and the bundle returns what every tag received
up to and including ``finish_bundle``, with its counters; each output collection
reads its own tag. Every side input is one graph node, computed once and handed whole
to the tasks that read it. Computing the counters runs every ParDo (writers
included), and counts come from the task attempts that succeeded, once each (see
``DaskGraph``). ``GroupByKey`` is a bag ``groupby`` over the task-based shuffle, which
works across machines (the disk-based one does not).

Partitions stay within ``partitions`` (``--dask_npartitions``; by default a few per
worker thread): a ``GroupByKey`` first merges neighbouring partitions down to that
many, and a ``Reshuffle`` splits a narrower bag up to it. Otherwise every ``Flatten``
would add its inputs' partitions and every shuffle keep them, so a build with a few
joins ran on thousands of partitions and a task graph of 10⁵ tasks that filled the
scheduler's memory.

``CombinePerKey`` is lifted (partial combining in each bundle, then one merge of the
accumulators, gathered in one task), as on Beam's other runners; otherwise a per-split
statistic would send a whole split through one worker. ``Create`` gives each value its
own partition (up to ``MAX_CREATE_PARTITIONS``), so a list of input files spreads over
the workers.

Refused with an error naming the transform: ``WindowInto`` (so every collection stays
in the global window, the only one this ``GroupByKey`` honours), stateful and
splittable DoFns, and any other primitive, ``beam.io.Read`` sources among them
(the build reads its files in ParDos).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
import dask
import dask.bag as db
from apache_beam.metrics.execution import MetricsContainer
from apache_beam.pipeline import AppliedPTransform, PipelineVisitor, PTransformOverride
from apache_beam.runners.common import (
    DoFnContext,
    DoFnInvoker,
    DoFnSignature,
    Receiver,
    _OutputHandler,
)
from apache_beam.runners.dask.overrides import (
    _Create,
    _Flatten,
    _GroupByKeyOnly,
    _Reshuffle,
    dask_overrides,
)
from apache_beam.runners.worker import statesampler
from apache_beam.transforms.combiners import (
    LiftedCombinePerKey,
    _FinishCombine,
    _PartialGroupByKeyCombiningValues,
)
from apache_beam.transforms.sideinputs import SideInputMap
from apache_beam.transforms.window import GlobalWindows
from apache_beam.utils import counters
from apache_beam.utils.windowed_value import WindowedValue

MAX_CREATE_PARTITIONS = 1024

CounterKey = tuple[str, str, str]  # (step, namespace, name)


class _GatherAccumulators(beam.PTransform):
    """``(key, accumulator)`` pairs -> ``(key, [accumulators…])``, all in one partition.

    A lifted combiner's shuffle carries one accumulator per key per bundle, too little
    to spread: gathering it in one task costs one task, where a task-based shuffle over
    n partitions costs n².
    """

    def expand(self, pcoll: beam.PCollection) -> beam.PCollection:
        return beam.pvalue.PCollection.from_(pcoll)


class _LiftedCombinePerKey(LiftedCombinePerKey):
    """Beam's lifted combine (partial combine per bundle, then a final merge) with its
    accumulators gathered rather than shuffled."""

    def expand(self, pcoll: beam.PCollection) -> beam.PCollection:
        return (
            pcoll
            | "Partial"
            >> beam.ParDo(_PartialGroupByKeyCombiningValues(self._combine_fn), **self._side_inputs)
            | "Gather" >> _GatherAccumulators()
            | "Finish" >> beam.ParDo(_FinishCombine(self._combine_fn), **self._side_inputs)
        )


class _LiftCombinePerKey(PTransformOverride):
    """``CombinePerKey`` -> partial combine per bundle, gather, final merge."""

    def matches(self, applied_ptransform: AppliedPTransform) -> bool:
        return isinstance(applied_ptransform.transform, beam.CombinePerKey)

    def get_replacement_transform_for_applied_ptransform(
        self, applied_ptransform: AppliedPTransform
    ) -> beam.PTransform:
        transform = applied_ptransform.transform
        return _LiftedCombinePerKey(transform.fn, transform.args, transform.kwargs)


class _GroupByKeyInGlobalWindow(PTransformOverride):
    """``GroupByKey`` -> the bare grouping: with WindowInto refused, every value is in
    the global window, so Beam's window bookkeeping around it (a ParDo before, one
    after) would only cost two passes over every value."""

    def matches(self, applied_ptransform: AppliedPTransform) -> bool:
        return type(applied_ptransform.transform) is beam.GroupByKey

    def get_replacement_transform_for_applied_ptransform(
        self, applied_ptransform: AppliedPTransform
    ) -> beam.PTransform:
        return _GroupByKeyOnly()


def overrides() -> list[PTransformOverride]:
    """Combiner lifting and grouping, then Beam's Dask overrides for the other primitives."""
    return [_LiftCombinePerKey(), _GroupByKeyInGlobalWindow(), *dask_overrides()]


# --------------------------------------------------------------------------- ParDo


BundleId = tuple[str, int]  # (step, partition)
Counters = dict[BundleId, dict[CounterKey, int]]


class _Partition(list):
    """One tag's elements from one bundle, carrying the counters of that bundle and of
    the ParDo bundles upstream of it whose counters were not collected separately."""

    def __init__(self, elements: Iterable[Any] = (), counters: Counters | None = None) -> None:
        super().__init__(elements)
        self.counters: Counters = counters or {}


class _ListReceiver(Receiver):
    def __init__(self) -> None:
        self.values = _Partition()

    def receive(self, windowed_value: WindowedValue) -> None:
        self.values.append(windowed_value.value)


class _Receivers(dict):
    """Output tag -> receiver, made on first use (a DoFn may emit any declared tag)."""

    def __missing__(self, tag: str | None) -> _ListReceiver:
        receiver = self[tag] = _ListReceiver()
        return receiver


@dataclass(frozen=True)
class _SideInputView:
    view_class: type
    options: dict[str, Any]


@dataclass(frozen=True)
class _ParDoPlan:
    """What a worker needs to run one ParDo over one bundle."""

    label: str
    fn: beam.DoFn
    args: Sequence[Any]
    kwargs: dict[str, Any]
    side_inputs: tuple[_SideInputView, ...]


@dataclass(frozen=True)
class _BundleResult:
    outputs: dict[str | None, _Partition]
    counters: Counters


# Bags hold plain values, all in the global window (WindowInto is refused).
_windowed = GlobalWindows.windowed_value


def _run_bundle(
    elements: Iterable[Any], index: list[int], plan: _ParDoPlan, *side_values: list[Any]
) -> list[_BundleResult]:
    """Run ``plan``'s DoFn over partition ``index`` (one bundle).

    Returns a one-item list holding a ``_BundleResult`` (bag partitions are sequences).
    """
    return [_run_dofn(elements, index[0], plan, side_values)]


def _run_siblings(
    elements: Iterable[Any], index: list[int], plans: tuple[_ParDoPlan, ...]
) -> list[tuple[_BundleResult, ...]]:
    """Run several ParDos that read the same partition, one after the other, in one task."""
    elements = elements if isinstance(elements, list) else list(elements)
    return [tuple(_run_dofn(elements, index[0], plan, ()) for plan in plans)]


def _run_dofn(
    elements: Iterable[Any], index: int, plan: _ParDoPlan, side_values: Sequence[list[Any]]
) -> _BundleResult:
    """One bundle of ``plan``'s DoFn, under a metrics container."""
    receivers = _Receivers()
    container = MetricsContainer(plan.label)
    sampler = statesampler.StateSampler(plan.label, counters.CounterFactory())
    side_inputs = [
        SideInputMap(view.view_class, view.options, [_windowed(value) for value in values])
        for view, values in zip(plan.side_inputs, side_values, strict=True)
    ]
    statesampler.set_current_tracker(sampler)
    try:
        with sampler.scoped_state(plan.label, "process", metrics_container=container):
            invoker = DoFnInvoker.create_invoker(
                DoFnSignature(plan.fn),
                _OutputHandler(
                    window_fn=None,
                    main_receivers=receivers[None],
                    tagged_receivers=receivers,
                    per_element_output_counter=None,
                    output_batch_converter=None,
                    process_yields_batches=False,
                    process_batch_yields_elements=False,
                ),
                context=DoFnContext(plan.label, state=None),
                side_inputs=side_inputs,
                input_args=list(plan.args),
                input_kwargs=dict(plan.kwargs),
                user_state_context=None,
                bundle_finalizer_param=beam.DoFn.BundleFinalizerParam(),
            )
            invoker.invoke_setup()
            invoker.invoke_start_bundle()
            for element in elements:
                invoker.invoke_process(_windowed(element))
            invoker.invoke_finish_bundle()
            invoker.invoke_teardown()
    finally:
        statesampler.set_current_tracker(None)
    upstream: Counters = getattr(elements, "counters", {})
    own = {
        (key.step, key.metric.namespace, key.metric.name): int(value)
        for key, value in container.get_cumulative().counters.items()
    }
    carried = {**upstream, (plan.label, index): own}
    outputs = {tag: receiver.values for tag, receiver in receivers.items()}
    for values in outputs.values():
        values.counters = carried
    return _BundleResult(outputs, carried)


def _outputs_of(partition: list[_BundleResult], tag: str | None) -> _Partition:
    result = partition[0]
    return result.outputs.get(tag) or _Partition(counters=result.counters)


def _sibling_result(partition: list[tuple[_BundleResult, ...]], position: int) -> Any:
    return [partition[0][position]]


def _counters_of(partition: list[_BundleResult]) -> list[Counters]:
    return [partition[0].counters]


def _concatenate(parts: Iterable[list[Any]]) -> list[Any]:
    return list(itertools.chain.from_iterable(parts))


# --------------------------------------------------------------------------- graph


class DaskGraph(PipelineVisitor):
    """Visits a pipeline's primitives and builds the equivalent bags.

    A ParDo's counters travel with its outputs into the ParDos that read them as main
    input, so a chain of ParDos stays a chain of tasks that Dask fuses into one per
    partition. Wherever else a ParDo's output goes (a shuffle, a Flatten, a side
    input, nowhere), its counters are collected from the ParDo itself: after the
    visit, ``counters()`` lists those bags, and computing them runs the whole pipeline.
    Bundles are named by step and partition, so counters that reach the end by two
    paths are counted once.
    """

    def __init__(
        self,
        create_partitions: dict[str, int],
        siblings: dict[beam.PCollection, list[AppliedPTransform]],
        partitions: int,
    ) -> None:
        self._partitions = partitions
        self._bags: dict[beam.PCollection, db.Bag] = {}
        self._siblings = siblings
        self._sibling_runs: dict[beam.PCollection, db.Bag] = {}
        self._create_partitions = create_partitions
        self._results: dict[AppliedPTransform, db.Bag] = {}
        self._read_by_par_do: dict[beam.PCollection, int] = defaultdict(int)
        self._read: dict[beam.PCollection, int] = defaultdict(int)
        self._partition_indices: dict[int, db.Bag] = {}

    def visit_transform(self, node: AppliedPTransform) -> None:
        transform = node.transform
        kind = type(transform)
        inputs = [self._bags[pcoll] for pcoll in node.inputs if isinstance(pcoll, beam.PCollection)]
        for pcoll in (*node.main_inputs.values(), *(side.pvalue for side in node.side_inputs)):
            self._read[pcoll] += 1
        if kind is _Create:
            outputs = {None: self._create(list(transform.values))}
        elif kind is beam.ParDo:
            self._read_by_par_do[next(iter(node.main_inputs.values()))] += 1
            outputs = self._par_do(node, inputs[0])
        elif kind is _GroupByKeyOnly:
            grouped = self._at_most(inputs[0]).groupby(_key, shuffle="tasks")
            outputs = {None: grouped.map(_key_and_values)}
        elif kind is _GatherAccumulators:
            outputs = {None: inputs[0].repartition(npartitions=1).map_partitions(_group_all)}
        elif kind is _Reshuffle:
            outputs = {None: self._at_least(inputs[0])}
        elif kind is _Flatten:
            outputs = {None: db.concat(inputs) if inputs else db.from_sequence([], npartitions=1)}
        else:
            raise NotImplementedError(
                f"the Dask runner cannot run {node.full_label!r}: {kind.__module__}."
                f"{kind.__qualname__} is not a primitive it translates"
            )
        for tag, pcoll in node.outputs.items():
            self._bags[pcoll] = outputs[tag]

    def counters(self) -> list[db.Bag]:
        """The bags of counters to compute: those of every ParDo whose outputs do not all
        go on, as main input, to ParDos (which carry them further)."""
        return [
            results.map_partitions(_counters_of)
            for node, results in self._results.items()
            if self._collected_here(node)
        ]

    def _collected_here(self, node: AppliedPTransform) -> bool:
        outputs = node.outputs.values()
        carried = any(self._read_by_par_do[pcoll] for pcoll in outputs)
        elsewhere = any(self._read[pcoll] > self._read_by_par_do[pcoll] for pcoll in outputs)
        return elsewhere or not carried

    def _at_most(self, bag: db.Bag) -> db.Bag:
        """``bag`` with neighbouring partitions merged down to ``partitions``."""
        if bag.npartitions <= self._partitions:
            return bag
        return bag.repartition(npartitions=self._partitions)

    def _at_least(self, bag: db.Bag) -> db.Bag:
        """``bag`` with its partitions split up to ``partitions`` (a redistribution:
        the few elements that list a build's work, files or their parts, spread out)."""
        if bag.npartitions >= self._partitions:
            return bag
        return bag.repartition(npartitions=self._partitions)

    def _create(self, values: list[Any]) -> db.Bag:
        if self._create_partitions:
            return db.from_sequence(values, **self._create_partitions)
        partitions = max(1, min(len(values), MAX_CREATE_PARTITIONS))
        return db.from_sequence(values, npartitions=partitions)

    def _indices(self, partitions: int) -> db.Bag:
        """0..partitions-1, one to a partition, to name the bundles of a bag that size."""
        if partitions not in self._partition_indices:
            indices = db.from_sequence(range(partitions), npartitions=partitions)
            self._partition_indices[partitions] = indices
        return self._partition_indices[partitions]

    def _par_do(self, node: AppliedPTransform, main: db.Bag) -> dict[str | None, db.Bag]:
        source = next(iter(node.main_inputs.values()))
        siblings = self._siblings.get(source, [])
        indices = self._indices(main.npartitions)
        if node in siblings:
            if source not in self._sibling_runs:
                plans = tuple(self._plan(sibling) for sibling in siblings)
                self._sibling_runs[source] = main.map_partitions(_run_siblings, indices, plans)
            runs = self._sibling_runs[source]
            results = runs.map_partitions(_sibling_result, siblings.index(node))
        else:
            # One node per side input. (A bag ``reduction`` passed to ``map_partitions``
            # would be recomputed, upstream and all, for every task that reads it.)
            side_values = [
                dask.delayed(_concatenate)(self._bags[side.pvalue].to_delayed(optimize_graph=False))
                for side in node.side_inputs
            ]
            results = main.map_partitions(_run_bundle, indices, self._plan(node), *side_values)
        self._results[node] = results
        return {tag: results.map_partitions(_outputs_of, tag) for tag in node.outputs}

    @staticmethod
    def _plan(node: AppliedPTransform) -> _ParDoPlan:
        transform = node.transform
        signature = DoFnSignature(transform.fn)
        if signature.is_stateful_dofn() or signature.is_splittable_dofn():
            raise NotImplementedError(
                f"the Dask runner cannot run {node.full_label!r}: stateful and splittable "
                "DoFns need per-key state and splitting that dask.bag does not offer"
            )
        args, kwargs = transform.raw_side_inputs
        views = tuple(_SideInputView(type(side), side._view_options()) for side in node.side_inputs)
        return _ParDoPlan(node.full_label, transform.fn, list(args), dict(kwargs), views)


class _SiblingFinder(PipelineVisitor):
    def __init__(self) -> None:
        self.readers: dict[beam.PCollection, list[AppliedPTransform]] = defaultdict(list)

    def visit_transform(self, node: AppliedPTransform) -> None:
        if type(node.transform) is beam.ParDo and not node.side_inputs:
            self.readers[next(iter(node.main_inputs.values()))].append(node)


def sibling_par_dos(pipeline: beam.Pipeline) -> dict[beam.PCollection, list[AppliedPTransform]]:
    """Collection -> the ParDos without side inputs that read it, where there are several.

    ``DaskGraph`` runs such siblings in one task per partition, as Beam's other runners
    fuse them: the partition is then read once and released at once, where separate
    tasks would keep it in memory until the last of them ran, and the scheduler often
    runs every partition's producer first.
    """
    finder = _SiblingFinder()
    pipeline.visit(finder)
    return {pcoll: nodes for pcoll, nodes in finder.readers.items() if len(nodes) > 1}


def _key(element: tuple[Any, Any]) -> Any:
    return element[0]


def _key_and_values(group: tuple[Any, list[tuple[Any, Any]]]) -> tuple[Any, list[Any]]:
    key, pairs = group
    return key, [value for _, value in pairs]


def _group_all(pairs: Iterable[tuple[Any, Any]]) -> list[tuple[Any, list[Any]]]:
    groups: dict[Any, list[Any]] = defaultdict(list)
    for key, value in pairs:
        groups[key].append(value)
    return list(groups.items())


def sum_counters(collected: Iterable[list[Counters]]) -> dict[CounterKey, int]:
    """Totals over every bundle, each counted once however many paths brought it."""
    bundles: Counters = {}
    for counters_of_bundles in itertools.chain.from_iterable(collected):
        bundles.update(counters_of_bundles)
    totals: dict[CounterKey, int] = defaultdict(int)
    for own in bundles.values():
        for key, value in own.items():
            totals[key] += value
    return dict(totals)
