"""``slipway canary start`` validates before it takes the model's lock, and leaves nothing
behind when the input is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from ops import cli
from ops.gateway_admin import UnknownModelError
from ops.state import StateStore
from serving.routing import ModelRouting
from slipway.cli import EXIT_USAGE, main

GATEWAY = "http://replica-1:8501"


class ServingOnly:
    """A gateway admin that serves ``digits`` (versions 1 and 2, stable 1) and nothing else."""

    def checked(self, model: str, versions: list[int]) -> ModelRouting:
        if model != "digits":
            raise UnknownModelError(f"{GATEWAY}: model {model!r} is not served")
        missing = sorted(set(versions) - {1, 2})
        if missing:
            raise UnknownModelError(f"{GATEWAY}: version(s) {missing} of {model!r} not available")
        return ModelRouting(labels={"stable": 1})


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(cli, "_admin", lambda targets: ServingOnly())
    return tmp_path / "rollouts"


def error(capsys: pytest.CaptureFixture[str]) -> str:
    """What was printed on stderr, unwrapped."""
    return " ".join(capsys.readouterr().err.split())


def start(state_dir: Path, model: str, *extra: str) -> int:
    return main(
        ["canary", "start", model, "--version", "2", "--gateway", GATEWAY,
         "--state-dir", str(state_dir), *extra]
    )  # fmt: skip


def test_an_unknown_model_is_named_as_not_served_and_leaves_no_lock(
    state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert start(state_dir, "nope") == EXIT_USAGE
    printed = error(capsys)
    assert "model 'nope' is not served" in printed
    assert "stable" not in printed
    assert not (state_dir / "nope").exists()  # no lock file, no directory


def test_a_canary_version_that_is_not_loaded_leaves_no_lock(
    state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["canary", "start", "digits", "--version", "7", "--gateway", GATEWAY,
                 "--state-dir", str(state_dir)]) == EXIT_USAGE  # fmt: skip
    assert "version(s) [7] of 'digits' not available" in error(capsys)
    assert not (state_dir / "digits").exists()


def test_a_bad_analysis_file_is_reported_before_the_lock(
    state_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    analysis = tmp_path / "analysis.yaml"
    analysis.write_text("failure_limit: 0\n", encoding="utf-8")
    assert start(state_dir, "digits", "--analysis", str(analysis)) == EXIT_USAGE
    assert "failure_limit" in error(capsys)
    assert not (state_dir / "digits").exists()


def test_the_lock_is_released_when_starting_fails_under_it(
    state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # An unfinished rollout of another version is only found under the lock.
    from ops.controller import start_rollout
    from ops.state import RolloutSpec, Targets

    store = StateStore(state_dir)
    spec = RolloutSpec(
        model="digits", stable_version=2, canary_version=1, steps=[50, 100], bake_seconds=30,
        interval_seconds=2, targets=Targets(gateways=[GATEWAY]),
    )  # fmt: skip
    with store.lock("digits"):
        start_rollout(store, spec, ServingOnly())
    assert start(state_dir, "digits") == EXIT_USAGE
    assert "to version 1 is pending; abort it first" in error(capsys)
    assert not store.is_locked("digits")
