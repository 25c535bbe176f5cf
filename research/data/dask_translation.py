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
runner-side primitives) and translates them itself. ParDos are fused into stages, as
Beam's other runners fuse them (see ``DaskGraph``): a stage runs one task per
partition, which is one bundle of each of its ParDos, each under its own metrics
container; every element passes through the whole stage before the next is read, and
the task returns only what leaves the stage, per tag, up to and including
``finish_bundle``, with its counters. Without fusion every ParDo's output was a list
held in worker memory, several copies of every record per partition. Every side input is one graph node, computed once and handed whole
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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
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


# --------------------------------------------------------------------------- stages


BundleId = tuple[str, int]  # (step, partition)
Counters = dict[BundleId, dict[CounterKey, int]]
Output = tuple[int, str | None]  # (member, tag)


@dataclass(frozen=True)
class _SideInputView:
    view_class: type
    options: dict[str, Any]


@dataclass(frozen=True)
class _MemberPlan:
    """One ParDo of a stage: what it runs, what it reads and who reads its outputs."""

    label: str
    fn: beam.DoFn
    args: Sequence[Any]
    kwargs: dict[str, Any]
    side_inputs: tuple[_SideInputView, ...]
    side_slots: tuple[int, ...]  # where each side input is in the stage's side values
    consumers: dict[str | None, tuple[int, ...]]  # tag -> members reading it


@dataclass(frozen=True)
class _StagePlan:
    """What a worker needs to run one stage over one partition of its root."""

    members: tuple[_MemberPlan, ...]
    reads_root: tuple[int, ...]  # members whose main input is the root
    outputs: tuple[Output, ...]  # outputs that other stages, shuffles or side inputs read


@dataclass(frozen=True)
class _StageResult:
    outputs: tuple[list[Any], ...]
    counters: Counters


class _Fanout(Receiver):
    """Hands each output on to the fused ParDos that read it, and keeps it when it
    leaves the stage."""

    def __init__(self, kept: list[Any] | None) -> None:
        self.kept = kept
        self.targets: list[Callable[[WindowedValue], None]] = []

    def receive(self, windowed_value: WindowedValue) -> None:
        if self.kept is not None:
            self.kept.append(windowed_value.value)
        for target in self.targets:
            target(windowed_value)


class _Receivers(dict):
    """Output tag -> receiver; a tag nobody reads goes nowhere."""

    def __missing__(self, tag: str | None) -> _Fanout:
        receiver = self[tag] = _Fanout(None)
        return receiver


# Bags hold plain values, all in the global window (WindowInto is refused).
_windowed = GlobalWindows.windowed_value


def _run_stage(
    elements: Iterable[Any], index: list[int], plan: _StagePlan, *side_values: list[Any]
) -> list[_StageResult]:
    """Run ``plan``'s ParDos over partition ``index`` of its root, as one bundle each.

    Every element goes through the whole chain before the next is read, each ParDo
    under its own metrics container, and only the outputs that leave the stage are
    kept. Returns a one-item list (bag partitions are sequences).
    """
    kept = {output: [] for output in plan.outputs}
    receivers = [_Receivers() for _ in plan.members]
    for (member, tag), values in kept.items():
        receivers[member][tag] = _Fanout(values)
    sampler = statesampler.StateSampler("stage", counters.CounterFactory())
    statesampler.set_current_tracker(sampler)
    try:
        containers = [MetricsContainer(member.label) for member in plan.members]
        states = [
            sampler.scoped_state(member.label, "process", metrics_container=container)
            for member, container in zip(plan.members, containers, strict=True)
        ]
        invokers = [
            _invoker(member, receivers[position], side_values)
            for position, member in enumerate(plan.members)
        ]
        calls = [
            _call_under(state, invoker) for state, invoker in zip(states, invokers, strict=True)
        ]
        for position, member in enumerate(plan.members):
            for tag, readers in member.consumers.items():
                receivers[position][tag].targets.extend(calls[reader] for reader in readers)
        for state, invoker in zip(states, invokers, strict=True):
            with state:
                invoker.invoke_setup()
                invoker.invoke_start_bundle()
        roots = [calls[reader] for reader in plan.reads_root]
        for element in elements:
            windowed = _windowed(element)
            for call in roots:
                call(windowed)
        # In stage order, so what a finishing ParDo emits reaches its readers unfinished.
        for state, invoker in zip(states, invokers, strict=True):
            with state:
                invoker.invoke_finish_bundle()
        for state, invoker in zip(states, invokers, strict=True):
            with state:
                invoker.invoke_teardown()
    finally:
        statesampler.set_current_tracker(None)
    bundles = {
        (member.label, index[0]): {
            (key.step, key.metric.namespace, key.metric.name): int(value)
            for key, value in container.get_cumulative().counters.items()
        }
        for member, container in zip(plan.members, containers, strict=True)
    }
    return [_StageResult(tuple(kept[output] for output in plan.outputs), bundles)]


