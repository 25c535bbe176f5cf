"""Dynamic batcher: cutting, bounds, deadlines, cancellation, padding and exactness."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pydantic
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from serving.batching import (
    Batcher,
    BatchingConfig,
    ExecutionCost,
    merge_inputs,
    split_outputs,
)
from serving.errors import DeadlineExceeded, Internal, InvalidArgument, NotFound, Unavailable
from tests.support.clocks import FakeClock

LONG_TIMEOUT_MICROS = 30_000_000  # a batch never times out during a test


def run(coroutine: Awaitable[Any], timeout: float = 20.0) -> Any:
    """Run an async test body; a hang fails the test instead of stalling the suite."""

    async def bounded() -> Any:
        return await asyncio.wait_for(coroutine, timeout)

    return asyncio.run(bounded())


def rowwise(x: np.ndarray) -> dict[str, np.ndarray]:
    """A model whose rows are independent; exact on integer data."""
    return {"y": x * 2 + 1, "total": x.reshape(len(x), -1).sum(axis=1)}


class Model:
    """Records each batch it executes; optionally holds every call until ``release()``."""

    def __init__(self, hold: bool = False, fn: Callable[[np.ndarray], dict] = rowwise) -> None:
        self.batches: list[np.ndarray] = []
        self._fn = fn
        self._lock = threading.Lock()
        self._gate = threading.Event()
        if not hold:
            self._gate.set()
        self._entered = threading.Semaphore(0)
        self.active = 0
        self.max_active = 0

    def __call__(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self._lock:
            self.batches.append(inputs["x"].copy())
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        self._entered.release()
        try:
            assert self._gate.wait(20), "the test never released the model"
            x = inputs["x"]
            if (x < 0).any():
                raise ValueError("negative input")
            return self._fn(x)
        finally:
            with self._lock:
                self.active -= 1

    def release(self) -> None:
        self._gate.set()

    async def entered(self) -> None:
        """Wait until one more batch has started executing."""
        assert await asyncio.to_thread(self._entered.acquire, True, 10)

    def rows_seen(self) -> set[int]:
        """The first value of every row the model executed (``rows()`` tags rows with it)."""
        return {int(value) for batch in self.batches for value in batch[:, 0]}


class Observer:
    def __init__(self) -> None:
        self.batches: list[tuple[int, int, list[float], float]] = []
        self.depths: list[int] = []
        self._changed: asyncio.Event | None = None

    def on_batch(self, size, padded_size, queue_wait_seconds, execution_seconds) -> None:
        self.batches.append((size, padded_size, list(queue_wait_seconds), execution_seconds))

    def on_queue_depth(self, depth: int) -> None:
        self.depths.append(depth)
        if self._changed is not None:
            self._changed.set()

    async def until_depth(self, batcher: Batcher, depth: int) -> None:
        while batcher.queue_depth != depth:
            self._changed = asyncio.Event()
            await self._changed.wait()


def rows(*values: int) -> dict[str, np.ndarray]:
    return {"x": np.array([[value, value + 1] for value in values], dtype=np.int64)}


def config(**overrides: Any) -> BatchingConfig:
    base = {"max_batch_size": 4, "batch_timeout_micros": 1000, "num_batch_threads": 1}
    return BatchingConfig(**{**base, **overrides})


def assert_outputs(outputs: dict[str, np.ndarray], inputs: dict[str, np.ndarray]) -> None:
    expected = rowwise(inputs["x"])
    assert outputs.keys() == expected.keys()
    for name in expected:
        np.testing.assert_array_equal(outputs[name], expected[name])


def test_a_full_batch_is_cut_without_waiting_for_the_timeout() -> None:
    model, observer = Model(), Observer()

    async def body() -> None:
        batcher = Batcher(
            model, config(batch_timeout_micros=LONG_TIMEOUT_MICROS), observer=observer
        )
        requests = [rows(i) for i in range(4)]
        results = await asyncio.wait_for(asyncio.gather(*(batcher.submit(r) for r in requests)), 10)
        for result, request in zip(results, requests, strict=True):
            assert_outputs(result, request)
        await batcher.close()

    run(body())
    assert [len(batch) for batch in model.batches] == [4]
    assert [(size, padded) for size, padded, _, _ in observer.batches] == [(4, 4)]
    assert len(observer.batches[0][2]) == 4


def test_an_underfull_batch_is_cut_by_the_timeout() -> None:
    model = Model()

    async def body() -> None:
        batcher = Batcher(model, config(max_batch_size=64, batch_timeout_micros=1000))
        requests = [rows(i) for i in range(3)]
        results = await asyncio.gather(*(batcher.submit(r) for r in requests))
        for result, request in zip(results, requests, strict=True):
            assert_outputs(result, request)
        await batcher.close()

    run(body())
    assert [len(batch) for batch in model.batches] == [3]


def test_a_full_queue_refuses_at_once_with_unavailable() -> None:
    model, observer = Model(hold=True), Observer()

    async def body() -> None:
        batcher = Batcher(
            model, config(max_batch_size=1, max_enqueued_batches=2), observer=observer
        )
        first = asyncio.create_task(batcher.submit(rows(1)))
        await model.entered()
        queued = [asyncio.create_task(batcher.submit(rows(v))) for v in (2, 3)]
        await observer.until_depth(batcher, 2)
        with pytest.raises(Unavailable, match="queue is full"):
            await batcher.submit(rows(4))
        model.release()
        for task, value in zip([first, *queued], (1, 2, 3), strict=True):
            assert_outputs(await task, rows(value))
        await batcher.close()

    run(body())
    assert 4 not in model.rows_seen()


def test_a_request_that_would_overflow_the_queue_is_refused_whole() -> None:
    model, observer = Model(hold=True), Observer()

    async def body() -> None:
        batcher = Batcher(
            model, config(max_batch_size=2, max_enqueued_batches=2), observer=observer
        )
        first = asyncio.create_task(batcher.submit(rows(1, 2)))
        await model.entered()
        second = asyncio.create_task(batcher.submit(rows(3, 4)))
        await observer.until_depth(batcher, 1)
        # Four rows need two batches of two; one waits already, and only two may.
        with pytest.raises(Unavailable, match="retry later"):
            await batcher.submit(rows(10, 11, 12, 13))
        assert batcher.queue_depth == 1
        model.release()
        await first
        await second
        await batcher.close()

    run(body())
    assert model.rows_seen().isdisjoint({10, 11, 12, 13})


def test_a_request_larger_than_the_whole_queue_is_a_client_error_not_retry_later() -> None:
    model = Model()

    async def body() -> None:
        batcher = Batcher(model, config(max_batch_size=2, max_enqueued_batches=2))
        with pytest.raises(InvalidArgument) as refused:
            await batcher.submit(rows(10, 11, 12, 13, 14))
        assert str(refused.value.message) == (
            "the request has 5 rows, more than the batch queue ever holds (2 batches of 2 = 4 "
            "rows): send at most 4 rows per request, or raise the model's "
            "batching.max_enqueued_batches"
        )
        assert_outputs(await batcher.submit(rows(1, 2, 3, 4)), rows(1, 2, 3, 4))
        await batcher.close()

    run(body())
    assert model.rows_seen().isdisjoint({10, 11, 12, 13, 14})


def test_an_expired_request_fails_and_never_reaches_the_model() -> None:
    model, observer = Model(hold=True), Observer()

    async def body() -> None:
        batcher = Batcher(model, config(max_batch_size=1), observer=observer)
        first = asyncio.create_task(batcher.submit(rows(1)))
        await model.entered()
        with pytest.raises(DeadlineExceeded):
            await batcher.submit(rows(50), deadline=time.monotonic() + 0.05)
        assert batcher.queue_depth == 0
        model.release()
        assert_outputs(await first, rows(1))
        await batcher.close()

    run(body())
    assert 50 not in model.rows_seen()


def test_an_expired_request_leaves_its_open_batch() -> None:
    model = Model(hold=True)

    async def body() -> None:
        batcher = Batcher(model, config(max_batch_size=8, batch_timeout_micros=1000))
        busy = asyncio.create_task(batcher.submit(rows(9)))
        await model.entered()  # the only thread is busy until the expired request is gone
        patient = asyncio.create_task(batcher.submit(rows(1)))
        with pytest.raises(DeadlineExceeded):
            await batcher.submit(rows(70), deadline=time.monotonic() + 0.05)
        model.release()
        assert_outputs(await patient, rows(1))
        await busy
        await batcher.close()

    run(body())
    assert [batch[:, 0].tolist() for batch in model.batches] == [[9], [1]]
    assert 70 not in model.rows_seen()


def test_a_deadline_cuts_its_batch_when_it_must_start_not_when_the_window_closes() -> None:
    model = Model()

    async def body() -> None:
        batcher = Batcher(model, config(max_batch_size=8, batch_timeout_micros=LONG_TIMEOUT_MICROS))
        # A batch of one is known to take 17.9 s: a request with 20 s to go (18 s less the
        # margin) must start within 0.1 s, not wait for the 30 s window.
        batcher.cost.observe(1, 17.9)
        outputs = await batcher.submit(rows(5), deadline=time.monotonic() + 20)
        assert_outputs(outputs, rows(5))
        await batcher.close()

    run(body(), timeout=15)


def test_a_request_that_would_make_the_batch_late_opens_the_next_one() -> None:
    model = Model()

    async def body() -> None:
        batcher = Batcher(model, config(max_batch_size=8, batch_timeout_micros=LONG_TIMEOUT_MICROS))
        batcher.cost.observe(1, 10.0)  # one row: 10 s; three or four rows: priced at 20 s
        deadline = time.monotonic() + 20  # 18 s to finish: one row fits, four would not
        urgent = asyncio.create_task(batcher.submit(rows(1), deadline=deadline))
        await asyncio.sleep(0)  # queued first
        later = asyncio.create_task(batcher.submit(rows(2, 3, 4), deadline=deadline))
        assert_outputs(await urgent, rows(1))
        assert_outputs(await later, rows(2, 3, 4))
        await batcher.close()

    run(body(), timeout=15)
    assert [batch[:, 0].tolist() for batch in model.batches] == [[1], [2, 3, 4]]


def test_waiting_batches_run_most_urgent_first() -> None:
    model, observer = Model(hold=True), Observer()

    async def body() -> None:
        batcher = Batcher(model, config(max_batch_size=1), observer=observer)
        now = time.monotonic()
        busy = asyncio.create_task(batcher.submit(rows(1)))
        await model.entered()
        relaxed = asyncio.create_task(batcher.submit(rows(2), deadline=now + 60))
        no_deadline = asyncio.create_task(batcher.submit(rows(3)))
        urgent = asyncio.create_task(batcher.submit(rows(4), deadline=now + 30))
        await observer.until_depth(batcher, 3)
        model.release()
        await asyncio.gather(busy, relaxed, no_deadline, urgent)
        await batcher.close()

    run(body())
    assert [batch[0, 0] for batch in model.batches] == [1, 4, 2, 3]


def test_execution_cost_is_averaged_per_size_class_and_priced_up_for_larger_batches() -> None:
    cost = ExecutionCost()
    assert cost.expected(8) == 0.0  # nothing measured: no reason to cut early
    cost.observe(4, 1.0)
    cost.observe(5, 2.0)  # 4 to 7 rows share a class: a moving average
    assert cost.expected(6) == pytest.approx(1.2)
    assert cost.expected(2) == pytest.approx(1.2)  # smaller: at most as dear
    assert cost.expected(16) == pytest.approx(4.8)  # two classes up: four times


def test_requests_expired_when_their_batch_is_cut_are_dropped() -> None:
    model, observer, clock = Model(hold=True), Observer(), FakeClock()

    async def body() -> None:
        batcher = Batcher(
            model,
            config(max_batch_size=2, batch_timeout_micros=LONG_TIMEOUT_MICROS),
            observer=observer,
            clock=clock,
        )
        busy = asyncio.create_task(batcher.submit(rows(1, 2)))  # occupies the only thread
        await model.entered()
        stale = asyncio.create_task(batcher.submit(rows(90), deadline=clock.now + 60))
        await observer.until_depth(batcher, 1)
        clock.now += 61
        fresh = asyncio.create_task(batcher.submit(rows(3)))  # fills the batch: cut at once
        with pytest.raises(DeadlineExceeded, match="waited for a batch"):
            await stale  # fails at the cut, while the thread is still busy
        model.release()
        assert_outputs(await fresh, rows(3))
        await busy
        await batcher.close()

    run(body())
    assert [batch[:, 0].tolist() for batch in model.batches] == [[1, 2], [3]]


def test_a_deadline_already_past_is_refused_before_queueing() -> None:
    model = Model()

    async def body() -> None:
        batcher = Batcher(model, config())
        with pytest.raises(DeadlineExceeded):
            await batcher.submit(rows(1), deadline=time.monotonic() - 1)
        assert batcher.queue_depth == 0
        await batcher.close()

    run(body())
    assert model.batches == []


def test_a_cancelled_request_is_removed_from_the_queue() -> None:
    model, observer = Model(hold=True), Observer()

    async def body() -> None:
        batcher = Batcher(model, config(max_batch_size=1), observer=observer)
        first = asyncio.create_task(batcher.submit(rows(1)))
        await model.entered()
        doomed = asyncio.create_task(batcher.submit(rows(60)))
        await observer.until_depth(batcher, 1)
        doomed.cancel()
        with pytest.raises(asyncio.CancelledError):
            await doomed
        assert batcher.queue_depth == 0
        model.release()
        await first
        await batcher.close()

    run(body())
    assert 60 not in model.rows_seen()
    assert observer.depths[-1] == 0


def test_a_large_request_is_split_and_reassembled_in_order() -> None:
    model = Model()
    big = rows(*range(100, 110))

    async def body() -> None:
        batcher = Batcher(model, config(max_batch_size=4, batch_timeout_micros=1000))
        small, large = await asyncio.gather(batcher.submit(rows(1)), batcher.submit(big))
        assert_outputs(small, rows(1))
        assert_outputs(large, big)
        await batcher.close()

    run(body())
    # The first rows of the large request top up the open batch, as in TF Serving.
    assert sorted(len(batch) for batch in model.batches) == [3, 4, 4]
    assert [batch[0, 0] for batch in model.batches[:1]] == [1]


def test_batches_are_padded_to_an_allowed_size_and_sliced_back() -> None:
    model, observer = Model(), Observer()

    async def body() -> None:
        batcher = Batcher(
            model, config(max_batch_size=8, allowed_batch_sizes=[2, 4, 8]), observer=observer
        )
        requests = [rows(1), rows(2), rows(3)]
        results = await asyncio.gather(*(batcher.submit(r) for r in requests))
        for result, request in zip(results, requests, strict=True):
            assert_outputs(result, request)
        await batcher.close()

    run(body())
    (batch,) = model.batches
    assert len(batch) == 4
    np.testing.assert_array_equal(batch[3], batch[2])  # padding repeats the last real row
    assert [(size, padded) for size, padded, _, _ in observer.batches] == [(3, 4)]


def test_variable_length_inputs_are_zero_padded_and_outputs_cut_back() -> None:
    model = Model()
    short = {"x": np.array([[1, 2, 3]], dtype=np.int64)}
    long = {"x": np.array([[4, 5, 6, 7, 8], [9, 9, 9, 9, 9]], dtype=np.int64)}

    async def body() -> None:
        batcher = Batcher(model, config(max_batch_size=8))
        first, second = await asyncio.gather(batcher.submit(short), batcher.submit(long))
        assert_outputs(first, short)
        assert_outputs(second, long)
        await batcher.close()

    run(body())
    (batch,) = model.batches
    np.testing.assert_array_equal(batch[0], [1, 2, 3, 0, 0])


def test_without_length_padding_different_shapes_use_different_batches() -> None:
    model = Model()
    short = {"x": np.array([[1, 2, 3]], dtype=np.int64)}
    long = {"x": np.array([[4, 5, 6, 7, 8]], dtype=np.int64)}

    async def body() -> None:
        batcher = Batcher(model, config(max_batch_size=8, pad_variable_length=False))
        first, second = await asyncio.gather(batcher.submit(short), batcher.submit(long))
        assert_outputs(first, short)
        assert_outputs(second, long)
        await batcher.close()

    run(body())
    assert sorted(batch.shape[1] for batch in model.batches) == [3, 5]


def test_unpadding_applies_only_to_axes_matching_a_padded_input() -> None:
    requests = [
        {"tokens": np.ones((1, 3), np.int32), "mask": np.ones((1, 3), np.int32)},
        {"tokens": np.ones((2, 6), np.int32), "mask": np.ones((2, 6), np.int32)},
    ]
    merged, layout = merge_inputs(requests, allowed_sizes=(4,))
    assert merged["tokens"].shape == (4, 6)
    outputs = {
        "per_token": np.zeros((4, 6, 7)),  # [batch, time, features]: cut back on axis 1
        "pooled": np.zeros((4, 7)),  # axis 1 is features, not time: kept whole
    }
    first, second = split_outputs(outputs, layout)
    assert first["per_token"].shape == (1, 3, 7)
    assert second["per_token"].shape == (2, 6, 7)
    assert first["pooled"].shape == (1, 7)


def test_string_inputs_are_padded_with_empty_strings() -> None:
    requests = [
        {"words": np.array([[b"a"]], dtype=object)},
        {"words": np.array([[b"b", b"c"]], dtype=object)},
    ]
    merged, _ = merge_inputs(requests, allowed_sizes=())
    assert merged["words"].tolist() == [[b"a", b""], [b"b", b"c"]]


def test_a_failing_batch_fails_only_its_own_requests() -> None:
    model = Model()

    async def body() -> None:
        batcher = Batcher(model, config(max_batch_size=1, num_batch_threads=2))
        bad, good = await asyncio.gather(
            batcher.submit(rows(-5)), batcher.submit(rows(5)), return_exceptions=True
        )
        assert isinstance(bad, Internal)
        assert "negative input" in str(bad)
        assert_outputs(good, rows(5))
        assert_outputs(await batcher.submit(rows(6)), rows(6))
        await batcher.close()

    run(body())


def test_a_serving_error_from_the_backend_keeps_its_status() -> None:
    def missing(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise NotFound("remote model is gone")

    async def body() -> None:
        batcher = Batcher(missing, config())
        with pytest.raises(NotFound, match="remote model is gone"):
            await batcher.submit(rows(1))
        await batcher.close()

    run(body())


def test_a_model_returning_the_wrong_batch_size_is_an_internal_error() -> None:
    async def body() -> None:
        batcher = Batcher(lambda inputs: {"y": np.zeros((1, 2))}, config(max_batch_size=8))
        results = await asyncio.gather(
            batcher.submit(rows(1)), batcher.submit(rows(2)), return_exceptions=True
        )
        assert all(isinstance(result, Internal) for result in results)
        assert "expected 2 rows" in str(results[0])
        await batcher.close()

    run(body())


def test_num_batch_threads_batches_execute_concurrently() -> None:
    model, observer = Model(hold=True), Observer()

    async def body() -> None:
        batcher = Batcher(model, config(max_batch_size=1, num_batch_threads=2), observer=observer)
        tasks = [asyncio.create_task(batcher.submit(rows(v))) for v in (1, 2, 3)]
        await model.entered()
        await model.entered()
        await observer.until_depth(batcher, 1)
        assert model.active == 2  # two threads busy, the third batch waits
        model.release()
        for task, value in zip(tasks, (1, 2, 3), strict=True):
            assert_outputs(await task, rows(value))
        await batcher.close()

    run(body())
    assert model.max_active == 2


def test_a_batch_whose_window_closes_while_every_thread_is_busy_keeps_growing() -> None:
    model = Model(hold=True)

    async def body() -> None:
        batcher = Batcher(model, config(max_batch_size=8, batch_timeout_micros=1000))
        first = asyncio.create_task(batcher.submit(rows(1)))
        await model.entered()  # the only thread is now busy
        second = asyncio.create_task(batcher.submit(rows(2)))
        # Let the second request's window pass many times over: it must not be cut alone.
        await asyncio.sleep(0.02)
        third = asyncio.create_task(batcher.submit(rows(3)))
        await asyncio.sleep(0)
        model.release()
        for task, value in ((first, 1), (second, 2), (third, 3)):
            assert_outputs(await task, rows(value))
        await batcher.close()

    run(body())
    assert [sorted(batch[:, 0].tolist()) for batch in model.batches] == [[1], [2, 3]]


def test_disabled_batching_runs_each_request_alone_within_the_queue_bound() -> None:
    model, observer = Model(hold=True), Observer()

    async def body() -> None:
        batcher = Batcher(
            model,
            config(enabled=False, max_batch_size=1, max_enqueued_batches=1),
            observer=observer,
        )
        first = asyncio.create_task(batcher.submit(rows(1, 2, 3)))
        await model.entered()
        second = asyncio.create_task(batcher.submit(rows(4)))
        await observer.until_depth(batcher, 1)
        with pytest.raises(Unavailable):
            await batcher.submit(rows(5))
        model.release()
        assert_outputs(await first, rows(1, 2, 3))
        assert_outputs(await second, rows(4))
        await batcher.close()

    run(body())
    # Not split although larger than max_batch_size, and never merged.
    assert [len(batch) for batch in model.batches] == [3, 1]


def test_update_config_applies_to_later_batches() -> None:
    model = Model()

    async def body() -> None:
        batcher = Batcher(model, config(max_batch_size=4))
        await asyncio.gather(*(batcher.submit(rows(v)) for v in (1, 2)))
        batcher.update_config(config(max_batch_size=1, num_batch_threads=2))
        await asyncio.gather(*(batcher.submit(rows(v)) for v in (3, 4)))
        await batcher.close()

    run(body())
    assert [len(batch) for batch in model.batches] == [2, 1, 1]


def test_close_with_drain_finishes_queued_work() -> None:
    model, observer = Model(), Observer()

    async def body() -> None:
        batcher = Batcher(
            model,
            config(max_batch_size=8, batch_timeout_micros=LONG_TIMEOUT_MICROS),
            observer=observer,
        )
        pending = asyncio.create_task(batcher.submit(rows(1)))
        await observer.until_depth(batcher, 1)
        await batcher.close(drain=True)
        assert_outputs(await pending, rows(1))
        with pytest.raises(Unavailable):
            await batcher.submit(rows(2))

    run(body())


def test_close_without_drain_fails_queued_work_with_unavailable() -> None:
    model, observer = Model(hold=True), Observer()

    async def body() -> None:
        batcher = Batcher(model, config(max_batch_size=1), observer=observer)
        running = asyncio.create_task(batcher.submit(rows(1)))
        await model.entered()
        queued = asyncio.create_task(batcher.submit(rows(80)))
        await observer.until_depth(batcher, 1)
        closing = asyncio.create_task(batcher.close(drain=False))
        with pytest.raises(Unavailable):
            await queued
        model.release()
        await closing
        assert_outputs(await running, rows(1))

    run(body())
    assert 80 not in model.rows_seen()


def test_inputs_with_different_first_dimensions_run_alone_as_they_came() -> None:
    seen: list[tuple[int, int]] = []

    def lengths(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        seen.append((len(inputs["a"]), len(inputs["b"])))
        return {"a": np.array(len(inputs["a"])), "b": np.array(len(inputs["b"]))}

    async def body() -> None:
        batcher = Batcher(lengths, config(max_batch_size=8))
        request = {"a": np.zeros((2, 1)), "b": np.zeros((3, 1))}
        answers = await asyncio.gather(batcher.submit(request), batcher.submit(request))
        assert [(int(a["a"]), int(a["b"])) for a in answers] == [(2, 3), (2, 3)]
        assert seen == [(2, 3), (2, 3)]  # never merged with each other
        await batcher.close()

    run(body())


def test_a_request_with_scalar_inputs_runs_alone_as_it_came() -> None:
    def scaled(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"y": inputs["x"] * inputs["scale"]}

    async def body() -> None:
        batcher = Batcher(scaled, config(max_batch_size=8))
        request = {"x": np.arange(3.0), "scale": np.array(2.0)}
        first, second = await asyncio.gather(batcher.submit(request), batcher.submit(request))
        for outputs in (first, second):
            np.testing.assert_array_equal(outputs["y"], [0.0, 2.0, 4.0])
        await batcher.close()

    run(body())


def test_allowed_batch_sizes_must_end_at_max_batch_size() -> None:
    with pytest.raises(pydantic.ValidationError, match="must equal max_batch_size"):
        BatchingConfig(max_batch_size=8, allowed_batch_sizes=[2, 4])
    with pytest.raises(pydantic.ValidationError, match="strictly increasing"):
        BatchingConfig(max_batch_size=8, allowed_batch_sizes=[4, 2, 8])


@settings(max_examples=25, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 12), min_size=1, max_size=8),
    lengths=st.lists(st.integers(1, 4), min_size=8, max_size=8),
    max_batch_size=st.integers(1, 8),
    use_allowed_sizes=st.booleans(),
)
@example(sizes=[12] * 8, lengths=[1, 2, 3, 4] * 2, max_batch_size=1, use_allowed_sizes=False)
def test_batched_results_equal_unbatched_results(
    sizes: list[int], lengths: list[int], max_batch_size: int, use_allowed_sizes: bool
) -> None:
    """However requests are split, merged and padded, each gets exactly its own answer.

    All requests are queued at once, so with ``max_batch_size=1`` every row is a batch of
    its own waiting for a thread: the queue bound is set to hold them all, since refusing
    a burst larger than the bound is the batcher's job and not what this test checks.
    """
    allowed = sorted({1, max_batch_size, (max_batch_size + 1) // 2}) if use_allowed_sizes else None
    generator = np.random.default_rng(sum(sizes) + max_batch_size)
    requests = [
        {"x": generator.integers(0, 1000, size=(size, length))}
        for size, length in zip(sizes, lengths, strict=False)
    ]

    async def body() -> list[dict[str, np.ndarray]]:
        batcher = Batcher(
            Model(),
            config(
                max_batch_size=max_batch_size,
                allowed_batch_sizes=allowed,
                num_batch_threads=2,
                max_enqueued_batches=sum(sizes),
            ),
        )
        results = await asyncio.gather(*(batcher.submit(r) for r in requests))
        await batcher.close()
        return results

    for result, request in zip(run(body()), requests, strict=True):
        assert_outputs(result, request)


def test_a_tensorflow_function_gives_the_same_answers_batched() -> None:
    tf = pytest.importorskip("tensorflow")

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32)])
    def scores(x):
        hidden = tf.tanh(x * 0.5 + 0.25)
        return {"scores": hidden, "best": tf.reduce_max(hidden, axis=1)}

    def backend(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {name: value.numpy() for name, value in scores(inputs["x"]).items()}

    generator = np.random.default_rng(7)
    requests = [{"x": generator.normal(size=(n, 3)).astype(np.float32)} for n in (1, 3, 2, 5)]
    alone = [backend(request) for request in requests]

    async def body() -> list[dict[str, np.ndarray]]:
        batcher = Batcher(backend, config(max_batch_size=4, allowed_batch_sizes=[2, 4]))
        results = await asyncio.gather(*(batcher.submit(r) for r in requests))
        await batcher.close()
        return results

    for batched, expected in zip(run(body()), alone, strict=True):
        for name in expected:
            np.testing.assert_array_equal(batched[name], expected[name])
