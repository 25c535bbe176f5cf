"""Dataset builds on Beam's Dask runner, over real ``dask.distributed`` worker processes.

The reference is the in-process runner: the same spec built both ways must give the
same bytes, whatever the workers, the partitions and the order tasks ran in.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apache_beam as beam
import psutil
import pytest
import yaml
from distributed import Client, LocalCluster

from research.data import line_ranges
from research.data.dask_runner import DaskRunner
from research.data.dask_translation import DaskGraph, overrides
from research.data.pipeline import build_dataset
from research.data.runners import DASK_RUNNER, IN_PROCESS_RUNNER, pipeline_options
from research.data.spec import load_spec
from research.data.synthetic import write_corpus_jsonl
from slipway.raw_data import write_docstrings_jsonl
from tests.support.cli import slipway
from tests.support.raw_data import EXAMPLE_SPECS, write_spec
from tests.support.shards import tree_digest
from tests.support.waiting import wait_until

CORPUS_SIZE = 1500
PARTS = 3


def write_corpus_parts(raw: Path) -> Path:
    """The example corpus spec over the synthetic corpus in ``PARTS`` files, one line broken."""
    write_corpus_jsonl(raw / "corpus.jsonl", CORPUS_SIZE, seed=5, duplicate_rate=0.08,
                       near_duplicate_rate=0.08, pii_rate=0.15)  # fmt: skip
    lines = (raw / "corpus.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    (raw / "corpus.jsonl").unlink()
    lines.insert(700, '{"id": "broken", "text": \n')
    step = len(lines) // PARTS + 1
    (raw / "parts").mkdir()
    for index in range(PARTS):
        part = lines[index * step : (index + 1) * step]
        (raw / "parts" / f"corpus-{index}.jsonl").write_text("".join(part), encoding="utf-8")
    spec = yaml.safe_load((EXAMPLE_SPECS / "corpus.yaml").read_text(encoding="utf-8"))
    spec["sources"] = [{"type": "jsonl", "path": "parts/corpus-*.jsonl"}]
    return write_spec(raw / "corpus.yaml", spec)


def manifest_without_time(dataset: Path) -> dict[str, Any]:
    manifest = json.loads((dataset / "manifest.json").read_text(encoding="utf-8"))
    manifest.pop("created")  # the one field that says when, not what
    return manifest


@pytest.mark.process
def test_a_dask_build_is_byte_identical_to_the_in_process_build(tmp_path: Path) -> None:
    spec_path = write_corpus_parts(tmp_path / "raw")
    reference = build_dataset(load_spec(spec_path), tmp_path / "in-process")
    assert reference.report["records_quarantined"] == 1
    code = slipway(
        "data", "build", spec_path, "-o", tmp_path / "dask", "--runner", "dask", "--workers", "2"
    )  # fmt: skip
    assert code == 0
    dask_files = tree_digest(tmp_path / "dask")
    reference_files = tree_digest(Path(reference.output_dir))
    assert dask_files.pop("manifest.json") and reference_files.pop("manifest.json")
    assert dask_files == reference_files  # shards, vocabulary, report, quarantine
    assert manifest_without_time(tmp_path / "dask") == manifest_without_time(
        Path(reference.output_dir)
    )
    assert sorted(path.name for path in tmp_path.iterdir()) == ["dask", "in-process", "raw"]


@pytest.mark.process
def test_word_terms_learned_by_dask_workers_are_the_in_process_ones(tmp_path: Path) -> None:
    """The docstrings example reads its text as words: the workers count document
    frequencies with the graph's term function in their own processes."""
    raw = tmp_path / "raw"
    write_docstrings_jsonl(raw)
    spec_path = write_spec(
        raw / "docstrings.yaml",
        yaml.safe_load((EXAMPLE_SPECS / "docstrings.yaml").read_text(encoding="utf-8")),
    )
    reference = build_dataset(load_spec(spec_path), tmp_path / "in-process")
    dask = build_dataset(load_spec(spec_path), tmp_path / "dask",
                         beam_args=["--runner", "dask", "--workers", "2"])  # fmt: skip
    assert dask.manifest.features["text"].words_size > 1000
    dask_files, reference_files = (
        tree_digest(tmp_path / "dask"),
        tree_digest(Path(reference.output_dir)),
    )
    assert dask_files.pop("manifest.json") and reference_files.pop("manifest.json")
    assert dask_files == reference_files  # the terms file and the shards