def _invoker(member: _MemberPlan, receivers: _Receivers, side_values: Sequence[list[Any]]) -> Any:
    side_inputs = [
        SideInputMap(view.view_class, view.options, [_windowed(v) for v in side_values[slot]])
        for view, slot in zip(member.side_inputs, member.side_slots, strict=True)
    ]
    return DoFnInvoker.create_invoker(
        DoFnSignature(member.fn),
        _OutputHandler(
            window_fn=None,
            main_receivers=receivers[None],
            tagged_receivers=receivers,
            per_element_output_counter=None,
            output_batch_converter=None,
            process_yields_batches=False,
            process_batch_yields_elements=False,
        ),
        context=DoFnContext(member.label, state=None),
        side_inputs=side_inputs,
        input_args=list(member.args),
        input_kwargs=dict(member.kwargs),
        user_state_context=None,
        bundle_finalizer_param=beam.DoFn.BundleFinalizerParam(),
    )


def _call_under(state: Any, invoker: Any) -> Callable[[WindowedValue], None]:
    """``invoker.invoke_process`` with its ParDo's metrics container current."""

    def call(windowed_value: WindowedValue) -> None:
        with state:
            invoker.invoke_process(windowed_value)

    return call


def _stage_output(partition: list[_StageResult], position: int) -> list[Any]:
    return partition[0].outputs[position]


def _counters_of(partition: list[_StageResult]) -> list[Counters]:
    return [partition[0].counters]


def _concatenate(parts: Iterable[list[Any]]) -> list[Any]:
    return list(itertools.chain.from_iterable(parts))


# --------------------------------------------------------------------------- graph


@dataclass(eq=False)
class _Stage:
    """ParDos fused into one task per partition of ``root`` (see ``DaskGraph``)."""

    root: beam.PCollection
    members: list[AppliedPTransform] = field(default_factory=list)


