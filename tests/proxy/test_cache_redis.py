"""The caches in a real Redis (Debian's redis-server, a process on 127.0.0.1): shared by the
proxy's replicas, looked up beside the run, and never in a request's way when Redis is
stopped or frozen."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
from pathlib import Path

import pytest
import redis

from proxy import metrics
from tests.conftest import connected, redis_or_skip
from tests.proxy.conftest import GENEROUS_CACHE_MS
from tests.proxy.scripted import affine
from tests.proxy.test_cache import RESULT, cached
from tests.proxy.test_pipelines import body, call, parse_model, pipeline, post

GENEROUS = {"cache_timeout_ms": GENEROUS_CACHE_MS, "ready_timeout_ms": GENEROUS_CACHE_MS}
"""A store call, and a model's metadata (its keys' fingerprint), given time under load."""


def _slowly(fn):
    async def slow(inputs, deadline):
        await asyncio.sleep(0.3)
        return await fn(inputs, deadline)

    return slow


def errors(pipeline: str) -> float:
    return metrics.CACHE_LOOKUPS.labels(pipeline, "", "error")._value.get()


def entries(store: redis.Redis, pipeline: str) -> int:
    """A pipeline's entries in Redis (its doorkeeper's keys are not under its prefix)."""
    return len(store.keys(pipeline.encode() + b"\0*"))


async def written(store: redis.Redis, before: int, pipeline: str | None = None) -> None:
    """Until an entry is in Redis (one of `pipeline`'s, when named: beyond its `before`
    entries, else beyond `before` keys): entries are written in the background, after the
    answer."""
    count = store.dbsize if pipeline is None else lambda: entries(store, pipeline)
    for _ in range(500):
        if count() > before:
            return
        await asyncio.sleep(0.01)


async def test_replicas_share_their_answers(servers, make_client, redis_db) -> None:
    # Slower than a Redis GET however loaded the machine: the lookup beside the run must win
    # the race (a two-step run of quick models once finished first in CI: an honest miss).
    model = affine("plus1", 1, 1, delay_s=0.3)
    env = {"PARSE_URL": await servers(parse_model()), "MODELS_URL": await servers(model)}
    pipes = cached()
    # Generous: a lookup slower than its timeout counts as a miss (the suite loads the CPU).
    settings = {"cache_url": redis_db.url, **GENEROUS}
    store = redis.Redis.from_url(redis_db.url)
    before = store.dbsize()
    async with (
        make_client(pipes, env, **settings) as one,
        make_client(pipes, env, **settings) as two,
    ):
        first = await post(one, "p", body(11, 12))
        await written(store, before)
        second = await post(two, "p", body(11, 12))
        cleared = await two.delete("/v1/pipelines/p/cache")
        third = await post(one, "p", body(11, 12))
    assert first.headers["X-Cache"] == "miss" and second.headers["X-Cache"] == "hit"
    assert second.json()["result"] == first.json()["result"] == {"y": [12.0, 13.0]}
    assert cleared.json()["cleared"] >= 1 and third.headers["X-Cache"] == "miss"


async def test_a_hit_cancels_the_run_it_raced(servers, make_client, redis_db) -> None:
    slow = affine("plus1", 1, 1, delay_s=0.3)
    env = {"PARSE_URL": await servers(parse_model()), "MODELS_URL": await servers(slow)}
    store = redis.Redis.from_url(redis_db.url)
    before = store.dbsize()
    settings = {"cache_url": redis_db.url, **GENEROUS}
    async with make_client(cached(), env, **settings) as client:
        await post(client, "p", body(21))
        await written(store, before)
        again = await post(client, "p", body(21))
        await asyncio.sleep(0.05)
    assert again.headers["X-Cache"] == "hit" and again.json()["result"] == {"y": [22.0]}
    assert slow.calls - slow.cancelled == 1  # the raced run never finished at the model


async def test_a_stopped_or_frozen_redis_is_never_an_error(
    servers, make_client, tmp_path: Path
) -> None:
    own = redis_or_skip(tmp_path / "redis")
    model = affine("plus1", 1, 1)
    env = {"PARSE_URL": await servers(parse_model()), "MODELS_URL": await servers(model)}
    try:
        async with make_client(cached(), env, cache_url=own.url) as client:
            warm = await post(client, "p", body(31))
            os.kill(own.process.pid, signal.SIGSTOP)  # frozen: lookups time out
            before = errors("p")
            frozen = [await post(client, "p", body(32 + i)) for i in range(3)]
            os.kill(own.process.pid, signal.SIGCONT)
            own.stop()  # gone: connections refused
            stopped = [await post(client, "p", body(40 + i)) for i in range(3)]
    finally:
        os.kill(own.process.pid, signal.SIGCONT) if own.process.poll() is None else None
        own.stop()
    assert warm.status_code == 200
    for i, answer in enumerate(frozen):
        assert answer.status_code == 200 and answer.json()["result"] == {"y": [33.0 + i]}
    for i, answer in enumerate(stopped):
        assert answer.status_code == 200 and answer.json()["result"] == {"y": [41.0 + i]}
    assert errors("p") - before >= 6  # each lookup that failed was counted


async def test_the_data_cache_in_redis(servers, make_client, redis_db) -> None:
    # The lookup races the step it would spare: a step as quick as a Redis GET sometimes
    # finished first under load (an honest miss, and a flaky test); 0.3 s leaves the race
    # to the lookup.
    parse = parse_model()
    parse.fn = _slowly(parse.fn)
    env = {"PARSE_URL": await servers(parse), "MODELS_URL": await servers(affine("plus1", 1, 1))}
    pipes = cached()
    pipes["p"].pop("cache")
    pipes["p"]["steps"][0]["call"]["cache"] = True
    store = redis.Redis.from_url(redis_db.url)
    before = store.dbsize()
    async with make_client(pipes, env, cache_url=redis_db.url, **GENEROUS) as client:
        first = await post(client, "p", body(51))
        await written(store, before)
        second = await post(client, "p", body(51))
    assert first.json()["steps"][0]["cache"] == "miss"
    assert second.json()["steps"][0]["cache"] == "hit"
    assert second.json()["result"] == {"y": [52.0]}


async def test_a_restarted_redis_still_answers_every_lookup(tmp_path: Path) -> None:
    """The connections a restarted Redis closed are each retried on a new one: a restart
    costs no lookup (before, each pooled connection failed once, a miss and an error)."""
    from proxy.engine.cache.stores import RedisStore

    own = redis_or_skip(tmp_path / "redis", persistent=True)  # the entry outlives the restart
    store = RedisStore(own.url, GENEROUS_CACHE_MS / 1000)
    try:
        await store.put(b"k", b"answer", ttl_s=60)
        assert await asyncio.gather(*(store.get(b"k") for _ in range(8))) == [b"answer"] * 8
        own.restart()
        assert await asyncio.gather(*(store.get(b"k") for _ in range(8))) == [b"answer"] * 8
    finally:
        await store.close()
        own.stop()


async def test_lookups_beyond_the_pools_size_wait_for_a_connection(redis_db) -> None:
    # redis-py's pool refused its 101st call at once: more than 100 requests in flight made
    # their lookups fail (counted as errors: misses) and their entries go unwritten.
    from proxy.engine.cache.stores import RedisStore

    store = RedisStore(redis_db.url, timeout_s=GENEROUS_CACHE_MS / 1000)
    try:
        await store.put(b"test-pool:key", b"entry", 60)
        found = await asyncio.gather(*(store.get(b"test-pool:key") for _ in range(300)))
        assert found == [b"entry"] * 300
    finally:
        await store.close()


async def test_a_redis_that_keeps_failing_is_skipped_until_it_answers(
    tmp_path: Path, monkeypatch, caplog
) -> None:
    # A Redis refusing connections cost every request four attempts and two log lines: digits
    # at c=32 ran at 0.35-0.46x its rate without the cache, with 1.1 KB of log a request.
    from bench.mesh import free_port
    from proxy.engine.cache import stores

    monkeypatch.setattr(stores, "SKIP_S", 0.3)
    port = free_port()
    store = stores.RedisStore(f"redis://127.0.0.1:{port}/0", GENEROUS_CACHE_MS / 1000)
    own = None
    try:
        for _ in range(20):
            with contextlib.suppress(stores.StoreError):
                await store.get(b"k")
        assert store.skipping()
        with pytest.raises(stores.StoreError, match=r"skipped for 0\.3 s after 3 failures"):
            await store.put(b"k", b"v", 60)
        said = [r for r in caplog.records if r.getMessage().startswith("cache")]
        assert len(said) == 1  # said once, not once a call
        own = redis_or_skip(tmp_path / "redis", port=port)
        await asyncio.sleep(0.3)
        assert not store.skipping()
        await store.put(b"k", b"v", 60)
        assert await store.get(b"k") == b"v" and not store.skipping()
        assert "redis answers again" in caplog.text
    finally:
        await store.close()
        if own is not None:
            own.stop()


async def test_admitted_on_second_sighting_in_redis(servers, make_client, redis_db) -> None:
    """`admit: second` with Redis: the first answer is not written (its key only
    remembered), the second is, the third request is a hit."""
    model = affine("plus1", 1, 1, delay_s=0.3)  # slower than a GET: the lookup wins its race
    env = {"PARSE_URL": await servers(parse_model()), "MODELS_URL": await servers(model)}
    pipes = {"r": pipeline([call("a", "plus1", "parse")], RESULT, cache={"admit": "second"})}
    settings = {"cache_url": redis_db.url, **GENEROUS}
    store = redis.Redis.from_url(redis_db.url)
    unadmitted = metrics.CACHE_UNADMITTED.labels("r", "")
    before, refused = entries(store, "r"), unadmitted._value.get()
    async with make_client(pipes, env, **settings) as client:
        first = await post(client, "r", body(31))
        second = await post(client, "r", body(31))
        await written(store, before, "r")
        third = await post(client, "r", body(31))
    assert [r.headers["X-Cache"] for r in (first, second, third)] == ["miss", "miss", "hit"]
    assert [r.json()["result"] for r in (first, second, third)] == [{"y": [32.0]}] * 3
    assert unadmitted._value.get() - refused == 1
    assert entries(store, "r") - before == 1


async def test_replicas_share_their_sightings(servers, make_client, redis_db) -> None:
    """The doorkeeper lives in Redis with the entries: a request seen by one replica and
    sent again to another is kept there, and the first replica answers its third sending
    from the cache (with a doorkeeper per process, the second replica would have refused
    it, and the third sending would be computed again)."""
    model = affine("plus1", 1, 1, delay_s=0.3)
    env = {"PARSE_URL": await servers(parse_model()), "MODELS_URL": await servers(model)}
    pipes = {"s": pipeline([call("a", "plus1", "parse")], RESULT, cache={"admit": "second"})}
    settings = {"cache_url": redis_db.url, **GENEROUS}
    store = redis.Redis.from_url(redis_db.url)
    before = entries(store, "s")
    async with (
        make_client(pipes, env, **settings) as one,
        make_client(pipes, env, **settings) as two,
    ):
        first = await post(one, "s", body(41))
        assert entries(store, "s") == before  # remembered, not kept
        second = await post(two, "s", body(41))
        await written(store, before, "s")
        third = await post(one, "s", body(41))
    assert [r.headers["X-Cache"] for r in (first, second, third)] == ["miss", "miss", "hit"]
    assert [r.json()["result"] for r in (first, second, third)] == [{"y": [42.0]}] * 3
    assert entries(store, "s") - before == 1


async def test_the_shared_doorkeeper_forgets_in_generations(redis_db) -> None:
    """In Redis as in process: a key seen is remembered while fewer than a generation of
    new keys come after it, then forgotten; its bits never grow past their bound."""
    from proxy.engine.cache.doorkeeper import SharedDoorkeeper
    from proxy.engine.cache.stores import RedisStore

    store = RedisStore(redis_db.url, timeout_s=GENEROUS_CACHE_MS / 1000)
    door = SharedDoorkeeper(b"\0doorkeeper\0test-generations\0", keys=64)
    plain = redis.Redis.from_url(redis_db.url)
    plain.delete(*door.names)
    keys = [b"g\0" + hashlib.sha256(str(i).encode()).digest() for i in range(400)]
    try:
        assert await store.get_seen(keys[0], door) == (None, False)
        assert await store.get_seen(keys[0], door) == (None, True)
        for key in keys[1:64]:  # the first generation filled: keys[0] now in the older one
            await store.get_seen(key, door)
        assert await store.get_seen(keys[0], door) == (None, True)
        fresh = [(await store.get_seen(key, door))[1] for key in keys[64:400]]
        assert sum(fresh) <= 0.05 * len(fresh)  # new keys let in as if seen: a few at most
        assert await store.get_seen(keys[0], door) == (None, False)  # two generations on
        assert max(plain.strlen(name) for name in door.names[:2]) <= 64 * 16 // 8
        await store.put(keys[1], b"entry", ttl_s=60)
        assert await store.get_seen(keys[1], door) == (b"entry", True)
    finally:
        plain.delete(*door.names, keys[1])
        await store.close()


async def test_a_sighting_answered_after_the_run_still_decides(
    servers, make_client, redis_db, monkeypatch
) -> None:
    """A lookup slower than the run is not dropped when the doorkeeper is in Redis: its
    answer (seen or not) comes after the request's, and decides the background write."""
    from proxy.engine.cache.stores import RedisStore

    get_seen = RedisStore.get_seen

    async def slow_get_seen(self, key, doorkeeper):
        await asyncio.sleep(0.3)
        return await get_seen(self, key, doorkeeper)

    monkeypatch.setattr(RedisStore, "get_seen", slow_get_seen)
    model = affine("plus1", 1, 1)  # quick: the run ends before the lookup answers
    env = {"PARSE_URL": await servers(parse_model()), "MODELS_URL": await servers(model)}
    pipes = {"t": pipeline([call("a", "plus1", "parse")], RESULT, cache={"admit": "second"})}
    settings = {"cache_url": redis_db.url, **GENEROUS}
    store = redis.Redis.from_url(redis_db.url)
    before = entries(store, "t")
    unadmitted = metrics.CACHE_UNADMITTED.labels("t", "")
    refused = unadmitted._value.get()
    async with make_client(pipes, env, **settings) as client:
        first = await post(client, "t", body(51))
        await asyncio.sleep(0.6)  # its lookup has answered: not seen
        after_first = entries(store, "t")
        second = await post(client, "t", body(51))
        await written(store, before, "t")
    assert [r.headers["X-Cache"] for r in (first, second)] == ["miss", "miss"]
    assert after_first == before and unadmitted._value.get() - refused == 1
    assert entries(store, "t") - before == 1


