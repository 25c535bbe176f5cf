"""The model repository: versions on disk are discovered by policy, verified, loaded and
warmed up before they take traffic, unloaded only after their requests finish, and a bad
version ends with its error while the others keep serving."""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pytest

from contracts.model_manifest import file_checksums, write_model_manifest
from serving.backends import Backend, open_backend
from serving.errors import InvalidArgument, NotFound, Unavailable
from serving.repository import (
    ModelRepository,
    VersionPolicy,
    VersionState,
    VersionStatus,
    disk_fingerprint,
)
from serving.warmup import warm_up
from tests.support.serving_models import CLASSES, MODEL_NAME, ServingModel, sample_inputs

MODEL = MODEL_NAME
SIGNATURE = "serving_default"
END, AVAILABLE, UNLOADING = VersionState.END, VersionState.AVAILABLE, VersionState.UNLOADING


@pytest.fixture
def make(repositories: list[ModelRepository]):
    def factory(root: Path, **kwargs) -> ModelRepository:
        repository = ModelRepository(root, **kwargs)
        repositories.append(repository)
        return repository

    return factory


class Events:
    """A listener that keeps every (model, status) it is told about."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, VersionStatus]] = []

    def __call__(self, model: str, status: VersionStatus) -> None:
        self.seen.append((model, status))

    def states(self, version: int) -> list[VersionState]:
        return [s.state for _, s in self.seen if s.version == version]


def wait_for(
    repository: ModelRepository,
    model: str,
    version: int,
    states: Iterable[VersionState],
    timeout: float,
) -> VersionStatus:
    """Block until the version reaches one of ``states``; ``TimeoutError`` otherwise.

    Woken by the repository's listener on every change, so nothing here sleeps.
    """
    wanted = set(states)
    changed = threading.Event()

    def listener(_model: str, _status: VersionStatus) -> None:
        changed.set()

    repository.add_listener(listener)
    try:
        deadline = time.monotonic() + timeout
        while True:
            changed.clear()  # before looking, so a change after the look is not missed
            statuses = repository.status(model) if model in repository.models() else []
            reached = [s for s in statuses if s.version == version and s.state in wanted]
            if reached:
                return reached[0]
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not changed.wait(remaining):
                raise TimeoutError(f"{model} version {version} did not reach {wanted}")
    finally:
        repository.remove_listener(listener)


def predict(repository: ModelRepository, version: int | None = None) -> dict[str, np.ndarray]:
    with repository.servable(MODEL, version) as servable:
        return servable.run(SIGNATURE, sample_inputs(2))


# -- discovery and policies ---------------------------------------------------------------


@pytest.fixture(scope="module")
def three_versions(tmp_path_factory: pytest.TempPathFactory, serving_model: ServingModel) -> Path:
    """Versions 1-3 plus directories TensorFlow Serving would not take for versions."""
    root = tmp_path_factory.mktemp("three") / "models"
    for version in (1, 2, 3):
        serving_model.publish(root, version)
    for junk in (".staging-0a1b", "latest", "04", "-5"):
        serving_model.write_version(root / MODEL / junk)
    (root / "not a model").mkdir()
    (root / ".hidden").mkdir()
    return root


@pytest.mark.parametrize(
    ("policy", "served"),
    [
        (None, [3]),
        (VersionPolicy("latest", num_versions=2), [2, 3]),
        (VersionPolicy("all"), [1, 2, 3]),
        (VersionPolicy("specific", versions=[3, 1, 9]), [1, 3]),
    ],
    ids=["default-latest", "latest-2", "all", "specific"],
)
def test_policies_choose_among_integer_versions(
    three_versions: Path, make, policy: VersionPolicy | None, served: list[int]
) -> None:
    repository = make(three_versions, policies={MODEL: policy} if policy else None)
    repository.poll()
    assert repository.models() == [MODEL]
    assert repository.versions(MODEL) == served
    assert repository.status(MODEL) == [VersionStatus(v, AVAILABLE) for v in reversed(served)]
    assert repository.servable(MODEL).version == served[-1]


def test_policy_validation() -> None:
    with pytest.raises(ValueError, match="latest, all or specific"):
        VersionPolicy("newest")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_versions >= 1"):
        VersionPolicy("latest", num_versions=0)
    with pytest.raises(ValueError, match="at least one version"):
        VersionPolicy("specific")


def test_lookups_explain_what_exists(three_versions: Path, make) -> None:
    repository = make(three_versions, default_policy=VersionPolicy("latest", num_versions=2))
    repository.poll()
    with pytest.raises(
        NotFound, match="model 'digits' version 1 is not available; available versions: 2, 3"
    ):
        repository.servable(MODEL, 1)
    with pytest.raises(NotFound, match="model 'nope' not found"):
        repository.servable("nope")
    with pytest.raises(NotFound, match="could not find version 7 of model 'digits'"):
        repository.status(MODEL, 7)
    assert repository.status(MODEL, 2) == [VersionStatus(2, AVAILABLE)]
    assert repository.versions("nope") == []


# -- lifecycle ----------------------------------------------------------------------------


def test_new_version_is_loaded_and_warmed_up_before_it_is_available(
    root: Path, make, serving_model: ServingModel
) -> None:
    serving_model.publish(root, 1)
    warmups: list[tuple[int, VersionState, list[int]]] = []
    events = Events()

    def recording_warmup(backend: Backend, path: Path) -> int:
        version = int(path.name)
        warmups.append(
            (version, repository.status(MODEL, version)[0].state, repository.versions(MODEL))
        )
        return warm_up(backend, path)

    repository = make(root, poll_interval=0.05, warmup=recording_warmup)
    repository.add_listener(events)
    repository.start()
    assert repository.wait_ready(timeout=60)
    assert repository.versions(MODEL) == [1]

    serving_model.publish(root, 2)
    assert wait_for(repository, MODEL, 2, [AVAILABLE, END], timeout=60) == VersionStatus(
        2, AVAILABLE
    )
    wait_for(repository, MODEL, 1, [END], timeout=60)

    assert warmups == [(1, VersionState.LOADING, []), (2, VersionState.LOADING, [1])]
    assert events.states(2) == [VersionState.START, VersionState.LOADING, AVAILABLE]
    assert events.states(1)[-2:] == [UNLOADING, END]
    # Version 1 began unloading only after version 2 could take its traffic.
    order = [(s.version, s.state) for _, s in events.seen]
    assert order.index((2, AVAILABLE)) < order.index((1, UNLOADING))
    assert repository.versions(MODEL) == [2]
    assert predict(repository)["label"].shape == (2, 10)

    repository.stop()
    assert [s.state for s in repository.status(MODEL)] == [END, END]


def test_removed_version_unloads_after_requests_in_flight(
    root: Path, make, serving_model: ServingModel
) -> None:
    for version in (1, 2):
        serving_model.publish(root, version)
    repository = make(root, policies={MODEL: VersionPolicy("all")})
    repository.poll()
    with repository.servable(MODEL, 1) as servable:
        shutil.rmtree(root / MODEL / "1")
        repository.poll()
        assert repository.status(MODEL, 1) == [VersionStatus(1, UNLOADING)]
        assert repository.versions(MODEL) == [2]
        with pytest.raises(NotFound, match="available versions: 2"):
            repository.servable(MODEL, 1)
        with pytest.raises(NotFound, match="is unloading"), servable:
            pass
        # The request already in flight still completes on the old version.
        assert servable.run(SIGNATURE, sample_inputs(1))["value"].shape == (1, 1)
        with pytest.raises(TimeoutError):
            wait_for(repository, MODEL, 1, [END], timeout=0.2)
    assert wait_for(repository, MODEL, 1, [END], timeout=30) == VersionStatus(1, END)
    with pytest.raises(Unavailable):
        servable.backend.run(SIGNATURE, sample_inputs(1))
    assert predict(repository, 2)["label"].shape == (2, 10)


def test_unloading_stops_waiting_after_the_timeout(
    root: Path, make, serving_model: ServingModel
) -> None:
    serving_model.publish(root, 1)
    repository = make(root, unload_timeout=0.05)
    repository.poll()
    with repository.servable(MODEL, 1):
        shutil.rmtree(root / MODEL / "1")
        repository.poll()
        assert wait_for(repository, MODEL, 1, [END], timeout=30).state is END


# -- refusals -----------------------------------------------------------------------------


def test_tampered_version_ends_with_data_loss_while_others_serve(
    root: Path, make, serving_model: ServingModel
) -> None:
    serving_model.publish(root, 1)
    tampered = serving_model.publish(root, 2)
    data = tampered / "variables" / "variables.data-00000-of-00001"
    content = bytearray(data.read_bytes())
    content[-1] ^= 0x01
    data.write_bytes(bytes(content))
    opened: list[Path] = []

    def counting_factory(path: Path) -> Backend:
        opened.append(path)
        return open_backend(path)

    repository = make(root, backend_factory=counting_factory)
    repository.poll()
    [status] = repository.status(MODEL, 2)
    assert (status.state, status.error_code) == (END, 15)
    assert status.error_message == (
        "files do not match slipway.json: "
        "variables/variables.data-00000-of-00001: SHA-256 does not match"
    )
    assert repository.versions(MODEL) == [1]
    assert predict(repository)["label"].shape == (2, 10)

    repository.poll()  # a failed version is not retried while its directory is unchanged
    assert [p.name for p in opened] == ["1"]

    shutil.rmtree(tampered)
    serving_model.publish(root, 2)  # republished: a new directory is tried again
    repository.poll()
    assert repository.status(MODEL, 2) == [VersionStatus(2, AVAILABLE)]
    assert wait_for(repository, MODEL, 1, [END], timeout=30).state is END


def test_version_that_fails_to_load_keeps_its_error(
    root: Path, make, serving_model: ServingModel
) -> None:
    serving_model.publish(root, 1)
    broken = serving_model.publish(root, 2)
    (broken / "saved_model.pb").write_bytes(b"definitely not a SavedModel")
    manifest = serving_model.signature_json()
    write_model_manifest(
        broken, {"name": MODEL, "signature": manifest, "files": file_checksums(broken)}
    )
    repository = make(root)
    repository.poll()
    [status] = repository.status(MODEL, 2)
    assert status.state is END and status.error_code not in (0, 15)
    assert status.error_message
    assert repository.versions(MODEL) == [1]


def test_failing_warmup_keeps_the_version_out(
    root: Path, make, serving_model: ServingModel
) -> None:
    serving_model.publish(root, 1)

    def failing_warmup(backend: Backend, path: Path) -> None:
        raise InvalidArgument("warm-up request 0 does not match the signature")

    repository = make(root, warmup=failing_warmup)
    repository.poll()
    assert repository.status(MODEL) == [
        VersionStatus(1, END, 3, "warm-up request 0 does not match the signature")
    ]
    with pytest.raises(NotFound, match="has no available version"):
        repository.servable(MODEL)


def test_plain_savedmodel_is_served_with_a_warning_unless_strict(
    root: Path, make, caplog: pytest.LogCaptureFixture, serving_model: ServingModel
) -> None:
    serving_model.publish(root, 1, manifest=False)
    with caplog.at_level(logging.WARNING, logger="serving.repository"):
        lenient = make(root)
        lenient.poll()
    assert lenient.versions(MODEL) == [1]
    assert lenient.servable(MODEL).manifest is None
    assert "has no slipway.json: serving it unverified" in caplog.text

    strict = make(root, strict=True)
    strict.poll()
    [status] = strict.status(MODEL)
    assert (status.state, status.error_code) == (END, 9)
    assert "strict mode" in status.error_message


def test_tflite_versions_are_served(root: Path, make, serving_model: ServingModel) -> None:
    serving_model.publish(root, 4, kind="tflite")
    repository = make(root)
    repository.poll()
    servable = repository.servable(MODEL)
    assert servable.version == 4
    assert servable.manifest["labels"]["label"]["classes"] == CLASSES
    inputs = sample_inputs(3)
    with servable:
        outputs = servable.run(SIGNATURE, inputs)
    expected = serving_model.keras_outputs(inputs)
    np.testing.assert_allclose(outputs["label"], expected["label"], rtol=1e-4, atol=1e-5)


def test_version_directories_leading_outside_the_root_are_refused(
    root: Path, tmp_path: Path, make, serving_model: ServingModel
) -> None:
    outside = tmp_path / "elsewhere"
    serving_model.write_version(outside)
    (root / MODEL).mkdir()
    (root / MODEL / "5").symlink_to(outside)
    repository = make(root)
    repository.poll()
    [status] = repository.status(MODEL)
    assert (status.version, status.state, status.error_code) == (5, END, 7)
    assert "leads outside" in status.error_message


def test_without_a_poll_interval_the_disk_is_read_only_when_asked(
    root: Path, make, serving_model: ServingModel
) -> None:
    """A pool's worker: its supervisor watches the disk and asks it to poll."""
    serving_model.publish(root, 1)
    repository = make(root, poll_interval=None, policies={MODEL: VersionPolicy("all")})
    repository.start()
    assert repository.wait_ready(timeout=60)
    serving_model.publish(root, 2)
    # The polling thread is parked: a version published meanwhile is not even seen.
    assert repository.status(MODEL, None) == [VersionStatus(1, AVAILABLE)]
    repository.request_poll()
    wait_for(repository, MODEL, 2, [AVAILABLE], timeout=60)
    assert repository.versions(MODEL) == [1, 2]


def test_the_disk_fingerprint_changes_with_what_a_poll_would_find(
    root: Path, serving_model: ServingModel
) -> None:
    assert disk_fingerprint(root) == disk_fingerprint(root)
    empty = disk_fingerprint(root)
    serving_model.publish(root, 1)
    one = disk_fingerprint(root)
    assert one != empty
    (root / MODEL / "staging-2").mkdir()  # not a version: invisible to a poll
    assert disk_fingerprint(root) == one
    shutil.rmtree(root / MODEL / "1")
    serving_model.publish(root, 1)  # republished in place: a new directory
    assert disk_fingerprint(root) != one
    assert disk_fingerprint(root / "missing") == ()
