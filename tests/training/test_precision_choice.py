"""precision ``auto`` decided by timing the model's own update, never by timing here:
the probe's timings are injected, and only the decision and its cache are checked."""

from __future__ import annotations

import json
import shutil

import pytest

from training.precision import choose_precision

BF16_CPU = frozenset({"avx512f", "avx512_bf16"})  # bfloat16 in the ISA, no AMX


class Probe:
    """A stand-in for the timed probe: fixed seconds per update, and a record of calls."""

    def __init__(self, **seconds: float) -> None:
        self.seconds = seconds
        self.measured: list[str] = []

    def __call__(self, precisions: list[str]) -> dict[str, float]:
        self.measured.extend(precisions)
        return {precision: self.seconds[precision] for precision in precisions}


def choose(probe, tmp_path, *, gpus=(), flags=BF16_CPU, model_key="mlp-32", requested="auto"):
    return choose_precision(
        requested,
        probe,
        model_key=model_key,
        gpus=list(gpus),
        flags=flags,
        cache=tmp_path / "precision.json",
    )


def test_a_cpu_where_bfloat16_is_slower_keeps_float32(tmp_path):
    probe = Probe(mixed_bfloat16=0.0111, float32=0.0100)  # bf16 at 0.90x
    choice = choose(probe, tmp_path)
    assert choice.precision == "float32"
    assert probe.measured == ["mixed_bfloat16", "float32"]
    assert choice.seconds_per_update == {"mixed_bfloat16": 0.0111, "float32": 0.0100}
    assert "mixed_bfloat16 11.1 ms" in choice.describe()
    assert choice.describe().startswith("precision float32 (auto: fastest by probe")


def test_a_cpu_where_bfloat16_is_faster_uses_it(tmp_path):
    assert choose(Probe(mixed_bfloat16=0.004, float32=0.010), tmp_path).precision == (
        "mixed_bfloat16"
    )


@pytest.mark.parametrize(
    ("gpus", "seconds", "expected"),
    [
        ([(7, 0)], {"mixed_float16": 0.002, "float32": 0.005}, "mixed_float16"),
        (
            [(8, 0), (8, 6)],
            {"mixed_float16": 0.003, "mixed_bfloat16": 0.002, "float32": 0.005},
            "mixed_bfloat16",
        ),
        ([(7, 5)], {"mixed_float16": 0.006, "float32": 0.005}, "float32"),
    ],
)
def test_gpus_probe_their_reduced_precisions_against_float32(tmp_path, gpus, seconds, expected):
    probe = Probe(**seconds)
    assert choose(probe, tmp_path, gpus=gpus, flags=frozenset()).precision == expected
    assert sorted(probe.measured) == sorted(seconds)


def test_hardware_with_one_candidate_is_not_probed(tmp_path):
    probe = Probe()
    choice = choose(probe, tmp_path, flags=frozenset({"avx2"}))
    assert choice.precision == "float32" and probe.measured == []
    assert not (tmp_path / "precision.json").exists()


def test_an_explicit_precision_is_never_probed(tmp_path):
    probe = Probe()
    choice = choose(probe, tmp_path, requested="mixed_bfloat16")
    assert choice.precision == "mixed_bfloat16" and probe.measured == []
    assert choice.describe() == "precision mixed_bfloat16 (as configured)"


def test_timings_are_cached_per_machine_and_model_shape(tmp_path):
    first = choose(Probe(mixed_bfloat16=0.02, float32=0.01), tmp_path)
    cached = Probe()  # would fail if measured
    again = choose(cached, tmp_path)
    assert cached.measured == [] and again.precision == first.precision == "float32"
    assert "cached probe" in again.describe()

    other_model = Probe(mixed_bfloat16=0.01, float32=0.02)
    assert choose(other_model, tmp_path, model_key="cnn-64").precision == "mixed_bfloat16"
    assert other_model.measured == ["mixed_bfloat16", "float32"]

    other_machine = Probe(mixed_bfloat16=0.01, float32=0.02)
    amx = frozenset({"amx_bf16", "avx512_bf16"})
    assert choose(other_machine, tmp_path, flags=amx).precision == "mixed_bfloat16"
    assert len(other_machine.measured) == 2

    entries = json.loads((tmp_path / "precision.json").read_text())["timings"]
    assert len(entries) == 3