@contextlib.contextmanager
def full_redis(tmp_path: Path, stored: bytes):
    """A Redis holding `stored`, then full under `noeviction` (every write refused), and the
    proxy's store of it."""
    from proxy.engine.cache.stores import RedisStore

    own = redis_or_skip(tmp_path / "redis")
    plain = redis.Redis.from_url(own.url)
    plain.set(stored, b"entry", px=60_000)
    plain.config_set("maxmemory-policy", "noeviction")
    plain.config_set("maxmemory", plain.info("memory")["used_memory"])
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        plain.set(b"filler", b"x" * 100_000)  # full: writes are refused
    try:
        yield plain, RedisStore(own.url, GENEROUS_CACHE_MS / 1000)
    finally:
        own.stop()


async def test_a_redis_refusing_writes_still_serves_hits_to_a_doorkeeper(tmp_path: Path) -> None:
    """A full Redis under `noeviction` refuses the doorkeeper's SETBIT: the lookup still
    answers (a stored entry found, a new key a miss, not remembered), and the cache is not
    skipped as failing."""
    from proxy.engine.cache.doorkeeper import SharedDoorkeeper

    door = SharedDoorkeeper(b"\0doorkeeper\0full\0", keys=1024)
    stored = b"full\0" + hashlib.sha256(b"stored").digest()
    new = b"full\0" + hashlib.sha256(b"new").digest()
    with full_redis(tmp_path, stored) as (plain, store):
        try:
            for _ in range(4):  # more than the failures after which a store is skipped
                assert await store.get_seen(new, door) == (None, False)
            assert await store.get_seen(stored, door) == (b"entry", True)
            assert not store.skipping() and plain.exists(door.names[0]) == 0
        finally:
            await store.close()


