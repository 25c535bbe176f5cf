"""Dynamic batching: many small requests become one model call, with TF Serving's semantics.

Requests arrive on one asyncio event loop; the model runs in a pool of ``num_batch_threads``
worker threads. A batch is cut when it holds ``max_batch_size`` rows or
``batch_timeout_micros`` after its first request arrived, whichever comes first. At most
``max_enqueued_batches`` batches (open and closed) wait for a thread; a request that would
need more fails at once with ``Unavailable`` so that clients retry elsewhere instead of
queueing without bound. A request larger than ``max_batch_size`` is split: its first rows
top up the open batch, the rest go to new batches, and its outputs are reassembled in order.

Every request gets exactly the outputs it would get alone, provided the model treats rows
independently:

* ``allowed_batch_sizes`` pads a batch up to the next allowed size by repeating its last row
  (a real row, so models that normalise or divide never see artificial zeros); the padding
  rows' outputs are dropped.
* Variable-length inputs (a non-batch dimension that differs between requests, e.g. sequence
  length) are padded with zeros (empty strings for string tensors) to the longest in the
  batch when ``pad_variable_length`` is set; otherwise requests of different shapes go to
  different batches. Un-padding rule for outputs: output axis ``k >= 1`` is cut back to a
  request's own length when some input's axis ``k`` varied in the batch and was padded to
  exactly the size the output has on axis ``k`` (all such inputs must agree on the
  request's length). Sequence outputs ``[batch, time, ...]`` computed from inputs
  ``[batch, time, ...]`` therefore come back at each request's own length; an output axis
  whose size merely happens to equal a padded input length is cut too, so models whose
  outputs depend on padding should not enable ``pad_variable_length``.

Deadlines are absolute ``time.monotonic()`` values, and they shape the queue:

* A batch is cut before its window closes when a member's deadline needs it to run sooner:
  by its latest start, the deadline less the batch's measured execution time (a moving
  average per power-of-two batch size) and a tenth of the request's whole budget as a
  margin. A request never waits for a window its deadline cannot afford.
* A request joins the open batch only if the batch, grown by its rows, can still start in
  time for its most urgent member; otherwise that batch is cut and the request opens the
  next. Batches are as large as the deadlines in them allow.
* Batches waiting for a thread run most urgent first (earliest latest start; batches
  without deadlines after, in arrival order).

A request whose deadline passes while it waits is removed from its batch and fails with
``DeadlineExceeded``; one whose caller gives up (``asyncio.CancelledError``) is removed too,
so the model never runs rows nobody waits for. A batch whose execution raises fails only its
own requests; the batcher keeps working.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from serving.errors import DeadlineExceeded, Internal, InvalidArgument, ServingError, Unavailable
from serving.signature import Tensors

logger = logging.getLogger(__name__)

RunFn = Callable[[Tensors], Tensors]
# What a batch thread hands back: each request's outputs, the padded batch size and the
# execution seconds; or, if the batch failed, the exception.
BatchOutcome = tuple[list[Tensors], int, float] | BaseException

# The share of a request's time budget (deadline less arrival) kept as a margin when its
# deadline decides when its batch must start.
DEADLINE_MARGIN = 0.1
# Weight of the newest execution in the moving average of a batch size's cost.
COST_SMOOTHING = 0.2


class BatchingConfig(BaseModel):
    """TF Serving's batching parameters (``batching_parameters.txt``), plus an off switch."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_batch_size: int = Field(default=32, ge=1)
    batch_timeout_micros: int = Field(default=2000, ge=0)
    max_enqueued_batches: int = Field(default=64, ge=1)
    num_batch_threads: int = Field(default=2, ge=1)
    allowed_batch_sizes: list[int] | None = None
    pad_variable_length: bool = True
    enabled: bool = True

    @model_validator(mode="after")
    def _allowed_sizes(self) -> BatchingConfig:
        sizes = self.allowed_batch_sizes
        if not sizes:
            return self
        if sizes[0] < 1 or any(b <= a for a, b in zip(sizes, sizes[1:], strict=False)):
            raise ValueError("allowed_batch_sizes must be positive and strictly increasing")
        if sizes[-1] != self.max_batch_size:
            raise ValueError(
                f"the last allowed batch size ({sizes[-1]}) must equal max_batch_size "
                f"({self.max_batch_size}) so that every batch can be padded to an allowed size"
            )
        return self


