"""Routing: decisions, the canary split, sticky keys, the routing file and its watcher."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import random
import stat
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.errors import InvalidArgument, NotFound
from serving.routing import (
    ModelRouting,
    RouteDecision,
    Router,
    RoutingConfig,
    RoutingConfigError,
    RoutingWatcher,
    load_routing,
    parse_routing,
    sticky_fraction,
    write_routing,
)


def routing(**model: object) -> RoutingConfig:
    return RoutingConfig(models={"digits": ModelRouting(**model)})


def router(config: RoutingConfig, available: tuple[int, ...] = (1, 2, 3)) -> Router:
    return Router(lambda: config, lambda model: available, rng=random.Random(0))


CANARY = {"labels": {"stable": 1, "canary": 2}}


def test_an_explicit_version_goes_exactly_there() -> None:
    config = routing(**CANARY, canary_weight=1.0, failover=True, timeout_ms=250)
    decision = router(config).choose("digits", version=3)
    assert decision == RouteDecision(3, "explicit", None, None, timeout_ms=250)


def test_an_explicit_label_goes_to_its_version() -> None:
    config = routing(labels={"stable": 1, "canary": 2, "beta": 3}, canary_weight=1.0)
    assert router(config).choose("digits", label="beta") == RouteDecision(3, "explicit")
    assert router(config).choose("digits", label="stable").version == 1


def test_an_unknown_label_is_an_invalid_argument_naming_the_known_ones() -> None:
    with pytest.raises(InvalidArgument, match="Unrecognized servable version label: gold.*canary"):
        router(routing(**CANARY)).choose("digits", label="gold")


def test_version_and_label_together_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="not both"):
        router(routing(**CANARY)).choose("digits", version=1, label="stable")


def test_a_model_without_labels_routes_to_its_highest_available_version() -> None:
    decision = router(RoutingConfig(), available=(4, 9, 7)).choose("other")
    assert decision == RouteDecision(9, "stable")


def test_a_model_with_no_available_version_is_not_found() -> None:
    with pytest.raises(NotFound):
        router(RoutingConfig(), available=()).choose("other")


@pytest.mark.parametrize(("weight", "expected"), [(0.0, "stable"), (1.0, "canary")])
def test_weight_extremes_send_everything_to_one_side(weight: float, expected: str) -> None:
    chooser = router(routing(**CANARY, canary_weight=weight))
    routes = {chooser.choose("digits").route for _ in range(2000)}
    routes |= {chooser.choose("digits", sticky_key=f"user-{i}").route for i in range(2000)}
    assert routes == {expected}


def test_the_canary_fraction_matches_the_weight_within_three_sigma() -> None:
    draws, weight = 10_000, 0.1
    chooser = Router(lambda: routing(**CANARY, canary_weight=weight), rng=random.Random(1234))
    canary = sum(chooser.choose("digits").route == "canary" for _ in range(draws))
    sigma = math.sqrt(draws * weight * (1 - weight))
    assert abs(canary - draws * weight) <= 3 * sigma


def test_sticky_keys_split_at_the_weight_and_stay_on_their_side() -> None:
    draws, weight = 10_000, 0.3
    chooser = router(routing(**CANARY, canary_weight=weight))
    sides = [chooser.choose("digits", sticky_key=f"user-{i}").route for i in range(draws)]
    sigma = math.sqrt(draws * weight * (1 - weight))
    assert abs(sides.count("canary") - draws * weight) <= 3 * sigma
    other_rng = Router(lambda: routing(**CANARY, canary_weight=weight), rng=random.Random(99))
    again = [other_rng.choose("digits", sticky_key=f"user-{i}").route for i in range(draws)]
    assert again == sides


def test_sticky_fraction_is_sha256_of_model_and_key() -> None:
    # First 8 bytes of SHA-256(b"digits\0alice"), big-endian, over 2**64.
    digest = hashlib.sha256(b"digits\0alice").digest()
    assert sticky_fraction("digits", "alice") == int.from_bytes(digest[:8], "big") / 2**64
    assert 0.0 <= sticky_fraction("digits", "alice") < 1.0
    assert sticky_fraction("digits", "alice") != sticky_fraction("letters", "alice")


@settings(max_examples=200, deadline=None)
@given(
    key=st.text(max_size=40),
    low=st.floats(0.0, 1.0),
    high=st.floats(0.0, 1.0),
)
def test_raising_the_canary_weight_only_moves_keys_to_the_canary(
    key: str, low: float, high: float
) -> None:
    low, high = min(low, high), max(low, high)
    before = router(routing(**CANARY, canary_weight=low)).choose("digits", sticky_key=key)
    after = router(routing(**CANARY, canary_weight=high)).choose("digits", sticky_key=key)
    if before.route == "canary":
        assert after.route == "canary"


def test_a_canary_that_is_not_available_gets_no_weighted_traffic() -> None:
    chooser = router(routing(**CANARY, canary_weight=1.0), available=(1,))
    assert chooser.choose("digits") == RouteDecision(1, "stable")


def test_failover_names_stable_only_for_canary_traffic() -> None:
    with_failover = router(routing(**CANARY, canary_weight=1.0, failover=True))
    assert with_failover.choose("digits") == RouteDecision(2, "canary", failover_version=1)
    without = router(routing(**CANARY, canary_weight=1.0))
    assert without.choose("digits").failover_version is None
    stable_only = router(routing(**CANARY, canary_weight=0.0, failover=True))
    assert stable_only.choose("digits").failover_version is None


def test_shadow_mirrors_its_percentage_of_routed_traffic() -> None:
    always = router(routing(**CANARY, shadow={"label": "canary", "percent": 100}))
    assert always.choose("digits") == RouteDecision(1, "stable", shadow_version=2)
    assert always.choose("digits", version=1).shadow_version is None  # explicit: not mirrored
    never = router(routing(**CANARY, shadow={"label": "canary", "percent": 0}))
    assert never.choose("digits").shadow_version is None
    by_version = router(routing(labels={"stable": 1}, shadow={"version": 3, "percent": 100}))
    assert by_version.choose("digits").shadow_version == 3


def test_shadow_skips_the_version_already_answering() -> None:
    chooser = router(
        routing(**CANARY, canary_weight=1.0, shadow={"label": "canary", "percent": 100})
    )
    assert chooser.choose("digits") == RouteDecision(2, "canary")


def test_the_shadow_fraction_matches_the_percentage() -> None:
    draws = 10_000
    chooser = Router(
        lambda: routing(**CANARY, shadow={"label": "canary", "percent": 20}),
        rng=random.Random(5),
    )
    mirrored = sum(chooser.choose("digits").shadow_version == 2 for _ in range(draws))
    assert abs(mirrored - 2000) <= 3 * math.sqrt(draws * 0.2 * 0.8)


def test_a_reloaded_config_applies_to_the_next_request() -> None:
    current = {"config": routing(**CANARY, canary_weight=0.0)}
    chooser = Router(lambda: current["config"], rng=random.Random(0))
    assert chooser.choose("digits").route == "stable"
    current["config"] = routing(**CANARY, canary_weight=1.0)
    assert chooser.choose("digits").route == "canary"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("models:\n  digits:\n    canary_weight: 1.5\n", "r.yaml:3: models.digits.canary_weight"),
        ("models:\n  digits:\n    labels: {stable: '1'}\n", "models.digits.labels.stable"),
        ("models:\n  digits:\n    labels: {stable: 1.5}\n", "models.digits.labels.stable"),
        ("models:\n  digits:\n    labels: {'2': 1}\n", "models.digits.labels.2"),
        (
            "models:\n  digits:\n    labels: {stable: 1}\n    shadow: {version: 2, percent: 101}\n",
            "models.digits.shadow.percent",
        ),
        ("models:\n  digits:\n    canary_weight: 0.5\n", "needs a 'canary' label"),
        ("models:\n  digits:\n    labels: {canary: 2}\n", "needs a 'stable' label"),
        ("models:\n  digits:\n    shadow: {label: x, percent: 5}\n", "not one of the labels"),
        ("models:\n  digits:\n    shadow: {percent: 5}\n", "exactly one of label or version"),
        ("models:\n  digits:\n    wieght: 0.5\n", "r.yaml:3: models.digits.wieght: unknown key"),
        ("models: [1,\n", "r.yaml:2: invalid YAML"),
        ("", "empty routing file"),
        ("- 1\n", "r.yaml:1: <root>: expected mapping"),
    ],
)
def test_invalid_routing_is_refused_with_file_line_and_key(text: str, message: str) -> None:
    with pytest.raises(RoutingConfigError) as error:
        parse_routing(text, source="r.yaml")
    assert message in str(error.value)


def test_sticky_header_names_are_lower_cased() -> None:
    config = parse_routing("models:\n  digits:\n    sticky_header: X-User-Id\n")
    assert config.for_model("digits").sticky_header == "x-user-id"
    with pytest.raises(RoutingConfigError, match="sticky_header"):
        parse_routing("models:\n  digits:\n    sticky_header: 'bad header'\n")


FULL = RoutingConfig(
    models={
        "digits": ModelRouting(
            labels={"stable": 1, "canary": 2},
            canary_weight=0.25,
            sticky_header="x-user",
            shadow={"label": "canary", "percent": 5},
            failover=True,
            timeout_ms=300,
        ),
        "letters": ModelRouting(shadow={"version": 7, "percent": 1.5}),
    }
)


@pytest.mark.parametrize("name", ["routing.yaml", "routing.json"])
def test_routing_files_round_trip_in_yaml_and_json(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    write_routing(path, FULL)
    assert load_routing(path) == FULL
    assert [p.name for p in tmp_path.iterdir()] == [name]  # no temporary file left behind
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    if name.endswith(".json"):
        assert path.read_text().lstrip().startswith("{")


def test_load_routing_reports_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(RoutingConfigError, match="file not found"):
        load_routing(tmp_path / "absent.yaml")


def poll(watcher: RoutingWatcher) -> bool:
    """One look at the routing file, the one a running watcher takes every interval."""
    return asyncio.run(watcher.refresh())


def test_the_watcher_picks_up_a_new_config_once(tmp_path: Path) -> None:
    path = tmp_path / "routing.yaml"
    write_routing(path, routing(**CANARY, canary_weight=0.1))
    seen: list[RoutingConfig] = []
    watcher = RoutingWatcher(path, seen.append)
    assert poll(watcher) is True
    assert poll(watcher) is False  # unchanged content: no second notification
    write_routing(path, routing(**CANARY, canary_weight=0.1))
    assert poll(watcher) is False  # rewritten with the same content
    write_routing(path, routing(**CANARY, canary_weight=0.5))
    assert poll(watcher) is True
    assert [c.for_model("digits").canary_weight for c in seen] == [0.1, 0.5]
    assert watcher.current == seen[-1]


def test_the_watcher_keeps_the_last_good_config_over_a_bad_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "routing.yaml"
    good = routing(**CANARY, canary_weight=0.2)
    write_routing(path, good)
    seen: list[RoutingConfig] = []
    watcher = RoutingWatcher(path, seen.append)
    poll(watcher)
    with caplog.at_level(logging.ERROR, logger="serving.routing"):
        for broken in (
            "",
            "models:\n  digits:\n    labels: {stable: 1, can",
            "models: {d: {canary_weight: 3}}",
        ):
            path.write_text(broken)
            assert poll(watcher) is False
            assert watcher.current == good
            assert watcher.last_error is not None
        assert poll(watcher) is False  # the same bad file is not reported twice
    assert len([r for r in caplog.records if "last good config" in r.message]) == 3
    path.unlink()
    assert poll(watcher) is False
    assert watcher.current == good
    write_routing(path, good)
    assert poll(watcher) is False  # back to the config in use: nothing to announce
    assert watcher.last_error is None
    assert seen == [good]


def test_the_watcher_survives_a_failing_listener(tmp_path: Path) -> None:
    path = tmp_path / "routing.yaml"
    write_routing(path, routing(**CANARY))

    def broken(config: RoutingConfig) -> None:
        raise RuntimeError("listener bug")

    watcher = RoutingWatcher(path, broken)
    assert poll(watcher) is True
    assert watcher.current == routing(**CANARY)


def test_the_running_watcher_reloads_on_change(tmp_path: Path) -> None:
    path = tmp_path / "routing.json"
    write_routing(path, routing(**CANARY, canary_weight=0.0))

    async def body() -> RoutingConfig:
        changed: asyncio.Queue[RoutingConfig] = asyncio.Queue()
        watcher = RoutingWatcher(path, changed.put_nowait, interval=0.01)
        await watcher.start()
        assert (await changed.get()).for_model("digits").canary_weight == 0.0
        await asyncio.to_thread(write_routing, path, routing(**CANARY, canary_weight=0.75))
        try:
            return await asyncio.wait_for(changed.get(), 10)
        finally:
            await watcher.stop()

    assert asyncio.run(body()).for_model("digits").canary_weight == 0.75


def test_the_watcher_refuses_to_start_without_a_valid_file(tmp_path: Path) -> None:
    async def body() -> None:
        with pytest.raises(RoutingConfigError, match="cannot read"):
            await RoutingWatcher(tmp_path / "absent.yaml").start()
        (tmp_path / "bad.yaml").write_text("models: {d: {canary_weight: 2}}\n")
        with pytest.raises(RoutingConfigError, match="canary_weight"):
            await RoutingWatcher(tmp_path / "bad.yaml").start()

    asyncio.run(body())