async def test_a_redis_refusing_writes_still_serves_hits(tmp_path: Path) -> None:
    """`admit: first` on a full Redis under `noeviction`: every write is refused (an error
    for the write), yet Redis answers, so it is not skipped as failing: lookups still serve
    its hits (once, four refused writes tripped it, and hits went unanswered)."""
    from proxy.engine.cache.stores import StoreError

    stored = b"full\0" + hashlib.sha256(b"stored").digest()
    with full_redis(tmp_path, stored) as (_, store):
        try:
            for i in range(4):  # more than the failures after which a store is skipped
                with pytest.raises(StoreError, match="OutOfMemoryError"):
                    await store.put(b"full\0%d" % i, b"x" * 1000, ttl_s=60)
            assert not store.skipping() and await store.get(stored) == b"entry"
        finally:
            await store.close()


async def test_a_write_under_way_is_finished_before_the_proxy_stops(
    servers, make_client, redis_db, monkeypatch
) -> None:
    """An answer computed just before the proxy stops is still kept (a rolling restart loses
    no entry), and its write uses no connection opened after the store closed: such a
    connection is never closed (a leaked socket, once reported in an unrelated test)."""
    from proxy.engine.cache.stores import RedisStore

    put, close, closed = RedisStore.put, RedisStore.close, []

    async def slow_put(self, key, value, ttl_s):
        await asyncio.sleep(0.3)
        await put(self, key, value, ttl_s)

    async def close_seen(self):
        closed.append(self)
        await close(self)

    monkeypatch.setattr(RedisStore, "put", slow_put)
    monkeypatch.setattr(RedisStore, "close", close_seen)
    env = {
        "PARSE_URL": await servers(parse_model()),
        "MODELS_URL": await servers(affine("plus1", 1, 1)),
    }
    settings = {"cache_url": redis_db.url, **GENEROUS}
    store = redis.Redis.from_url(redis_db.url)
    before = entries(store, "p")
    async with make_client(cached(), env, **settings) as client:
        answer = await post(client, "p", body(61))
    assert answer.headers["X-Cache"] == "miss" and answer.json()["result"] == {"y": [62.0]}
    assert entries(store, "p") - before == 1  # written before the proxy stopped
    await asyncio.sleep(0.5)  # what a write started after the close would have needed
    assert closed and connected(closed[0]._redis) == 0