@pytest.mark.process
def test_one_large_file_read_in_parts_by_the_workers_gives_the_whole_reads_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = tmp_path / "raw"
    write_corpus_jsonl(raw / "corpus.jsonl", CORPUS_SIZE, seed=6, duplicate_rate=0.08,
                       near_duplicate_rate=0.08, pii_rate=0.15)  # fmt: skip
    spec = yaml.safe_load((EXAMPLE_SPECS / "corpus.yaml").read_text(encoding="utf-8"))
    spec["sources"] = [{"type": "jsonl", "path": "corpus.jsonl"}]
    spec_path = write_spec(raw / "corpus.yaml", spec)
    whole = build_dataset(load_spec(spec_path), tmp_path / "whole")

    monkeypatch.setattr(line_ranges, "RANGE_BYTES", 4096)  # about 60 parts
    parts = build_dataset(load_spec(spec_path), tmp_path / "parts",
                          beam_args=["--runner", "dask", "--workers", "2"])  # fmt: skip
    assert parts.report["records_read"] == whole.report["records_read"] == CORPUS_SIZE
    parts_files, whole_files = tree_digest(tmp_path / "parts"), tree_digest(tmp_path / "whole")
    assert parts_files.pop("manifest.json") and whole_files.pop("manifest.json")
    assert parts_files == whole_files


# --------------------------------------------------------------------------- the runner


class _Spread(beam.DoFn):
    """Counts the elements each worker process handled, and shows tagged outputs apart."""

    def process(self, element: int) -> Iterator[Any]:
        time.sleep(0.05)  # long enough for every worker to be handed some partitions
        beam.metrics.Metrics.counter("pids", str(os.getpid())).inc()
        yield element
        if element % 4 == 0:
            yield beam.pvalue.TaggedOutput("fours", element)


class _CountAtFinish(beam.DoFn):
    """Emits its bundle's sum only when the bundle finishes."""

    def start_bundle(self) -> None:
        self._total = 0

    def process(self, element: int) -> Iterator[Any]:
        self._total += element
        return iter(())

    def finish_bundle(self) -> Iterator[Any]:
        yield beam.transforms.window.GlobalWindows.windowed_value_at_end_of_window(self._total)


def _count(namespace: str) -> Any:
    return beam.Map(lambda value: beam.metrics.Metrics.counter(namespace, "sum").inc(value))


@pytest.fixture(scope="module")
def cluster() -> Iterator[Client]:
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, host="127.0.0.1", dashboard_address=None,
                     scheduler_kwargs={"dashboard_address": "127.0.0.1:0"})
        as local,
        Client(local, set_as_default=False) as client,
    ):  # fmt: skip
        yield client


def counters(result: Any, namespace: str) -> dict[str, int]:
    query = result.metrics().query(beam.metrics.MetricsFilter().with_namespace(namespace))
    return {counter.key.metric.name: counter.committed for counter in query["counters"]}


@pytest.mark.process
def test_a_pipeline_runs_in_the_clusters_worker_processes(cluster: Client) -> None:
    options = pipeline_options(["--runner", "DaskRunner", "--dask_client_address",
                                cluster.scheduler.address])  # fmt: skip
    pipeline = beam.Pipeline(options=options)
    outputs = (
        pipeline | beam.Create(range(40)) | beam.ParDo(_Spread()).with_outputs("fours", main="all")
    )
    _ = outputs.all | "AllTotals" >> beam.ParDo(_CountAtFinish()) | "CountAll" >> _count("all")
    _ = (
        outputs.fours
        | "FourTotals" >> beam.ParDo(_CountAtFinish())
        | "CountFours" >> _count("fours")
    )
    _ = outputs.all | beam.combiners.Count.Globally() | "CountGlobally" >> _count("count")
    result = pipeline.run()
    result.wait_until_finish()

    workers = {str(pid) for pid in cluster.run(os.getpid).values()}
    per_worker = counters(result, "pids")
    assert set(per_worker) == workers and len(workers) == 2
    assert sum(per_worker.values()) == 40
    assert counters(result, "all") == {"sum": sum(range(40))}  # finish_bundle outputs kept
    assert counters(result, "fours") == {"sum": sum(range(0, 40, 4))}  # only its own tag
    assert counters(result, "count") == {"sum": 40}  # a lifted combiner


def _outputs_of_all_but_par_dos(pipeline: beam.Pipeline) -> list[beam.PCollection]:
    class Outputs(beam.pipeline.PipelineVisitor):
        found: list[beam.PCollection] = []

        def visit_transform(self, node: Any) -> None:
            if not isinstance(node.transform, beam.ParDo):
                self.found.extend(node.outputs.values())

    visitor = Outputs()
    pipeline.visit(visitor)
    return visitor.found


def _join_rounds(pipeline: beam.Pipeline, rounds: int) -> beam.PCollection:
    """``rounds`` joins in a row, each a Flatten of two branches and a GroupByKey, as a
    build's de-duplication chains them; values are (key, total) pairs over keys 0..9."""
    keyed = (
        pipeline
        | beam.Create([range(start, start + 25) for start in range(0, 100, 25)])
        | beam.FlatMap(lambda numbers: [(n % 10, n) for n in numbers])
    )
    for index in range(rounds):
        doubled = keyed | f"Copy{index}" >> beam.Map(lambda pair: pair)
        keyed = (
            (keyed, doubled)
            | f"Flatten{index}" >> beam.Flatten()
            | f"Group{index}" >> beam.GroupByKey()
            | f"Sum{index}" >> beam.MapTuple(lambda key, values: (key, sum(values)))
        )
    return keyed