def shadow_batching(config: BatchingConfig) -> BatchingConfig:
    """The batching of mirrored (shadow) copies of a version's requests: the same batches,
    one thread, and a quarter of the queue bound, so that shadow traffic takes at most one
    batch thread's worth of the machine and is shed before it could fill a queue."""
    return config.model_copy(
        update={
            "num_batch_threads": 1,
            "max_enqueued_batches": max(1, config.max_enqueued_batches // 4),
        }
    )


class BatchObserver(Protocol):
    """Receives the batcher's measurements (e.g. ``serving.metrics.BatchMetricsObserver``)."""

    def on_batch(
        self,
        size: int,
        padded_size: int,
        queue_wait_seconds: list[float],
        execution_seconds: float,
    ) -> None: ...

    def on_queue_depth(self, depth: int) -> None: ...


# --------------------------------------------------------------------------- merging


@dataclass(frozen=True)
class _Layout:
    """How a merged batch maps back to its requests."""

    bounds: list[tuple[int, int]]  # each request's rows in the batch
    padded_rows: int
    own_shapes: list[dict[str, tuple[int, ...]]]  # each request's non-batch dims, per input
    padded_shapes: dict[str, tuple[int, ...]]
    varied_axes: dict[str, frozenset[int]]  # per input, the axes (>= 1) padded in this batch

    @property
    def passthrough(self) -> bool:
        """One request and no padding: the model's outputs are the request's outputs."""
        return len(self.bounds) == 1 and self.padded_rows == self.bounds[0][1]


def _padding_value(dtype: np.dtype) -> object:
    return b"" if dtype == np.dtype(object) else np.zeros((), dtype)[()]


def _pad_to(array: np.ndarray, inner: tuple[int, ...]) -> np.ndarray:
    """Grow the non-batch dims of ``array`` to ``inner``, filling with zeros."""
    if array.shape[1:] == inner:
        return array
    padded = np.full((array.shape[0], *inner), _padding_value(array.dtype), dtype=array.dtype)
    padded[(slice(None), *(slice(0, size) for size in array.shape[1:]))] = array
    return padded


def merge_inputs(
    requests: Sequence[Tensors], allowed_sizes: Sequence[int]
) -> tuple[Tensors, _Layout]:
    """Concatenate requests along the batch axis, padding lengths and the batch size."""
    # A request with scalar inputs has no rows; it never shares a batch, so it passes through.
    rows = [_request_rows(request) or 0 for request in requests]
    total = sum(rows)
    padded_rows = next((size for size in allowed_sizes if size >= total), total)
    starts = np.cumsum([0, *rows]).tolist()
    bounds = list(zip(starts[:-1], starts[1:], strict=True))
    merged: Tensors = {}
    padded_shapes: dict[str, tuple[int, ...]] = {}
    varied: dict[str, frozenset[int]] = {}
    for name in requests[0]:
        arrays = [request[name] for request in requests]
        shapes = [array.shape[1:] for array in arrays]
        inner = tuple(max(sizes) for sizes in zip(*shapes, strict=True))
        padded_shapes[name] = inner
        varied[name] = frozenset(
            axis + 1 for axis, sizes in enumerate(zip(*shapes, strict=True)) if len(set(sizes)) > 1
        )
        arrays = [_pad_to(array, inner) for array in arrays]
        batch = arrays[0] if len(arrays) == 1 else np.concatenate(arrays, axis=0)
        if padded_rows > total:
            filler = np.repeat(batch[-1:], padded_rows - total, axis=0)
            batch = np.concatenate([batch, filler], axis=0)
        merged[name] = batch
    own_shapes = [
        {name: array.shape[1:] for name, array in request.items()} for request in requests
    ]
    return merged, _Layout(bounds, padded_rows, own_shapes, padded_shapes, varied)


def _own_length(layout: _Layout, index: int, axis: int, size: int) -> int | None:
    """The request's length on an output axis, if the un-padding rule applies to it."""
    lengths = {
        layout.own_shapes[index][name][axis - 1]
        for name, axes in layout.varied_axes.items()
        if axis in axes and layout.padded_shapes[name][axis - 1] == size
    }
    return lengths.pop() if len(lengths) == 1 else None


def split_outputs(outputs: Tensors, layout: _Layout) -> list[Tensors]:
    """Cut a batch's outputs back into one dict per request (see the module's un-padding rule)."""
    if layout.passthrough:
        return [outputs]
    for name, array in outputs.items():
        if array.ndim == 0 or array.shape[0] != layout.padded_rows:
            raise Internal(
                f"model output {name!r} has shape {list(array.shape)}, expected "
                f"{layout.padded_rows} rows (one per row of the batch)"
            )
    parts = []
    for index, (start, stop) in enumerate(layout.bounds):
        part = {}
        for name, array in outputs.items():
            piece = array[start:stop]
            cut = [slice(None)] * piece.ndim
            for axis in range(1, piece.ndim):
                length = _own_length(layout, index, axis, piece.shape[axis])
                if length is not None and length < piece.shape[axis]:
                    cut[axis] = slice(0, length)
            part[name] = piece[tuple(cut)]
        parts.append(part)
    return parts


def _run_batch(
    run: RunFn, requests: list[Tensors], allowed_sizes: Sequence[int]
) -> tuple[list[Tensors], int, float]:
    """Worker-thread body: merge, execute, split. Returns parts, padded size, execution time."""
    merged, layout = merge_inputs(requests, allowed_sizes)
    started = time.perf_counter()
    outputs = run(merged)
    elapsed = time.perf_counter() - started
    outputs = {name: np.asarray(value) for name, value in outputs.items()}
    return split_outputs(outputs, layout), layout.padded_rows, elapsed


def _request_rows(inputs: Tensors) -> int | None:
    """The request's batch size, or None if it cannot be batched: scalars, zero rows, or
    inputs whose first dimensions differ (TF Serving's columnar format allows that, and
    only the model can say what it means)."""
    if not inputs:
        raise InvalidArgument("the request has no inputs")
    if any(array.ndim == 0 for array in inputs.values()):
        return None
    sizes = {array.shape[0] for array in inputs.values()}
    if len(sizes) > 1:
        return None
    return sizes.pop() or None


def _shape_key(inputs: Tensors, pad_variable_length: bool) -> Hashable:
    """Requests with equal keys can share a batch."""

    def dtype_key(dtype: np.dtype) -> str:
        # Byte and unicode strings of different widths concatenate fine.
        return dtype.kind if dtype.kind in "SU" else dtype.str

    if pad_variable_length:
        return tuple((name, dtype_key(a.dtype), a.ndim) for name, a in sorted(inputs.items()))
    return tuple((name, dtype_key(a.dtype), a.shape[1:]) for name, a in sorted(inputs.items()))


# --------------------------------------------------------------------------- scheduling


class ExecutionCost:
    """Measured execution seconds by batch size: a moving average per power-of-two size
    class. A size not measured yet is priced from the nearest measured class, scaled up
    in proportion to the rows when larger (a batch costs at most linearly more) and
    taken as is when smaller; with nothing measured, execution is taken as free."""

    def __init__(self) -> None:
        self._seconds: dict[int, float] = {}

    def observe(self, rows: int, seconds: float) -> None:
        size_class = max(rows, 1).bit_length()
        previous = self._seconds.get(size_class)
        self._seconds[size_class] = (
            seconds if previous is None else previous + COST_SMOOTHING * (seconds - previous)
        )

    def expected(self, rows: int) -> float:
        size_class = max(rows, 1).bit_length()
        known = self._seconds.get(size_class)
        if known is not None:
            return known
        if not self._seconds:
            return 0.0
        nearest = min(self._seconds, key=lambda measured: abs(measured - size_class))
        return self._seconds[nearest] * 2.0 ** max(0, size_class - nearest)


@dataclass(eq=False)
class _Task:
    """Rows of one request in one batch (a split request has several tasks)."""

    inputs: Tensors
    rows: int
    deadline: float | None
    future: asyncio.Future[Tensors]
    enqueued_at: float
    batch: _Batch | None = None  # the batch holding the task until the batch starts

    @property
    def finish_by(self) -> float:
        return finish_by(self.deadline, self.enqueued_at)


def finish_by(deadline: float | None, arrived: float) -> float:
    """When a request's batch must be done: its deadline less the margin of its budget
    (infinity without a deadline)."""
    if deadline is None:
        return math.inf
    return deadline - DEADLINE_MARGIN * (deadline - arrived)


@dataclass(eq=False)
class _Batch:
    key: Hashable
    limit: int
    allowed_sizes: tuple[int, ...]
    tasks: list[_Task] = field(default_factory=list)
    rows: int = 0
    timer: asyncio.TimerHandle | None = None
    cut_at: float = math.inf  # when the timer fires, in the batcher's clock
    finish_by: float = math.inf  # the most urgent member's (see ``finish_by``)
    due: bool = False  # timed out while every thread was busy: runs on the next free thread


class Batcher:
    """Batches requests for one model version; use it from a single event loop.

    ``run`` is the blocking model call (batch in, batch out, thread-safe); it runs in this
    batcher's thread pool, never on the event loop. ``clock`` is the clock deadlines are
    expressed in (``time.monotonic``; tests substitute a controllable one).
    """

    def __init__(
        self,
        run: RunFn,
        config: BatchingConfig | None = None,
        *,
        observer: BatchObserver | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._run = run
        self._clock = clock
        self._config = config or BatchingConfig()
        self._observer = observer
        self._executor = self._new_executor(self._config)
        self._open: dict[Hashable, _Batch] = {}
        self._ready: deque[_Batch] = deque()
        self._running = 0
        self._none_running = asyncio.Event()
        self._none_running.set()
        self.cost = ExecutionCost()
        self._closing = False
        self._reported_depth = 0

    @property
    def queue_depth(self) -> int:
        """Batches waiting for a thread (open and closed); bounded by max_enqueued_batches."""
        return len(self._open) + len(self._ready)

    async def submit(self, inputs: Tensors, deadline: float | None = None) -> Tensors:
        """Run ``inputs`` (already validated) as part of a batch; returns this request's outputs.

        Raises ``Unavailable`` when the queue is full or the batcher is closing,
        ``DeadlineExceeded`` when ``deadline`` passes first, and ``Internal`` (or the
        backend's own ``ServingError``) when the batch's execution fails.
        """
        if self._closing:
            raise Unavailable("the model version is shutting down")
        rows = _request_rows(inputs)
        submitted = self._clock()
        if deadline is not None and deadline <= submitted:
            raise DeadlineExceeded("the deadline expired before the request was queued")
        tasks = self._enqueue(inputs, rows, deadline, submitted)
        try:
            async with asyncio.timeout(None if deadline is None else deadline - self._clock()):
                if len(tasks) == 1:  # the usual case: no gathering future to build
                    return await tasks[0].future
                parts = await asyncio.gather(*(task.future for task in tasks))
        except BaseException as exc:
            self._withdraw(tasks)
            if isinstance(exc, TimeoutError):
                waited = (self._clock() - submitted) * 1000
                raise DeadlineExceeded(
                    f"deadline exceeded after {waited:.1f} ms waiting for the model"
                ) from None
            raise
        return _concatenate(parts)

    def update_config(self, config: BatchingConfig) -> None:
        """Apply ``config`` to batches formed from now on (call on the event loop thread).

        Open batches are cut right away so that none mixes the old and new limits.
        """
        previous, self._config = self._config, config
        for batch in list(self._open.values()):
            self._cut(batch)
        if config.num_batch_threads != previous.num_batch_threads:
            # Running batches keep their threads; the old pool ends when they finish.
            old, self._executor = self._executor, self._new_executor(config)
            old.shutdown(wait=False)
        self._dispatch()

    async def close(self, drain: bool = True) -> None:
        """Stop accepting requests; finish queued ones (``drain``) or fail them ``Unavailable``.

        Returns once no batch is executing, so the model can be unloaded safely.
        """
        self._closing = True
        if drain:
            for batch in list(self._open.values()):
                self._cut(batch)
        else:
            for batch in [*self._open.values(), *self._ready]:
                if batch.timer is not None:
                    batch.timer.cancel()
                for task in batch.tasks:
                    task.batch = None
                    if not task.future.done():
                        task.future.set_exception(Unavailable("the model version was unloaded"))
            self._open.clear()
            self._ready.clear()
        self._report_depth()
        await self._none_running.wait()
        self._executor.shutdown(wait=False)

    # -- queue -----------------------------------------------------------------------

    @staticmethod
    def _new_executor(config: BatchingConfig) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(config.num_batch_threads, thread_name_prefix="slipway-batch")

    def _queue_full(self, needed: int) -> Unavailable:
        return Unavailable(
            f"the batch queue is full: {self.queue_depth} batches waiting, this request needs "
            f"{needed} more, max_enqueued_batches={self._config.max_enqueued_batches}; retry later"
        )

    def _never_fits(self, rows: int) -> InvalidArgument:
        """A request larger than the whole queue: no retry would ever be answered."""
        config = self._config
        most = config.max_batch_size * config.max_enqueued_batches
        return InvalidArgument(
            f"the request has {rows:,} rows, more than the batch queue ever holds "
            f"({config.max_enqueued_batches} batches of {config.max_batch_size} = {most:,} "
            f"rows): send at most {most:,} rows per request, or raise the model's "
            "batching.max_enqueued_batches"
        )

    def _enqueue(
        self, inputs: Tensors, rows: int | None, deadline: float | None, now: float
    ) -> list[_Task]:
        """Place a request's rows in batches, all or nothing."""
        loop = asyncio.get_running_loop()
        config = self._config
        if rows is None or not config.enabled:
            # Runs alone: no splitting, no padding, but the same queue bound and threads.
            if self.queue_depth >= config.max_enqueued_batches:
                raise self._queue_full(1)
            task = _Task(inputs, rows or 0, deadline, loop.create_future(), now)
            batch = _Batch(
                key=None, limit=task.rows, allowed_sizes=(), tasks=[task], rows=task.rows
            )
            batch.finish_by = task.finish_by
            task.batch = batch
            self._ready.append(batch)
            self._dispatch()
            return [task]

        key = _shape_key(inputs, config.pad_variable_length)
        current = self._open.get(key)
        if current is not None and not self._in_time_with(current, rows, deadline, now):
            self._cut(current)
            current = None
        if rows > config.max_batch_size * config.max_enqueued_batches:
            raise self._never_fits(rows)
        first = min(rows, current.limit - current.rows) if current is not None else 0
        new_batches = math.ceil((rows - first) / config.max_batch_size)
        if self.queue_depth + new_batches > config.max_enqueued_batches:
            raise self._queue_full(new_batches)
        bounds = [(0, first)] if first else []
        bounds += [
            (start, min(start + config.max_batch_size, rows))
            for start in range(first, rows, config.max_batch_size)
        ]
        tasks = []
        for start, stop in bounds:
            chunk = (
                inputs
                if (start, stop) == (0, rows)
                else {name: array[start:stop] for name, array in inputs.items()}
            )
            task = _Task(chunk, stop - start, deadline, loop.create_future(), now)
            self._add(task, key, loop)
            tasks.append(task)
        self._report_depth()
        return tasks

    def _in_time_with(self, batch: _Batch, rows: int, deadline: float | None, now: float) -> bool:
        """Whether ``batch``, grown by up to ``rows`` rows of a request arriving ``now``,
        could still finish in time for its most urgent member if it started at once. A
        batch that is already late by itself takes the rows: cutting it would not help."""
        most_urgent = min(batch.finish_by, finish_by(deadline, now))
        if most_urgent == math.inf:
            return True
        grown = batch.rows + min(rows, batch.limit - batch.rows)
        alone_in_time = now + self.cost.expected(batch.rows) <= most_urgent
        return not alone_in_time or now + self.cost.expected(grown) <= most_urgent

    def _add(self, task: _Task, key: Hashable, loop: asyncio.AbstractEventLoop) -> None:
        batch = self._open.get(key)
        if batch is None:
            config = self._config
            batch = _Batch(key, config.max_batch_size, tuple(config.allowed_batch_sizes or ()))
            batch.cut_at = task.enqueued_at + config.batch_timeout_micros / 1e6
            self._open[key] = batch
        batch.tasks.append(task)
        batch.rows += task.rows
        task.batch = batch
        batch.finish_by = min(batch.finish_by, task.finish_by)
        if batch.rows >= batch.limit:
            self._cut(batch)
            return
        cut_at = min(batch.cut_at, batch.finish_by - self.cost.expected(batch.rows))
        if batch.timer is None or cut_at < batch.cut_at:
            # The window closes, or sooner the most urgent member's latest start.
            if batch.timer is not None:
                batch.timer.cancel()
            batch.cut_at = cut_at
            delay = max(0.0, cut_at - self._clock())
            batch.timer = loop.call_later(delay, self._timed_out, batch)

    def _timed_out(self, batch: _Batch) -> None:
        """A batch's window closed. If no thread could run it now, it stays open and keeps
        taking requests until one is free: under load, batches grow instead of queueing."""
        if self._running < self._config.num_batch_threads or self._ready:
            self._cut(batch)
        else:
            batch.due = True

    def _cut(self, batch: _Batch) -> None:
        """Close an open batch (full, timed out, or config changed) and queue it to run."""
        if self._open.get(batch.key) is not batch:
            return
        del self._open[batch.key]
        if batch.timer is not None:
            batch.timer.cancel()
        self._expire(batch)
        if batch.tasks:
            self._ready.append(batch)
        self._dispatch()

    def _expire(self, batch: _Batch) -> None:
        """Fail and remove the tasks whose deadline has passed."""
        now = self._clock()
        for task in [t for t in batch.tasks if t.deadline is not None and t.deadline <= now]:
            self._detach(task)
            if not task.future.done():
                task.future.set_exception(
                    DeadlineExceeded("the deadline expired while the request waited for a batch")
                )

    def _detach(self, task: _Task) -> None:
        batch = task.batch
        if batch is None:
            return
        task.batch = None
        batch.tasks.remove(task)
        batch.rows -= task.rows
        if batch.tasks:
            return
        if self._open.get(batch.key) is batch:
            del self._open[batch.key]
            if batch.timer is not None:
                batch.timer.cancel()
        elif batch in self._ready:
            self._ready.remove(batch)

    def _withdraw(self, tasks: list[_Task]) -> None:
        """The caller stopped waiting: drop its rows that have not started executing."""
        for task in tasks:
            if not task.future.done():
                task.future.cancel()
            self._detach(task)
        self._report_depth()

    def _report_depth(self) -> None:
        depth = self.queue_depth
        if depth == self._reported_depth or self._observer is None:
            return
        self._reported_depth = depth
        try:
            self._observer.on_queue_depth(depth)
        except Exception:
            logger.exception("batch observer failed")

    # -- execution -------------------------------------------------------------------

    def _dispatch(self) -> None:
        """Start ready batches while threads are free (due open batches count as ready)."""
        if not self._ready and self._running < self._config.num_batch_threads:
            for batch in [b for b in self._open.values() if b.due]:
                del self._open[batch.key]
                self._expire(batch)
                if batch.tasks:
                    self._ready.append(batch)
        while self._ready and self._running < self._config.num_batch_threads:
            batch = self._most_urgent_ready()
            self._expire(batch)
            if not batch.tasks:
                continue
            started = self._clock()
            for task in batch.tasks:
                task.batch = None
            self._executor.submit(
                self._execute, asyncio.get_running_loop(), batch.tasks, started, batch.allowed_sizes
            )
            self._running += 1
            self._none_running.clear()
        self._report_depth()

    def _execute(
        self,
        loop: asyncio.AbstractEventLoop,
        tasks: list[_Task],
        started: float,
        allowed_sizes: tuple[int, ...],
    ) -> None:
        """Batch-thread body: run the batch and hand the outcome straight to the event loop.

        One ``call_soon_threadsafe`` per batch, instead of an asyncio future chained to the
        executor's future and a task awaiting it: each of those is another pass of the
        loop that every request of the batch waits for.
        """
        try:
            outcome: BatchOutcome = _run_batch(
                self._run, [task.inputs for task in tasks], allowed_sizes
            )
        except BaseException as exc:  # handed to the requests; nothing is lost here
            outcome = exc
        with contextlib.suppress(RuntimeError):  # the loop closed while the batch ran
            loop.call_soon_threadsafe(self._finish, tasks, started, outcome)

    def _most_urgent_ready(self) -> _Batch:
        """The ready batch whose most urgent member must finish first (arrival order
        among equals, and for batches without deadlines)."""
        batch = min(self._ready, key=lambda ready: ready.finish_by)
        self._ready.remove(batch)
        return batch

    def _finish(
        self,
        tasks: list[_Task],
        started: float,
        outcome: BatchOutcome,
    ) -> None:
        """Hand a batch's results (or its failure) to its requests, then start the next."""
        try:
            if isinstance(outcome, BaseException):
                if isinstance(outcome, ServingError):
                    error: BaseException = outcome
                else:
                    logger.error("batch of %d requests failed", len(tasks), exc_info=outcome)
                    error = Internal(f"model execution failed: {type(outcome).__name__}: {outcome}")
                for task in tasks:
                    if not task.future.done():
                        task.future.set_exception(error)
                return
            parts, padded_rows, elapsed = outcome
            for task, part in zip(tasks, parts, strict=True):
                if not task.future.done():
                    task.future.set_result(part)
            self.cost.observe(padded_rows, elapsed)
            self._observe(tasks, started, padded_rows, elapsed)
        finally:
            self._running -= 1
            if self._running == 0:
                self._none_running.set()
            self._dispatch()

    def _observe(
        self, tasks: list[_Task], started: float, padded_rows: int, elapsed: float
    ) -> None:
        if self._observer is None:
            return
        waits = [started - task.enqueued_at for task in tasks]
        try:
            self._observer.on_batch(sum(t.rows for t in tasks), padded_rows, waits, elapsed)
        except Exception:
            logger.exception("batch observer failed")


def _concatenate(parts: list[Tensors]) -> Tensors:
    """Reassemble a split request's outputs in row order."""
    try:
        return {name: np.concatenate([part[name] for part in parts], axis=0) for name in parts[0]}
    except (ValueError, KeyError) as exc:
        raise Internal(f"cannot reassemble the outputs of a split request: {exc}") from None