def test_an_unreadable_cache_means_probing_again(tmp_path):
    (tmp_path / "precision.json").write_text("{not json")
    probe = Probe(mixed_bfloat16=0.02, float32=0.01)
    assert choose(probe, tmp_path).precision == "float32"
    assert len(probe.measured) == 2


def precision_events(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    return [r["message"] for r in rows if r["kind"] == "event" and "precision" in r["message"]]


@pytest.fixture
def bf16_cpu_without_amx(monkeypatch):
    """This process sees a CPU with AVX512-BF16, no AMX and no GPU, whatever it runs on."""
    import training.precision

    monkeypatch.setattr(training.precision, "cpu_flags", lambda: BF16_CPU)
    monkeypatch.setattr(training.precision, "gpu_capabilities", lambda: [])


def test_a_probed_run_trains_exactly_like_one_that_found_the_choice_cached(
    tmp_path, digits_dataset, monkeypatch
):
    from research.experiments import load_experiment
    from research.experiments.task import ExperimentTask
    from tests.support.experiments import write_experiment
    from training.precision import CACHE_DIR_ENV, candidates, cpu_flags
    from training.run import train

    if len(candidates(gpu_capabilities=[], flags=cpu_flags())) < 2:
        pytest.skip("this CPU has one precision candidate: nothing to probe")
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    settings = dict(training__steps=10, training__precision="auto", training__deterministic=True)
    outcomes = []
    for name in ("probed", "cached"):
        path = write_experiment(tmp_path / name, digits_dataset, **settings)
        outcomes.append(train(ExperimentTask(load_experiment(path)), export=False, progress=False))

    probed, cached = outcomes
    assert probed.precision == cached.precision
    assert probed.weights_sha256 == cached.weights_sha256
    [first] = precision_events(tmp_path / "probed" / "run")
    [second] = precision_events(tmp_path / "cached" / "run")
    assert first.startswith(f"precision {probed.precision} (auto: fastest by probe;")
    assert "(auto: fastest by cached probe" in second


def test_a_resumed_run_keeps_the_precision_it_started_with(
    tmp_path, digits_dataset, monkeypatch, bf16_cpu_without_amx
):
    """The cache is gone and a new probe would choose float32: the run still resumes in
    the precision it started with, and ends as an uninterrupted run in it would."""
    from functools import partialmethod

    import training.precision_probe
    from research.experiments import load_experiment
    from research.experiments.task import ExperimentTask
    from tests.support.experiments import write_experiment
    from training.controller import Controller
    from training.precision import CACHE_DIR_ENV, RUN_RECORD
    from training.run import train

    cache = tmp_path / "cache"
    monkeypatch.setenv(CACHE_DIR_ENV, str(cache))
    probe = Probe(mixed_bfloat16=0.004, float32=0.010)
    monkeypatch.setattr(training.precision_probe, "measure_update_seconds", lambda _, p: probe(p))
    settings = dict(training__steps=8, training__deterministic=True, checkpoint__every_steps=4)

    def run(name, precision, **train_options):
        path = write_experiment(
            tmp_path / name, digits_dataset, training__precision=precision, **settings
        )
        task = ExperimentTask(load_experiment(path))
        with monkeypatch.context() as patched:
            if train_options:
                patched.setattr(
                    Controller, "train", partialmethod(Controller.train, **train_options)
                )
            return train(task, export=False, progress=False)

    first = run("resumed", "auto", until_step=4)  # as if killed after step 4's checkpoint
    assert (first.step, first.precision) == (4, "mixed_bfloat16")
    record = json.loads((tmp_path / "resumed" / "run" / RUN_RECORD).read_text())
    assert record["precision"] == "mixed_bfloat16"

    shutil.rmtree(cache)
    probe.seconds = {"mixed_bfloat16": 0.020, "float32": 0.010}
    probe.measured.clear()
    resumed = run("resumed", "auto")
    assert (resumed.step, resumed.precision) == (8, "mixed_bfloat16")
    assert probe.measured == []
    started, again = precision_events(tmp_path / "resumed" / "run")
    assert started.startswith("precision mixed_bfloat16 (auto: fastest by probe;")
    assert again.startswith("precision mixed_bfloat16 (auto: as recorded for this run in ")
    assert "precision.json, fastest by probe;" in again

    whole = run("whole", "mixed_bfloat16")
    assert resumed.weights_sha256 == whole.weights_sha256


def test_an_unreadable_run_record_is_an_error_naming_it(tmp_path):
    from training.errors import TrainingSetupError
    from training.precision import (
        RUN_RECORD,
        RUN_RECORD_FORMAT,
        PrecisionChoice,
        record_precision,
        recorded_precision,
    )

    assert recorded_precision(tmp_path) is None
    record_precision(tmp_path, PrecisionChoice("float32", "as configured"))
    assert recorded_precision(tmp_path).precision == "float32"
    wrong_policy = {"format": RUN_RECORD_FORMAT, "precision": "int8"}
    for broken in ("{", json.dumps({"format": "other"}), json.dumps(wrong_policy)):
        (tmp_path / RUN_RECORD).write_text(broken)
        with pytest.raises(TrainingSetupError, match=f"{RUN_RECORD} .*remove it"):
            recorded_precision(tmp_path)


def worker_task(run_dir, requested):
    from types import SimpleNamespace

    training = SimpleNamespace(precision=requested)
    return SimpleNamespace(config=SimpleNamespace(training=training, run_path=run_dir))


@pytest.mark.parametrize(
    ("requested", "from_supervisor", "expected", "reason"),
    [
        ("auto", "mixed_bfloat16", "mixed_bfloat16", "auto: fastest by probe"),
        ("auto", None, "float32", "auto: the safe default without a probe"),
        ("mixed_bfloat16", "float32", "mixed_bfloat16", "as configured"),
    ],
)
def test_every_worker_runs_the_precision_its_supervisor_chose(
    tmp_path, monkeypatch, bf16_cpu_without_amx, requested, from_supervisor, expected, reason
):
    from training.distribution import WorkerRole
    from training.launcher import PRECISION_ENV
    from training.run import PRECISION_REASON_ENV, _worker_precision

    if from_supervisor is None:
        monkeypatch.delenv(PRECISION_ENV, raising=False)
    else:
        monkeypatch.setenv(PRECISION_ENV, from_supervisor)
        monkeypatch.setenv(PRECISION_REASON_ENV, "auto: fastest by probe")
    choice = _worker_precision(worker_task(tmp_path, requested), WorkerRole(1, 2))
    assert (choice.precision, choice.reason) == (expected, reason)


def test_workers_of_another_launcher_take_the_safe_default_then_the_runs_record(
    tmp_path, monkeypatch, bf16_cpu_without_amx
):
    """A TFJob's workers: on a CPU with AVX512-BF16 but no AMX, float32, recorded by the
    chief; once the run records a choice, every worker runs it."""
    from training.distribution import WorkerRole
    from training.launcher import PRECISION_ENV
    from training.precision import PrecisionChoice, record_precision, recorded_precision
    from training.run import _worker_precision

    monkeypatch.delenv(PRECISION_ENV, raising=False)
    task = worker_task(tmp_path / "run", "auto")

    assert _worker_precision(task, WorkerRole(1, 2)).precision == "float32"
    assert recorded_precision(tmp_path / "run") is None  # only the chief records
    assert _worker_precision(task, WorkerRole(0, 2)).precision == "float32"
    assert recorded_precision(tmp_path / "run").precision == "float32"

    record_precision(tmp_path / "run", PrecisionChoice("mixed_bfloat16", "auto: fastest by probe"))
    for index in (0, 1):
        choice = _worker_precision(task, WorkerRole(index, 2))
        assert choice.precision == "mixed_bfloat16"
        assert choice.reason.startswith("auto: as recorded for this run in ")
