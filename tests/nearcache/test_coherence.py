"""The near cache on a single Redis: coherence, read-your-writes, and every event that must empty it."""

from __future__ import annotations

import asyncio
import multiprocessing
import random

import pytest

from kvstatus import AsyncStatusStore, KVPoll, NearCacheOptions, StatusStore
from kvstatus.errors import InvalidArgumentError, InvalidURLError
from tests.helpers.backends import fresh_namespace
from tests.nearcache.helpers import client_ids, eventually
from tests.servers import RedisServer

pytestmark = pytest.mark.real


def link(store: StatusStore):  # noqa: ANN201 - the single server's link
    return store.near_cache.links.links[""]


def test_a_missing_room_is_cached_and_another_writers_change_is_seen(cached: StatusStore, writer: StatusStore) -> None:
    assert cached.get(1) is None
    assert 1 in cached.near_cache.state.entries  # absent rooms are cached too
    writer.update_status(1, KVPoll.Bootstrapping)
    eventually(lambda: cached.get(1) == KVPoll.Bootstrapping)
    writer.update_status(1, KVPoll.Transferring)
    eventually(lambda: cached.check_status(1) == KVPoll.Transferring)
    writer.clear(1)
    eventually(lambda: cached.get(1) is None)
    with pytest.raises(KeyError):
        cached.check_status(1)


def test_hits_are_served_without_a_round_trip(
    cached: StatusStore, writer: StatusStore, redis_server: RedisServer
) -> None:
    writer.update_many({r: KVPoll.WaitingForInput for r in range(10)})
    raw = redis_server.client()
    assert cached.get_many(range(10)) == {r: KVPoll.WaitingForInput for r in range(10)}
    before = raw.info("commandstats").get("cmdstat_hgetall", {}).get("calls", 0)
    for _ in range(50):
        assert cached.get_many(range(10)) == {r: KVPoll.WaitingForInput for r in range(10)}
        assert cached.get(3) == KVPoll.WaitingForInput
    assert raw.info("commandstats").get("cmdstat_hgetall", {}).get("calls", 0) == before


def test_read_your_writes(url: str, namespace: str) -> None:
    with StatusStore.from_url(url, namespace=namespace, participant="p", near_cache=True) as store:
        for room in range(20):
            assert store.get(room) is None  # cached as absent
            store.update_status(room, KVPoll.Bootstrapping)
            assert store.check_status(room) == KVPoll.Bootstrapping  # no waiting: the write dropped it
            store.update_many({room: KVPoll.Transferring})
            assert store.get_many([room]) == {room: KVPoll.Transferring}
            store.record_failure(room, "boom") if store.update_status(room, KVPoll.Failed) else None
            view = store.room(room)
            assert view.participants["p"].status == KVPoll.Failed and view.participants["p"].reason == "boom"
            assert 0 < view.ttl_ms <= 600_000
            store.clear(room)
            assert store.get(room) is None and not store.room(room).exists


def test_room_view_counts_its_ttl_down(cached: StatusStore, writer: StatusStore) -> None:
    writer.update_status(5, KVPoll.Bootstrapping)
    first = cached.room(5).ttl_ms
    second = eventually(lambda: (ttl := cached.room(5).ttl_ms) < first and ttl)
    assert 0 < second < first


def test_an_expired_room_is_not_served(url: str, namespace: str, writer: StatusStore) -> None:
    with StatusStore.from_url(url, namespace=namespace, participant="w", ttl=0.3) as short:
        short.update_status(9, KVPoll.Bootstrapping)
    with StatusStore.from_url(url, namespace=namespace, participant="w", near_cache=True) as cached:
        assert cached.get(9) == KVPoll.Bootstrapping
        eventually(lambda: cached.get(9) is None, what="expired room dropped")


def test_flushdb_empties_the_cache(cached: StatusStore, writer: StatusStore, redis_server: RedisServer) -> None:
    writer.update_many({r: KVPoll.Transferring for r in range(30)})
    assert set(cached.get_many(range(30)).values()) == {KVPoll.Transferring}
    flushes = cached.near_cache.state.flushes
    redis_server.client().flushdb()
    eventually(lambda: (cached.near_cache.check(), cached.near_cache.state.flushes > flushes)[1])
    assert not cached.near_cache.state.entries
    assert cached.get_many(range(30)) == {r: None for r in range(30)}


