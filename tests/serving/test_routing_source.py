"""The routing source in one process: its table, its HTTP API, a replica's watch and cache,
and per-model writes to a shared routing file. Real sockets on loopback, no TensorFlow."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from contracts.yaml_config import ConfigError
from serving.admin_http import AdminAuth
from serving.config import load_config
from serving.errors import ServingError
from serving.routing import ModelRouting, RoutingConfig, load_routing, update_routing_file
from serving.routing_service import RoutingService
from serving.routing_source import RoutingSource
from serving.routing_store import RoutingStore
from serving.routing_sync import RoutingSourceConfig
from serving.routing_table import RevisionConflict, RoutingTable, load_table

pytestmark = pytest.mark.timeout(60)

TOKEN = "source-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
STABLE = ModelRouting(labels={"stable": 1})
CANARY = ModelRouting(labels={"stable": 1, "canary": 2}, canary_weight=0.1)
T = TypeVar("T")


def test_each_change_moves_the_revision_and_a_stale_revision_is_refused() -> None:
    table = RoutingTable().with_model("a", STABLE).with_model("b", STABLE)
    assert (table.revision, table.model_revision("a"), table.model_revision("b")) == (2, 1, 2)
    assert table.with_model("a", STABLE) is table  # a retried write is not a new revision
    changed = table.with_model("a", CANARY, if_match=1)
    assert changed.revision == 3 and changed.models["b"].revision == 2
    with pytest.raises(RevisionConflict, match="at revision 3, not 1") as conflict:
        changed.with_model("a", STABLE, if_match=1)
    assert conflict.value.current == 3
    with pytest.raises(RevisionConflict):
        changed.with_model("c", STABLE, if_match=5)  # 0 is "no entry yet"
    assert "a" not in changed.with_model("a", None).config().models


def test_the_source_persists_every_change_and_seeds_only_a_new_table(tmp_path: Path) -> None:
    path = tmp_path / "routing.json"
    seed = RoutingConfig(models={"digits": STABLE})

    async def body() -> None:
        source = RoutingSource.open(path, seed)
        assert source.table.config() == seed
        await source.set_model("digits", CANARY, if_match=1)

    asyncio.run(body())
    assert load_table(path).config().models["digits"] == CANARY
    reopened = RoutingSource.open(path, RoutingConfig())  # the seed does not undo a rollout
    assert reopened.table.revision == 2 and reopened.table.config().models["digits"] == CANARY


def with_service(tmp_path: Path, test: Callable[[TestClient, RoutingSource], Awaitable[T]]) -> T:
    async def body() -> T:
        source = RoutingSource.open(tmp_path / "routing.json")
        async with TestClient(TestServer(RoutingService(source, AdminAuth(TOKEN)).app())) as client:
            return await test(client, source)

    return asyncio.run(body())


def test_a_watch_waits_for_the_next_revision_and_names_the_replica(tmp_path: Path) -> None:
    async def test(client: TestClient, source: RoutingSource) -> None:
        now = await (await client.get("/v1/routing", headers=AUTH)).json()
        assert now == {"revision": 0, "models": {}}
        watch = asyncio.ensure_future(
            client.get(
                "/v1/routing",
                params={"after": "0", "wait": "30", "replica": "r1", "url": "http://r1:8501"},
                headers=AUTH,
            )
        )
        while not source.replicas():  # the watch has reached the source
            await asyncio.sleep(0.01)
        assert not watch.done()
        put = await client.put("/v1/routing/digits", json=STABLE.model_dump(), headers=AUTH)
        assert put.status == 200 and put.headers["ETag"] == '"1"'
        table = await (await asyncio.wait_for(watch, 10)).json()
        assert table["revision"] == 1 and table["models"]["digits"]["routing"]["labels"] == {
            "stable": 1
        }
        replicas = await (await client.get("/v1/replicas", headers=AUTH)).json()
        assert [(r["replica"], r["url"], r["revision"]) for r in replicas["replicas"]] == [
            ("r1", "http://r1:8501", 0)
        ]

    with_service(tmp_path, test)


def test_writes_are_compare_and_swap_and_bad_input_is_refused(tmp_path: Path) -> None:
    async def test(client: TestClient, source: RoutingSource) -> None:
        def put(body: Any, **headers: str) -> Any:
            return client.put("/v1/routing/digits", json=body, headers={**AUTH, **headers})

        assert (await put(STABLE.model_dump(), **{"If-Match": '"0"'})).status == 200
        stale = await put(CANARY.model_dump(), **{"If-Match": '"0"'})
        assert stale.status == 412 and (await stale.json())["revision"] == 1
        assert (await put(CANARY.model_dump(), **{"If-Match": '"1"'})).status == 200
        invalid = await put({"canary_weight": 2})
        assert invalid.status == 400 and "canary_weight" in (await invalid.json())["error"]
        assert (await put(STABLE.model_dump(), **{"If-Match": "soon"})).status == 400
        bad_wait = await client.get("/v1/routing", params={"wait": "-1"}, headers=AUTH)
        assert bad_wait.status == 400
        assert (await client.get("/v1/routing")).status == 401
        assert (
            await client.get("/v1/routing", headers={"Authorization": "Bearer x"})
        ).status == 403
        assert source.table.revision == 2 and source.table.config().models["digits"] == CANARY

    with_service(tmp_path, test)


def test_a_change_that_cannot_be_stored_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    async def test(client: TestClient, source: RoutingSource) -> None:
        await source.set_model("digits", STABLE)
        (tmp_path / "a-file").write_text("")
        source.path = tmp_path / "a-file" / "routing.json"  # its directory cannot exist
        answer = await client.put("/v1/routing/digits", json=CANARY.model_dump(), headers=AUTH)
        assert answer.status == 503
        assert "cannot write the routing table" in (await answer.json())["error"]
        current = await (await client.get("/v1/routing/digits", headers=AUTH)).json()
        assert (current["revision"], current["routing"]["labels"]) == (1, {"stable": 1})

    with_service(tmp_path, test)


class SourceThread:
    """The source's HTTP service on a loop thread of its own, at a fixed port."""

    def __init__(self, path: Path, port: int = 0) -> None:
        self.source = RoutingSource.open(path)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.runner = web.AppRunner(RoutingService(self.source, AdminAuth(TOKEN)).app())
        self.run(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", port)
        self.run(site.start())
        self.port = self.runner.addresses[0][1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def run(self, coroutine: Awaitable[T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(30)

    def close(self) -> None:
        self.run(self.source.close())
        self.run(self.runner.cleanup())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)


def test_a_replica_follows_the_source_and_starts_from_its_cache_when_it_is_away(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "cache.json"
    server = SourceThread(tmp_path / "routing.json")
    config = RoutingSourceConfig(url=server.url, cache_file=cache, watch_s=30, start_timeout_s=1)

    async def follow() -> None:
        store = RoutingStore(source=config, token=TOKEN)
        await store.start()
        try:
            await store.replace(RoutingConfig(models={"digits": CANARY}))  # via the source
            assert store.current().models["digits"] == CANARY and store.revision == 1
            assert store.status()["connected"] is True
        finally:
            await store.stop()

    asyncio.run(follow())
    server.close()
    assert load_table(cache).config().models["digits"] == CANARY

    async def restart_while_away() -> dict[str, object]:
        store = RoutingStore(source=config, token=TOKEN)
        await store.start()  # the source is down: the cache serves
        try:
            assert store.current().models["digits"] == CANARY
            async with asyncio.timeout(10):
                while store.status()["error"] is None:
                    await asyncio.sleep(0.01)
            with pytest.raises(ServingError, match="unreachable"):
                await store.refresh()
            return store.status()
        finally:
            await store.stop()

    status = asyncio.run(restart_while_away())
    assert status["connected"] is False and status["revision"] == 1

    cache.unlink()

    async def no_cache() -> None:
        with pytest.raises(Exception, match="no answer within 1s and no cached routing"):
            await RoutingStore(source=config, token=TOKEN).start()

    asyncio.run(no_cache())


def test_writers_sharing_a_routing_file_never_drop_each_others_models(tmp_path: Path) -> None:
    path = tmp_path / "routing.yaml"
    update_routing_file(path, {"a": STABLE, "b": STABLE})

    async def two_replicas() -> None:
        first, second = RoutingStore(path), RoutingStore(path)
        await first.start()
        await second.start()
        try:
            # Both read before either writes: a whole-file write would lose one change.
            a = RoutingConfig(models={**first.current().models, "a": CANARY})
            b = RoutingConfig(models={**second.current().models, "b": CANARY})
            await asyncio.gather(first.replace(a), second.replace(b))
        finally:
            await first.stop()
            await second.stop()

    asyncio.run(two_replicas())
    assert load_routing(path).models == {"a": CANARY, "b": CANARY}
    update_routing_file(path, {"a": None})
    assert set(json.loads(json.dumps(load_routing(path).model_dump()))["models"]) == {"b"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("routing_source: {url: 'ftp://x'}\nadmin: {token_env: T}\n", "expected http://host"),
        ("routing_source: {url: 'http://x:8600'}\n", "needs admin.token_env"),
        (
            "routing_file: r.yaml\nrouting_source: {url: 'http://x:8600'}\nadmin: {token_env: T}\n",
            "not both",
        ),
        ("routing_source: {url: 'http://x', watch_s: 0}\nadmin: {token_env: T}\n", "watch_s"),
    ],
)
def test_a_bad_routing_source_setting_names_the_file_and_key(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as error:
        load_config(path)
    assert str(path) in str(error.value)


def test_the_routing_cache_path_is_relative_to_gateway_yaml(tmp_path: Path) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(
        "routing_source: {url: 'http://x:8600/', cache_file: cache/r.json}\nadmin: {token_env: T}\n"
    )
    source = load_config(path).routing_source
    assert source.cache_file == tmp_path / "cache" / "r.json" and source.url == "http://x:8600"
