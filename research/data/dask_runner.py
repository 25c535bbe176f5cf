"""Beam's Dask runner, completed so that it runs a whole dataset build.

``--runner dask`` (see ``research.data.runners``) selects ``DaskRunner``: Beam's
runner with the translation of ``research.data.dask_translation`` (which says what
Beam's own translation loses and how it is fixed), metrics, and a cluster whose
lifetime is the build's:

- with Beam's ``--dask_client_address`` (or ``--dask_scheduler_file``) the build runs
  on that ``dask.distributed`` cluster, which it leaves running;
- otherwise it starts a ``LocalCluster`` of ``--workers`` single-threaded worker
  processes, listening on the loopback interface only, with no dashboard, and closes
  it when the build ends, however it ends. Workers lose their nanny with the process
  that started them and exit after ``DEATH_TIMEOUT_SECONDS`` without a scheduler.

``run_pipeline`` returns once the build has finished (like Beam's in-process
runner), with the counters of every bundle that succeeded.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from typing import Any

from apache_beam.metrics.execution import MetricKey, MetricResult
from apache_beam.metrics.metric import MetricResults, MetricsFilter
from apache_beam.metrics.metricbase import MetricName
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.dask import dask_runner as beam_dask
from apache_beam.runners.runner import PipelineResult, PipelineState
from distributed import Client, LocalCluster

from research.data.dask_translation import CounterKey, DaskGraph, overrides, sum_counters
from research.data.runners import DEFAULT_DASK_WORKERS, LocalClusterOptions

LOOPBACK = "127.0.0.1"
DEATH_TIMEOUT_SECONDS = 60
PARTITIONS_PER_THREAD = 4
MIN_PARTITIONS = 8


class CounterResults(MetricResults):
    """The counters a build recorded, summed over bundles; committed = attempted."""

    def __init__(self, counters: Mapping[CounterKey, int]) -> None:
        self._counters = {
            MetricKey(step, MetricName(namespace, name)): value
            for (step, namespace, name), value in counters.items()
        }

    def query(self, filter: MetricsFilter | None = None) -> dict[str, list[MetricResult]]:
        matching = [
            MetricResult(key, value, value)
            for key, value in self._counters.items()
            if self.matches(filter, key)
        ]
        return {
            self.COUNTERS: matching,
            self.DISTRIBUTIONS: [],
            self.GAUGES: [],
            self.STRINGSETS: [],
            self.BOUNDED_TRIES: [],
            self.HISTOGRAMS: [],
        }


class FinishedResult(PipelineResult):
    """A build that has already run to completion."""

    def __init__(self, counters: Mapping[CounterKey, int]) -> None:
        super().__init__(PipelineState.DONE)
        self._metrics = CounterResults(counters)

    def wait_until_finish(self, duration: int | None = None) -> str:
        return self._state

    def cancel(self) -> str:
        return self._state

    def metrics(self) -> CounterResults:
        return self._metrics


@contextlib.contextmanager
def connect(connection: Mapping[str, Any], workers: int | None) -> Iterator[Client]:
    """A client of the cluster named in ``connection`` (Beam's Dask options), or of a
    local cluster of ``workers`` processes that lives as long as the ``with`` block."""
    if connection.get("address") or connection.get("scheduler_file"):
        with Client(**connection, set_as_default=False) as client:
            yield client
        return
    with (
        LocalCluster(
            n_workers=workers or DEFAULT_DASK_WORKERS,
            threads_per_worker=1,
            processes=True,
            host=LOOPBACK,
            scheduler_port=0,
            dashboard_address=None,
            # Health and metrics are served over HTTP even without a dashboard: on the
            # loopback too, and on a free port rather than 8787 (another cluster's).
            scheduler_kwargs={"dashboard_address": f"{LOOPBACK}:0"},
            silence_logs=logging.WARNING,
            death_timeout=DEATH_TIMEOUT_SECONDS,
        ) as cluster,
        Client(cluster, set_as_default=False) as client,
    ):
        yield client


def default_partitions(client: Client) -> int:
    """Partitions per bag when ``--dask_npartitions`` does not say: a few per worker
    thread, so that a slow partition does not hold the others up, and not so many that
    scheduling costs more than the work."""
    threads = sum(client.nthreads().values())
    return max(MIN_PARTITIONS, PARTITIONS_PER_THREAD * threads)


class DaskRunner(beam_dask.DaskRunner):
    """Runs a pipeline on Dask and waits for it (see the module docstring)."""

    def run_pipeline(self, pipeline: Any, options: PipelineOptions) -> FinishedResult:
        connection = options.view_as(beam_dask.DaskOptions).get_all_options(
            drop_default=True, current_only=True
        )
        bag_options = beam_dask.DaskOptions._extract_bag_kwargs(connection)
        pipeline.replace_all(overrides())
        with connect(connection, options.view_as(LocalClusterOptions).workers) as client:
            partitions = bag_options.get("npartitions") or default_partitions(client)
            graph = DaskGraph(bag_options, partitions)
            pipeline.visit(graph)
            bundles = client.gather(client.compute(graph.counters()))
        return FinishedResult(sum_counters(bundles))