@pytest.mark.parametrize("which", ["invalidation", "data"])
def test_a_killed_connection_empties_the_cache_and_coherence_resumes(
    which: str, cached: StatusStore, writer: StatusStore, redis_server: RedisServer
) -> None:
    raw = redis_server.client()
    writer.update_many({r: KVPoll.Bootstrapping for r in range(10)})
    assert cached.get_many(range(10)) == {r: KVPoll.Bootstrapping for r in range(10)}
    inval_id = link(cached).inval.client_id
    victim = inval_id if which == "invalidation" else client_ids(raw, redir=str(inval_id))[0]
    flushes = cached.near_cache.state.flushes
    raw.execute_command("CLIENT", "KILL", "ID", victim)
    eventually(lambda: (cached.near_cache.check(), cached.near_cache.state.flushes > flushes)[1])
    assert not cached.near_cache.state.entries
    writer.update_many({r: KVPoll.WaitingForInput for r in range(10)})  # nobody tracks these keys now
    assert cached.get_many(range(10)) == {r: KVPoll.WaitingForInput for r in range(10)}
    writer.update_status(3, KVPoll.Success)  # tracked again through the new link
    eventually(lambda: cached.get(3) == KVPoll.Success)


@pytest.mark.real
def test_a_server_restart_empties_the_cache() -> None:
    with RedisServer(extra_args=["--save", "", "--appendonly", "no"]) as server:
        namespace = fresh_namespace("nc")
        with (
            StatusStore.from_url(server.url, namespace=namespace, participant="w") as writer,
            StatusStore.from_url(server.url, namespace=namespace, participant="w", near_cache=True) as cached,
        ):
            writer.update_many({r: KVPoll.Transferring for r in range(10)})
            assert cached.get_many(range(10)) == {r: KVPoll.Transferring for r in range(10)}
            server.restart()  # no persistence: every room is gone
            assert cached.get_many(range(10)) == {r: None for r in range(10)}
            writer.update_status(4, KVPoll.Success)
            eventually(lambda: cached.get(4) == KVPoll.Success)


def test_the_liveness_ping_keeps_an_idle_cache_honest(url: str, namespace: str, writer: StatusStore) -> None:
    options = NearCacheOptions(max_staleness=0.05)
    with StatusStore.from_url(url, namespace=namespace, participant="w", near_cache=options) as cached:
        writer.update_status(1, KVPoll.Bootstrapping)
        assert cached.get(1) == KVPoll.Bootstrapping
        state = cached.near_cache.links
        opened = state.live_until  # no write since: only a PONG moves it on
        eventually(lambda: (cached.near_cache.check(), state.live_until > opened)[1], what="a PONG extended the link")
        confirmed = state.links[""].confirmed
        eventually(lambda: (cached.get(1), state.links[""].confirmed > confirmed)[1], what="a PONG confirmed")
        assert cached.get(1) == KVPoll.Bootstrapping and state.live_until > opened


def test_the_memory_bound_holds(url: str, namespace: str, writer: StatusStore) -> None:
    with StatusStore.from_url(
        url, namespace=namespace, participant="w", near_cache=NearCacheOptions(max_rooms=100)
    ) as cached:
        writer.update_many({r: KVPoll.Bootstrapping for r in range(300)})
        for start in range(0, 300, 50):
            cached.get_many(range(start, start + 50))
            cached.get(0)  # keep room 0 recently used
            assert len(cached.near_cache.state.entries) <= 100
        entries = cached.near_cache.state.entries
        assert 0 in entries and 299 in entries and 100 not in entries  # least recently used went first


def test_client_memory_per_room_is_as_documented(url: str, namespace: str, writer: StatusStore) -> None:
    import gc
    import tracemalloc

    from kvstatus.cachestate import CLIENT_BYTES_PER_ROOM

    rooms = list(range(10**18, 10**18 + 2000))  # the caller's ids (SGLang's size), made before the measurement
    writer.update_many({r: KVPoll.Transferring for r in rooms})
    with StatusStore.from_url(url, namespace=namespace, participant="w", near_cache=True) as cached:
        cached.get(0)
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        cached.get_many(rooms)
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        per_room = (after - before) / len(rooms)
        assert len(cached.near_cache.state.entries) == len(rooms) + 1  # and room 0, the warm-up read
        assert per_room <= CLIENT_BYTES_PER_ROOM, per_room


