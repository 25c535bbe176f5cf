"""precision ``auto`` decided by timing the model's own update, never by timing here:
the probe's timings are injected, and only the decision and its cache are checked."""

from __future__ import annotations

import json

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


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    from tests.training.experiments import build_digits_dataset

    return build_digits_dataset(tmp_path_factory.mktemp("digits"))


def precision_events(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    return [r["message"] for r in rows if r["kind"] == "event" and "precision" in r["message"]]


def test_a_probed_run_trains_exactly_like_one_that_found_the_choice_cached(
    tmp_path, dataset, monkeypatch
):
    from research.experiments import load_experiment
    from research.experiments.task import ExperimentTask
    from tests.training.experiments import write_experiment
    from training.precision import CACHE_DIR_ENV, candidates, cpu_flags
    from training.run import train

    if len(candidates(gpu_capabilities=[], flags=cpu_flags())) < 2:
        pytest.skip("this CPU has one precision candidate: nothing to probe")
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    settings = dict(training__steps=10, training__precision="auto", training__deterministic=True)
    outcomes = []
    for name in ("probed", "cached"):
        path = write_experiment(tmp_path / name, dataset, **settings)
        outcomes.append(train(ExperimentTask(load_experiment(path)), export=False, progress=False))

    probed, cached = outcomes
    assert probed.precision == cached.precision
    assert probed.weights_sha256 == cached.weights_sha256
    [first] = precision_events(tmp_path / "probed" / "run")
    [second] = precision_events(tmp_path / "cached" / "run")
    assert first.startswith(f"precision {probed.precision} (auto: fastest by probe;")
    assert "(auto: fastest by cached probe" in second


@pytest.mark.parametrize(
    ("requested", "from_supervisor", "expected", "reason"),
    [
        ("auto", "float32", "float32", "auto: chosen by the supervisor's probe"),
        ("auto", None, None, "auto: the hardware's default"),
        ("mixed_bfloat16", "float32", "mixed_bfloat16", "as configured"),
    ],
)
def test_every_worker_runs_the_precision_its_supervisor_chose(
    monkeypatch, requested, from_supervisor, expected, reason
):
    from types import SimpleNamespace

    from training.launcher import PRECISION_ENV
    from training.precision import resolve_precision
    from training.run import _worker_precision

    if from_supervisor is None:
        monkeypatch.delenv(PRECISION_ENV, raising=False)
    else:
        monkeypatch.setenv(PRECISION_ENV, from_supervisor)
    task = SimpleNamespace(config=SimpleNamespace(training=SimpleNamespace(precision=requested)))
    choice = _worker_precision(task)
    assert choice.precision == (expected or resolve_precision("auto"))
    assert choice.reason == reason