class DaskGraph(PipelineVisitor):
    """Plans a pipeline's primitives as fused stages, then builds the equivalent bags.

    A ParDo joins the stage that produces its main input (or that reads the same
    collection), as Beam's other runners fuse them, unless a side input it reads is
    computed from that stage's own outputs: such a ParDo waits, in a stage of its own,
    for that side input. A stage runs as one task per partition, every element going
    through all its ParDos in turn, so a collection that only feeds other ParDos of the
    stage is never held in memory: only what leaves the stage (for a shuffle, a
    Flatten, a side input or a later stage) is kept. Each stage reports its ParDos'
    counters, named by step and partition, and computing every stage's counters
    (``counters()``) runs the whole pipeline.
    """

    def __init__(self, create_partitions: dict[str, int], partitions: int) -> None:
        self._create_partitions = create_partitions
        self._partitions = partitions
        self._nodes: list[AppliedPTransform] = []
        self._producer: dict[beam.PCollection, AppliedPTransform] = {}
        self._readers: dict[beam.PCollection, list[AppliedPTransform]] = defaultdict(list)
        self._stage_of: dict[AppliedPTransform, _Stage] = {}
        self._rooted: dict[beam.PCollection, list[_Stage]] = defaultdict(list)
        self._stages: list[_Stage] = []
        self._bags: dict[beam.PCollection, db.Bag] = {}
        self._results: dict[_Stage, db.Bag] = {}
        self._partition_indices: dict[int, db.Bag] = {}

    # -- planning (the visit) ----------------------------------------------------------

    def visit_transform(self, node: AppliedPTransform) -> None:
        kind = type(node.transform)
        if kind not in _PRIMITIVES:
            raise NotImplementedError(
                f"the Dask runner cannot run {node.full_label!r}: {kind.__module__}."
                f"{kind.__qualname__} is not a primitive it translates"
            )
        for pcoll in dict.fromkeys(_inputs(node)):
            self._readers[pcoll].append(node)
        for pcoll in node.outputs.values():
            self._producer[pcoll] = node
        if kind is beam.ParDo:
            _check_par_do(node)
            self._join_stage(node)
        self._nodes.append(node)

    def _join_stage(self, node: AppliedPTransform) -> None:
        main = _main_input(node)
        producer = self._producer.get(main)
        candidates = [self._stage_of[producer]] if producer in self._stage_of else []
        candidates += self._rooted[main]
        for stage in candidates:
            if not any(stage in self._stages_behind(side.pvalue) for side in node.side_inputs):
                break
        else:
            stage = _Stage(main)
            self._rooted[main].append(stage)
            self._stages.append(stage)
        stage.members.append(node)
        self._stage_of[node] = stage

    def _stages_behind(self, pcoll: beam.PCollection) -> set[_Stage]:
        """Every stage whose outputs ``pcoll`` is computed from."""
        behind: set[_Stage] = set()
        seen: set[beam.PCollection] = set()
        pending = [pcoll]
        while pending:
            current = pending.pop()
            if current in seen or current not in self._producer:
                continue
            seen.add(current)
            node = self._producer[current]
            stage = self._stage_of.get(node)
            if stage is None:
                pending.extend(_inputs(node))
            elif stage not in behind:
                behind.add(stage)
                pending.append(stage.root)
                pending.extend(
                    side.pvalue for member in stage.members for side in member.side_inputs
                )
        return behind

    # -- building ----------------------------------------------------------------------

    def counters(self) -> list[db.Bag]:
        """The bags of counters, one per stage: computing them runs the pipeline."""
        return [self._stage_results(stage).map_partitions(_counters_of) for stage in self._stages]

    def bag(self, pcoll: beam.PCollection) -> db.Bag:
        """The bag of a collection that leaves its stage (or is made by no ParDo)."""
        if pcoll not in self._bags:
            node = self._producer[pcoll]
            if node in self._stage_of:
                self._stage_results(self._stage_of[node])
            else:
                self._bags[pcoll] = self._primitive(node)
        return self._bags[pcoll]

    def _primitive(self, node: AppliedPTransform) -> db.Bag:
        kind = type(node.transform)
        inputs = [self.bag(pcoll) for pcoll in _inputs(node)]
        if kind is _Create:
            return self._create(list(node.transform.values))
        if kind is _GroupByKeyOnly:
            grouped = self._at_most(inputs[0]).groupby(_key, shuffle="tasks")
            return grouped.map(_key_and_values)
        if kind is _GatherAccumulators:
            return inputs[0].repartition(npartitions=1).map_partitions(_group_all)
        if kind is _Reshuffle:
            return self._at_least(inputs[0])
        # _Flatten
        return db.concat(inputs) if inputs else db.from_sequence([], npartitions=1)

    def _stage_results(self, stage: _Stage) -> db.Bag:
        if stage in self._results:
            return self._results[stage]
        root = self.bag(stage.root)
        sides = list(
            dict.fromkeys(side.pvalue for member in stage.members for side in member.side_inputs)
        )
        # One node per side input. (A bag ``reduction`` passed to ``map_partitions``
        # would be recomputed, upstream and all, for every task that reads it.)
        side_values = [
            dask.delayed(_concatenate)(self.bag(side).to_delayed(optimize_graph=False))
            for side in sides
        ]
        plan = self._plan(stage, sides)
        indices = self._indices(root.npartitions)
        results = root.map_partitions(_run_stage, indices, plan, *side_values)
        self._results[stage] = results
        for position, (member, tag) in enumerate(plan.outputs):
            pcoll = stage.members[member].outputs[tag]
            self._bags[pcoll] = results.map_partitions(_stage_output, position)
        return results

    def _plan(self, stage: _Stage, sides: list[beam.PCollection]) -> _StagePlan:
        position = {node: index for index, node in enumerate(stage.members)}
        members, outputs = [], []
        for index, node in enumerate(stage.members):
            consumers: dict[str | None, tuple[int, ...]] = {}
            for tag, pcoll in node.outputs.items():
                fused = tuple(
                    position[reader]
                    for reader in self._readers[pcoll]
                    if reader in position and _main_input(reader) is pcoll
                )
                consumers[tag] = fused
                if len(fused) < len(self._readers[pcoll]):
                    outputs.append((index, tag))
            transform = node.transform
            args, kwargs = transform.raw_side_inputs
            views = tuple(
                _SideInputView(type(side), side._view_options()) for side in node.side_inputs
            )
            slots = tuple(sides.index(side.pvalue) for side in node.side_inputs)
            members.append(
                _MemberPlan(
                    node.full_label, transform.fn, list(args), dict(kwargs), views, slots, consumers
                )
            )
        reads_root = tuple(
            index for index, node in enumerate(stage.members) if _main_input(node) is stage.root
        )
        return _StagePlan(tuple(members), reads_root, tuple(outputs))

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


_PRIMITIVES = (_Create, beam.ParDo, _GroupByKeyOnly, _GatherAccumulators, _Reshuffle, _Flatten)


def _inputs(node: AppliedPTransform) -> list[beam.PCollection]:
    """Every collection ``node`` reads, main and side inputs alike."""
    main = [pcoll for pcoll in node.inputs if isinstance(pcoll, beam.PCollection)]
    return [*main, *(side.pvalue for side in node.side_inputs)]


def _main_input(node: AppliedPTransform) -> beam.PCollection:
    return next(iter(node.main_inputs.values()))


def _check_par_do(node: AppliedPTransform) -> None:
    signature = DoFnSignature(node.transform.fn)
    if signature.is_stateful_dofn() or signature.is_splittable_dofn():
        raise NotImplementedError(
            f"the Dask runner cannot run {node.full_label!r}: stateful and splittable "
            "DoFns need per-key state and splitting that dask.bag does not offer"
        )


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