def _hammer(url: str, namespace: str, rooms: list[int], seed: int) -> None:
    """A writer process: every room goes Bootstrapping → WaitingForInput → Transferring → Success, interleaved."""
    rng = random.Random(seed)
    steps = [(room, status) for room in rooms for status in KVPoll if status != KVPoll.Failed]
    pending = {room: [s for r, s in steps if r == room] for room in rooms}
    with StatusStore.from_url(url, namespace=namespace, participant="w") as store:
        while pending:
            room = rng.choice(list(pending))
            store.update_status(room, pending[room].pop(0))
            if not pending[room]:
                del pending[room]


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_cached_reader_never_goes_back_in_time_and_sees_every_change(
    asynchronous: bool, url: str, namespace: str
) -> None:
    rooms = list(range(1000, 1128))
    order = {None: -1, **{s: int(s) for s in KVPoll}}
    seen: dict[int, int] = {room: -1 for room in rooms}
    regressions: list[tuple[int, int, int]] = []
    context = multiprocessing.get_context("spawn")
    process = context.Process(target=_hammer, args=(url, namespace, rooms, 7))

    def check(result: dict) -> bool:
        for room, status in result.items():
            value = order[status]
            if value < seen[room]:
                regressions.append((room, seen[room], value))
            seen[room] = max(seen[room], value)
        return all(v == int(KVPoll.Success) for v in seen.values())

    if not asynchronous:
        with StatusStore.from_url(url, namespace=namespace, participant="w", near_cache=True) as cached:
            check(cached.get_many(rooms))
            process.start()
            while process.is_alive():
                check(cached.get_many(rooms))
            process.join()
            assert process.exitcode == 0
            eventually(lambda: check(cached.get_many(rooms)), what="every room's final status")
            assert cached.near_cache.state.flushes == 1  # only the opening of the link: no spurious flush
    else:

        async def run() -> None:
            cached = AsyncStatusStore.from_url(url, namespace=namespace, participant="w", near_cache=True)
            try:
                check(await cached.get_many(rooms))
                process.start()
                while process.is_alive():
                    check(await cached.get_many(rooms))
                process.join()
                for _ in range(3000):
                    if check(await cached.get_many(rooms)):
                        break
                    await asyncio.sleep(0.005)
                assert check(await cached.get_many(rooms)), "every room's final status"
            finally:
                await cached.close()

        asyncio.run(run())
        assert process.exitcode == 0
    assert regressions == []


def test_async_cache_read_your_writes_and_invalidation(url: str, namespace: str, writer: StatusStore) -> None:
    async def run() -> None:
        async with AsyncStatusStore.from_url(url, namespace=namespace, participant="w", near_cache=True) as store:
            assert await store.get(1) is None
            await store.update_status(1, KVPoll.Bootstrapping)
            assert await store.check_status(1) == KVPoll.Bootstrapping
            writer.update_status(1, KVPoll.Transferring)
            for _ in range(3000):  # no await that yields to the loop is needed: the socket is read directly
                if await store.get(1) == KVPoll.Transferring:
                    break
            else:
                await asyncio.sleep(0.01)
                assert await store.get(1) == KVPoll.Transferring
            assert (await store.room(1)).participants["w"].status == KVPoll.Transferring
            assert await store.get_many([1, 2]) == {1: KVPoll.Transferring, 2: None}

    asyncio.run(run())


def test_the_near_cache_is_an_argument_not_a_url_option(url: str, namespace: str) -> None:
    with StatusStore.from_url(url, namespace=namespace, near_cache=NearCacheOptions(max_rooms=5)) as store:
        assert store.near_cache is not None and store.near_cache.state.options.max_rooms == 5
    with StatusStore.from_url(url, namespace=namespace) as store:
        assert store.near_cache is None  # from_url's default, as the constructor's
    for option in ("near_cache=true", "near_cache_size=7"):
        name = option.partition("=")[0]
        with pytest.raises(
            InvalidURLError, match=f"'{name}' is a store setting, not a connection option; pass near_cache="
        ):
            StatusStore.from_url(f"{url}?{option}", namespace=namespace)
    with pytest.raises(InvalidArgumentError, match="near cache size"):
        StatusStore.from_url(url, namespace=namespace, near_cache=NearCacheOptions(max_rooms=0))


def test_fakeredis_is_refused_clearly() -> None:
    import fakeredis

    with pytest.raises(InvalidArgumentError, match="CLIENT TRACKING"):
        StatusStore(fakeredis.FakeRedis(), namespace="x", near_cache=True)


def test_for_participant_shares_the_cache(cached: StatusStore, writer: StatusStore) -> None:
    other = cached.for_participant("p2")
    assert other.near_cache is cached.near_cache
    other.update_status(8, KVPoll.Bootstrapping)
    assert cached.room(8).participants["p2"].status == KVPoll.Bootstrapping


def test_bad_room_ids_are_refused_on_the_cached_path_too(cached: StatusStore, writer: StatusStore) -> None:
    from kvstatus.errors import InvalidRoomError

    writer.update_many({0: KVPoll.Bootstrapping, 1: KVPoll.Bootstrapping, 4: KVPoll.Bootstrapping})
    assert cached.get_many([0, 1, 4]) == {0: KVPoll.Bootstrapping, 1: KVPoll.Bootstrapping, 4: KVPoll.Bootstrapping}
    for bad in ([True], [1.0], [0, -1], ["1"]):
        with pytest.raises(InvalidRoomError):
            cached.get_many(bad)
    for bad in (True, 1.0, -1, 2**63):
        with pytest.raises(InvalidRoomError):
            cached.get(bad)
    with pytest.raises(InvalidArgumentError):
        cached.get_many("123")
