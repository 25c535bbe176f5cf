"""Version policies and routing together: a version that routing names stays loaded
whatever the policy selects, so the default ``latest`` policy (one version) can run a
canary; a model without a ``stable`` label still serves its newest version, as TF
Serving's ``latest`` does."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from serving.config import GatewayConfig
from serving.repository import ModelRepository, VersionPolicy, VersionState
from serving.routing import ModelRouting, RoutingConfig, write_routing
from tests.support.gateways import GatewayThread
from tests.support.serving_models import MODEL_NAME, ServingModel, sample_inputs
from tests.support.waiting import wait_until

MODEL = MODEL_NAME


def states(repository: ModelRepository) -> dict[int, VersionState]:
    return {status.version: status.state for status in repository.status(MODEL)}


# -- the repository ---------------------------------------------------------------------


def test_latest_one_keeps_a_version_routing_names_beside_the_newest(
    root: Path, repositories: list[ModelRepository], serving_model: ServingModel
) -> None:
    named: dict[str, set[int]] = {MODEL: {1}}
    repository = ModelRepository(root, pinned=lambda model: named.get(model, set()))
    repositories.append(repository)
    serving_model.publish(root, 1)
    repository.poll()
    serving_model.publish(root, 2)
    repository.poll()
    assert repository.versions(MODEL) == [1, 2]

    named[MODEL] = {2}  # promoted: version 1 is no longer named, the policy drops it
    repository.poll()
    wait_until(lambda: states(repository)[1] is VersionState.END, "version 1 to unload")
    assert repository.versions(MODEL) == [2]


def test_a_named_version_is_loaded_even_when_the_policy_would_skip_it(
    root: Path, repositories: list[ModelRepository], serving_model: ServingModel
) -> None:
    for version in (1, 2, 3):
        serving_model.publish(root, version)
    repository = ModelRepository(
        root,
        default_policy=VersionPolicy("specific", versions=(3,)),
        pinned=lambda model: {1, 7},  # 7 is not on disk: nothing to load
    )
    repositories.append(repository)
    repository.poll()
    assert repository.versions(MODEL) == [1, 3]
    assert 7 not in states(repository)


def test_without_routing_the_policy_alone_decides(
    root: Path, repositories: list[ModelRepository], serving_model: ServingModel
) -> None:
    serving_model.publish(root, 1)
    repository = ModelRepository(root)
    repositories.append(repository)
    repository.poll()
    serving_model.publish(root, 2)
    repository.poll()
    wait_until(lambda: repository.versions(MODEL) == [2], "version 1 to unload")


# -- the gateway ------------------------------------------------------------------------


def predict_version(server: GatewayThread, **kwargs) -> int:
    result = server.run(
        server.gateway.predict(
            MODEL,
            kwargs.get("version"),
            kwargs.get("label"),
            "serving_default",
            lambda _signature: sample_inputs(2),
        )
    )
    return result.version


def test_publishing_a_canary_under_the_default_policy_keeps_stable_serving(
    tmp_path: Path, root: Path, serving_model: ServingModel
) -> None:
    routing_file = tmp_path / "routing.yaml"
    write_routing(routing_file, RoutingConfig(models={MODEL: ModelRouting(labels={"stable": 1})}))
    serving_model.publish(root, 1)
    config = GatewayConfig(routing_file=routing_file, poll_interval_s=0.2)
    with GatewayThread(root, config) as server:
        gateway = server.gateway
        serving_model.publish(root, 2)
        server.run(gateway.reload())
        assert gateway.available_versions(MODEL) == [1, 2]
        # The new version takes no traffic of its own: requests naming nothing stay on stable.
        assert {predict_version(server) for _ in range(5)} == {1}
        assert predict_version(server, version=2) == 2

        # A canary starts, as the rollout controller starts it.
        server.run(
            gateway.set_model_routing(
                MODEL, ModelRouting(labels={"stable": 1, "canary": 2}, canary_weight=1.0)
            )
        )
        assert predict_version(server) == 2
        assert predict_version(server, label="stable") == 1

        # Promoted: version 1 is no longer named, and the policy (one version) unloads it.
        server.run(gateway.set_model_routing(MODEL, ModelRouting(labels={"stable": 2})))
        wait_until(lambda: gateway.available_versions(MODEL) == [2], "version 1 to unload")
        assert predict_version(server) == 2


def test_without_a_stable_label_the_newest_version_takes_over_and_says_so(
    root: Path, caplog: pytest.LogCaptureFixture, serving_model: ServingModel
) -> None:
    serving_model.publish(root, 1)
    with GatewayThread(root, GatewayConfig(poll_interval_s=0.2)) as server:
        assert predict_version(server) == 1
        with caplog.at_level(logging.INFO, logger="serving.gateway"):
            serving_model.publish(root, 2)
            server.run(server.gateway.reload())
            wait_until(
                lambda: "version 2 now answers requests that name no version" in caplog.text,
                "the hand-over to be logged",
            )
        wait_until(lambda: server.gateway.available_versions(MODEL) == [2], "version 1 to go")
        assert predict_version(server) == 2


def test_labels_without_stable_warn_when_a_new_version_takes_unlabelled_traffic(
    tmp_path: Path, root: Path, caplog: pytest.LogCaptureFixture, serving_model: ServingModel
) -> None:
    routing_file = tmp_path / "routing.yaml"
    write_routing(routing_file, RoutingConfig(models={MODEL: ModelRouting(labels={"blue": 1})}))
    serving_model.publish(root, 1)
    config = GatewayConfig(routing_file=routing_file, poll_interval_s=0.2)
    with GatewayThread(root, config) as server:
        with caplog.at_level(logging.WARNING, logger="serving.gateway"):
            serving_model.publish(root, 2)
            server.run(server.gateway.reload())
            wait_until(lambda: "no 'stable' version" in caplog.text, "the warning")
        # The labelled version stays loaded and reachable by its label.
        assert server.gateway.available_versions(MODEL) == [1, 2]
        assert predict_version(server, label="blue") == 1
        assert predict_version(server) == 2