@pytest.mark.process
def test_joins_in_a_row_stay_within_the_partition_bound(cluster: Client) -> None:
    pipeline = beam.Pipeline(options=pipeline_options(["--runner", "dask"]))
    _ = _join_rounds(pipeline, rounds=6)
    pipeline.replace_all(overrides())
    graph = DaskGraph({}, partitions=4)
    pipeline.visit(graph)
    widest = max(graph.bag(pcoll).npartitions for pcoll in _outputs_of_all_but_par_dos(pipeline))
    assert widest <= 2 * 4  # a Flatten of two bounded bags, before the next shuffle
    tasks = sum(len(bag.__dask_graph__()) for bag in graph.counters())
    assert tasks < 5_000  # unbounded: 289 partitions and 54,636 tasks

    options = pipeline_options(["--runner", "DaskRunner", "--dask_client_address",
                                cluster.scheduler.address, "--dask_npartitions", "4"])  # fmt: skip
    pipeline = beam.Pipeline(options=options)
    totals = _join_rounds(pipeline, rounds=6)
    _ = totals | beam.MapTuple(lambda key, total: beam.metrics.Metrics.counter(
        "totals", str(key)).inc(total))  # fmt: skip
    result = pipeline.run()
    expected = {str(key): sum(n for n in range(100) if n % 10 == key) * 2**6 for key in range(10)}
    assert counters(result, "totals") == expected


class _CountBundles(beam.DoFn):
    """Counts the bundles (partitions) that held any element."""

    def start_bundle(self) -> None:
        self._seen = False

    def process(self, element: int) -> Iterator[Any]:
        self._seen = True
        return iter(())

    def finish_bundle(self) -> None:
        if self._seen:
            beam.metrics.Metrics.counter("bundles", "with_elements").inc()


@pytest.mark.process
def test_a_reshuffle_spreads_a_short_list_of_work_over_partitions(cluster: Client) -> None:
    # One element (a file) fans out to 40 (its parts) in one partition; the Reshuffle
    # after it must spread those parts over the partitions, so that workers share them.
    options = pipeline_options(["--runner", "DaskRunner", "--dask_client_address",
                                cluster.scheduler.address, "--dask_npartitions", "8"])  # fmt: skip
    pipeline = beam.Pipeline(options=options)
    parts = pipeline | beam.Create([40]) | beam.FlatMap(lambda count: list(range(count)))
    _ = parts | "Unspread" >> beam.ParDo(_CountBundles())
    _ = parts | beam.Reshuffle() | "Spread" >> beam.ParDo(_CountBundles())
    result = pipeline.run()
    query = result.metrics().query(beam.metrics.MetricsFilter().with_namespace("bundles"))
    by_step = {counter.key.step: counter.committed for counter in query["counters"]}
    assert by_step == {"Unspread": 1, "Spread": 8}


def _fail(element: int) -> int:
    raise ValueError(f"bad element {element}")


@pytest.mark.process
def test_a_failing_build_raises_its_error_and_stops_its_cluster() -> None:
    before = {child.pid for child in psutil.Process().children(recursive=True)}
    pipeline = beam.Pipeline(options=pipeline_options(["--runner", "dask", "--workers", "2"]))
    _ = pipeline | beam.Create([7]) | beam.Map(_fail)
    with pytest.raises(ValueError, match="bad element 7"):
        pipeline.run()
    wait_until(
        lambda: not {c.pid for c in psutil.Process().children(recursive=True)} - before,
        "the build's worker processes to exit",
    )


@pytest.mark.process
def test_windowing_is_refused_before_any_worker_starts() -> None:
    pipeline = beam.Pipeline(runner=DaskRunner())
    _ = (
        pipeline
        | beam.Create([("a", 1)])
        | beam.WindowInto(beam.window.FixedWindows(60))
        | "GroupByMinute" >> beam.GroupByKey()
    )
    with pytest.raises(NotImplementedError, match="WindowInto"):
        pipeline.run()


# --------------------------------------------------------------------------- options


@pytest.mark.parametrize(
    ("argv", "runner"),
    [
        ([], IN_PROCESS_RUNNER),
        (["--runner", "dask"], DASK_RUNNER),
        (["--runner=DaskRunner", "--workers=3"], DASK_RUNNER),
        (["--runner", "DataflowRunner", "--project", "p", "--temp_location", "gs://b/t"],
         "DataflowRunner"),
    ],
)  # fmt: skip
def test_the_runner_is_chosen_by_name(argv: list[str], runner: str) -> None:
    assert pipeline_options(argv).view_as(beam.options.pipeline_options.StandardOptions).runner == (
        runner
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--workers", "2"], "needs --runner dask"),
        (["--runner", "FlinkRunner", "--workers", "2"], "needs --runner dask"),
        (["--runner", "dask", "--workers", "0"], "at least 1"),
        (
            ["--runner", "dask", "--workers", "2", "--dask_client_address=tcp://h:8786"],
            "connect to",
        ),
    ],
)
def test_contradictory_options_are_refused(argv: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        pipeline_options(argv)
