"""Task IO scopes: per-task read cache, singleflight, write invalidation, stats, the registry.

Most scenarios use :class:`GateBackend`, a backend registered through the
registry whose calls stay open until the test answers them (so concurrency is
exact); the rest run the real SQLite table store behind a scope.
"""

from __future__ import annotations

import asyncio
import gc
from typing import Any
from unittest import mock

import pytest
from io_support import answer, ok, payload, run

from blockx.wire import keys
from blockx.worker.io.backend import IORequestError, PreparedRequest, Reply
from blockx.worker.io.cache import READ_CACHE_FIRST_ENTRIES, ReadCache, request_key
from blockx.worker.io.config import IOConfigError, load_io_config
from blockx.worker.io.handler import IOResult
from blockx.worker.io.registry import BackendRegistry, IOSubsystem, default_registry
from blockx.worker.io.scope import _Flight
from blockx.worker.io.stats import IOStats

R, W, C = keys.IO_READ, keys.IO_WRITE, keys.IO_CAPABILITY


class GateBackend:
    """Every call waits in ``self.open`` until the test answers it."""

    name = "gate"

    def __init__(self) -> None:
        self.open: list[tuple[str, Any, asyncio.Future[Reply]]] = []
        self.calls = 0
        self.closed = False

    def prepare(
        self, io_kind: str, operation: str, params: Any, sidecar: bytes | None
    ) -> PreparedRequest:
        if operation == "refuse":
            raise IORequestError("gate refuse: not today")
        params = params or {}
        return PreparedRequest(
            operation, params, domain=params.get("table"), cacheable=params.get("cacheable", True)
        )

    def execute(self, request: PreparedRequest) -> asyncio.Future[Reply]:
        self.calls += 1
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self.open.append((request.operation, request.body, future))
        return future

    def release(self, result: Any = "ok", *, error: Reply | None = None) -> None:
        """Answer every open call (a cancelled one is skipped, as a backend must)."""
        calls, self.open = self.open, []
        for operation, body, future in calls:
            if future.done():
                continue
            reply = (
                error
                if error is not None
                else Reply({"op": operation, "body": body, "result": result})
            )
            future.set_result(reply)

    async def close(self) -> None:
        self.closed = True


def subsystem(gate: GateBackend, **config: Any) -> IOSubsystem:
    registry = default_registry()
    registry.register("gate", gate)
    return IOSubsystem(load_io_config(config, env={}), registry)


def test_identical_concurrent_reads_make_one_backend_call() -> None:
    gate = GateBackend()

    async def main() -> None:
        io = subsystem(gate)
        scope = io.task_scope("t1")
        params = {"table": "prices", "k": 1}
        pending = [
            scope.handle_io("t1", f"c{i}", payload("gate", "get", params), None) for i in range(50)
        ]
        assert gate.calls == 1
        # One backend call; each waiter has a future of its own (its cancel is its own).
        assert len({id(p) for p in pending}) == 50
        gate.release("v")
        results = [await answer(p) for p in pending]
        assert {ok(r)["result"] for r in results} == {"v"}
        # later: a cache hit, answered at once
        hit = scope.handle_io(
            "t1", "c99", payload("gate", "get", {"k": 1, "table": "prices"}), None
        )
        assert type(hit) is IOResult and hit.budget_used_ms == 0
        assert ok(hit)["result"] == "v"
        assert gate.calls == 1
        op = scope.stats.operation("gate", "get")
        assert (op.requests, op.backend_calls, op.singleflight_joins, op.cache_hits) == (
            51,
            1,
            49,
            1,
        )
        await io.close()
        assert gate.closed

    run(main())


def test_different_params_and_cache_keys_are_different_reads() -> None:
    gate = GateBackend()

    async def main() -> None:
        io = subsystem(gate)
        scope = io.task_scope("t")
        scope.handle_io("t", "a", payload("gate", "get", {"k": 1}), None)
        scope.handle_io("t", "b", payload("gate", "get", {"k": 2}), None)
        scope.handle_io("t", "c", payload("gate", "other", {"k": 1}), None)
        # the executor's cacheKey wins over params: equal keys share one call
        scope.handle_io("t", "d", payload("gate", "get", {"k": 3}, cache_key="K"), None)
        scope.handle_io("t", "e", payload("gate", "get", {"k": 4}, cache_key="K"), None)
        # a sidecar is keyed by its bytes
        scope.handle_io("t", "f", payload("gate", "get"), b"\x00raw")
        scope.handle_io("t", "g", payload("gate", "get"), b"\x00raw")
        assert gate.calls == 5
        gate.release()
        await io.close()

    run(main())


def test_separate_tasks_do_not_share_cache_or_flights() -> None:
    gate = GateBackend()

    async def main() -> None:
        io = subsystem(gate)
        one, two = io.task_scope("one"), io.task_scope("two")
        p = payload("gate", "get", {"k": 1})
        first = one.handle_io("one", "a", p, None)
        second = two.handle_io("two", "a", p, None)
        assert gate.calls == 2 and first is not second
        gate.release()
        await answer(first)
        await answer(second)
        assert type(one.handle_io("one", "b", p, None)) is IOResult
        three = io.task_scope("three")
        third = three.handle_io("three", "b", p, None)
        assert type(third) is not IOResult
        assert gate.calls == 3
        gate.release()
        await answer(third)
        # the subsystem's stats add up the three scopes
        assert io.stats.operation("gate", "get").backend_calls == 3
        assert io.stats.operation("gate", "get").cache_hits == 1
        await io.close()

    run(main())


def test_a_write_invalidates_the_tasks_reads_of_that_table_only() -> None:
    gate = GateBackend()

    async def main() -> None:
        io = subsystem(gate)
        scope = io.task_scope("t")
        prices = payload("gate", "get", {"table": "prices"})
        tokens = payload("gate", "get", {"table": "tokens"})
        for p in (prices, tokens):
            pending = scope.handle_io("t", "c", p, None)
            gate.release("old")
            await answer(pending)
        assert len(scope.cache) == 2
        write = scope.handle_io(
            "t", "w", payload("gate", "put", {"table": "prices"}, io_kind=W), None
        )
        # The write's start made the prices entry stale (it goes when a lookup finds it).
        assert scope.cache.get(request_key("gate", "get", {"table": "prices"}, None, None)) is None
        assert len(scope.cache) == 1
        gate.release()
        await answer(write)
        assert type(scope.handle_io("t", "c", tokens, None)) is IOResult  # still cached
        again = scope.handle_io("t", "c", prices, None)
        assert type(again) is not IOResult  # a miss: goes to the backend
        gate.release("new")
        assert ok(await answer(again))["result"] == "new"
        await io.close()

    run(main())


def test_reads_overlapping_a_write_are_not_cached_nor_joined() -> None:
    gate = GateBackend()

    async def main() -> None:
        io = subsystem(gate)
        scope = io.task_scope("t")
        read = payload("gate", "get", {"table": "prices"})
        before = scope.handle_io("t", "r1", read, None)  # in flight when the write starts
        write = scope.handle_io(
            "t", "w", payload("gate", "put", {"table": "prices"}, io_kind=W), None
        )
        after = scope.handle_io("t", "r2", read, None)  # must not join r1
        assert after is not before and gate.calls == 3
        during = scope.handle_io("t", "r3", read, None)  # joins r2 (same generation)
        assert during is not after and gate.calls == 3
        gate.release()
        for p in (before, write, after):
            await answer(p)
        assert len(scope.cache) == 0  # everything overlapped the write
        fresh = scope.handle_io("t", "r4", read, None)
        gate.release()
        await answer(fresh)
        assert len(scope.cache) == 1
        await io.close()

    run(main())


def test_errors_are_shared_by_joiners_but_never_cached() -> None:
    gate = GateBackend()

    async def main() -> None:
        io = subsystem(gate)
        scope = io.task_scope("t")
        p = payload("gate", "get", {"k": 1})
        a = scope.handle_io("t", "a", p, None)
        b = scope.handle_io("t", "b", p, None)
        gate.release(error=Reply.failure("node down", retryable=True))
        for pending in (a, b):
            result = await answer(pending)
            assert result.error is not None and result.error.retryable
            assert result.error.message == "node down"
        c = scope.handle_io("t", "c", p, None)
        assert type(c) is not IOResult and gate.calls == 2
        gate.release()
        await answer(c)
        op = scope.stats.operation("gate", "get")
        assert op.errors == 1 and op.backend_calls == 2
        await io.close()

    run(main())


def test_refusals_unknown_backends_and_bad_io_kinds_answer_at_once() -> None:
    gate = GateBackend()

    async def main() -> None:
        io = subsystem(gate)
        scope = io.task_scope("t")
        refused = scope.handle_io("t", "a", payload("gate", "refuse", {}), None)
        assert type(refused) is IOResult and refused.error is not None
        assert refused.error.message == "gate refuse: not today"
        unknown = scope.handle_io("t", "a", payload("nope", "get", {}), None)
        assert type(unknown) is IOResult and unknown.error is not None
        assert "unknown IO backend 'nope'" in unknown.error.message
        assert "'blockdb', 'gate', 'http', 'rpc'" in unknown.error.message
        bad = scope.handle_io("t", "a", {**payload("gate", "get", {}), "ioKind": "peek"}, None)
        assert type(bad) is IOResult and "ioKind must be" in bad.error.message  # type: ignore[union-attr]
        assert gate.calls == 0
        assert scope.stats.operation("gate", "refuse").rejected == 1
        await io.close()

    run(main())


def test_uncacheable_reads_are_still_deduplicated() -> None:
    gate = GateBackend()

    async def main() -> None:
        io = subsystem(gate)
        scope = io.task_scope("t")
        p = payload("gate", "get", {"cacheable": False})
        a = scope.handle_io("t", "a", p, None)
        b = scope.handle_io("t", "b", p, None)
        assert gate.calls == 1 and scope.stats.operation("gate", "get").singleflight_joins == 1
        gate.release()
        assert await answer(a) == await answer(b)
        assert len(scope.cache) == 0
        io.task_scope("x")
        await io.close()

    run(main())


def test_capability_calls_are_cached_only_with_a_cache_key() -> None:
    gate = GateBackend()

    async def main() -> None:
        io = subsystem(gate)
        scope = io.task_scope("t")
        plain = payload("gate", "sign", {"m": 1}, io_kind=C)
        a = scope.handle_io("t", "a", plain, None)
        b = scope.handle_io("t", "b", plain, None)
        assert a is not b and gate.calls == 2
        keyed = payload("gate", "sign", {"m": 1}, io_kind=C, cache_key="sig-1")
        c = scope.handle_io("t", "c", keyed, None)
        d = scope.handle_io("t", "d", keyed, None)
        assert gate.calls == 3 and scope.stats.operation("gate", "sign").singleflight_joins == 1
        gate.release()
        assert await answer(c) == await answer(d)
        assert type(scope.handle_io("t", "e", keyed, None)) is IOResult
        await io.close()

    run(main())


def test_the_cache_is_bounded_by_entries_and_bytes() -> None:
    # Keys are what request_key makes (a str; a tuple with sidecar bytes).
    cache = ReadCache(max_entries=3, max_bytes=10_000)
    answer_ = IOResult(result="x")
    for i in range(5):
        assert cache.put(f"k{i}", answer_, "b", "d", cache.generation("b", "d"), 10)
    assert len(cache) == 3 and cache.evictions == 2
    assert cache.get("k0") is None and cache.get("k4") is answer_
    # least recently used goes first: k2 was not touched, k3 and k4 were
    cache.get("k3")
    cache.put("k5", answer_, "b", "d", cache.generation("b", "d"), 10)
    assert cache.get("k2") is None and cache.get("k3") is answer_

    small = ReadCache(max_entries=100, max_bytes=1000)
    for i in range(20):
        small.put(f"k{i}", answer_, "b", None, small.generation("b", None), 100)
    assert small.size_bytes <= 1000 and len(small) < 20
    assert not small.put("huge", answer_, "b", None, small.generation("b", None), 5000)
    off = ReadCache(max_entries=0, max_bytes=1000)
    assert not off.put("k", answer_, "b", None, off.generation("b", None), 1)
    # a stale generation is refused; invalidation drops by domain
    gen = small.generation("b", "t1")
    small.invalidate("b", "t1")
    assert not small.put("late", answer_, "b", "t1", gen, 1)


def test_the_cache_keeps_its_first_bound_until_the_task_repeats_a_read() -> None:
    answer_ = IOResult(result="x")
    cache = ReadCache(max_entries=10_000, max_bytes=10_000_000)
    n = READ_CACHE_FIRST_ENTRIES + 100
    for i in range(n):
        assert cache.put(f"k{i}", answer_, "b", "d", cache.generation("b", "d"), 10)
    assert len(cache) == READ_CACHE_FIRST_ENTRIES and not cache.grown
    assert cache.evictions == 100
    assert cache.get(f"k{n - 1}") is answer_ and cache.grown  # a hit: the full bound
    for i in range(n, 3000):
        cache.put(f"k{i}", answer_, "b", "d", cache.generation("b", "d"), 10)
    assert len(cache) == 3000 - 100 and cache.evictions == 100
    # A bound below the first one is the bound from the start.
    small = ReadCache(max_entries=3, max_bytes=10_000)
    assert small.grown and "3 of 3" in repr(small)


def test_a_read_joining_an_equal_one_in_flight_grows_the_cache() -> None:
    gate = GateBackend()

    async def main() -> None:
        io = subsystem(gate)
        scope = io.task_scope("t")
        p = payload("gate", "get", {})
        assert not scope._cache.grown
        a = scope.handle_io("t", "a", p, None)
        assert not scope._cache.grown
        b = scope.handle_io("t", "b", p, None)
        assert scope._cache.grown and gate.calls == 1
        gate.release()
        assert await answer(a) == await answer(b)
        await io.close()

    run(main())


def test_a_disabled_cache_still_joins_identical_reads() -> None:
    gate = GateBackend()

    async def main() -> None:
        io = subsystem(gate, cache_max_entries=0)
        scope = io.task_scope("t")
        p = payload("gate", "get", {})
        a = scope.handle_io("t", "a", p, None)
        b = scope.handle_io("t", "b", p, None)
        assert gate.calls == 1
        gate.release()
        assert await answer(a) == await answer(b)
        assert type(scope.handle_io("t", "c", p, None)) is not IOResult
        gate.release()
        await io.close()

    run(main())


def test_the_subsystem_routes_by_task_id_and_bounds_its_scopes() -> None:
    gate = GateBackend()

    async def main() -> None:
        io = subsystem(gate, max_task_scopes=2)
        p = payload("gate", "get", {})
        for task in ("a", "b", "a", "c"):
            pending = io.handle_io(task, "x", p, None)
            if type(pending) is not IOResult:
                gate.release()
                await answer(pending)
        assert gate.calls == 3  # a's second read was a hit
        assert io.scope_of("b") is None  # least recently used, dropped
        assert io.scope_of("a") is not None and io.scope_of("c") is not None
        io.end_task("a")
        assert io.scope_of("a") is None
        assert io.stats.operation("gate", "get").requests == 4
        await io.close()
        closed = io.handle_io("new", "x", p, None)
        assert type(closed) is IOResult and closed.error is not None

    run(main())


def test_a_backend_that_cannot_be_built_answers_a_clear_error() -> None:
    registry = BackendRegistry()

    def broken(_config: Any) -> Any:
        raise ValueError("no credentials")

    registry.register_factory("vault", broken)

    async def main() -> None:
        io = IOSubsystem(load_io_config({}, env={}), registry)
        scope = io.task_scope("t")
        result = scope.handle_io("t", "a", payload("vault", "get", {}), None)
        assert type(result) is IOResult and result.error is not None
        assert result.error.message == "IO backend 'vault' could not be set up: no credentials"
        await io.close()

    run(main())


def test_registry_rules() -> None:
    registry = BackendRegistry()
    registry.register("gate", GateBackend())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="already registered"):
        registry.register("gate", GateBackend())  # type: ignore[arg-type]
    registry.register("gate", GateBackend(), replace=True)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="lacks name/prepare/execute/close"):
        registry.register("x", object())  # type: ignore[arg-type]
    assert default_registry().names() == ["blockdb", "http", "rpc"]


def test_request_keys_are_canonical() -> None:
    a = request_key("b", "op", {"x": 1, "y": [1, 2]}, None, None)
    b = request_key("b", "op", {"y": [1, 2], "x": 1}, None, None)
    assert a == b
    assert request_key("b", "op", {"v": 2**100}, None, None) != request_key(
        "b", "op", {"v": 2**100 + 1}, None, None
    )
    assert request_key("b", "op", None, "k", None) != request_key("b", "op", "k", None, None)


def test_stats_percentiles_and_table() -> None:
    stats = IOStats()
    op = stats.operation("rpc", "eth_call")
    for ms in range(1, 101):
        op.record_call(ms / 1000, failed=ms % 10 == 0)
    op.record_cache_hit()
    op.record_join()
    assert op.backend_calls == 100 and op.errors == 10 and op.requests == 102
    assert 45 <= op.percentile_ms(0.5) <= 56
    assert 88 <= op.percentile_ms(0.95) <= 100
    assert op.max_ms == pytest.approx(100)
    table = stats.format_table()
    assert "rpc/eth_call" in table.splitlines()[1]
    assert stats.as_dict()["totals"]["cache_hits"] == 1
    assert IOStats().format_table() == ""


def test_sqlite_reads_through_a_scope_are_cached_and_writes_invalidate(tmp_path: Any) -> None:
    config = load_io_config({"blockdb": {"sqlite_path": str(tmp_path / "s.sqlite3")}}, env={})

    async def main() -> None:
        async with IOSubsystem(config) as io:
            scope = io.task_scope("t")
            get = payload("blockdb", "get_row", {"table": "prices", "key": "eth"})
            put = payload(
                "blockdb",
                "upsert_rows",
                {"table": "prices", "rows": [{"key": "eth", "usd": 2}]},
                io_kind=W,
            )
            assert ok(await answer(scope.handle_io("t", "a", get, None))) is None
            assert type(scope.handle_io("t", "a", get, None)) is IOResult  # cached None
            assert ok(await answer(scope.handle_io("t", "w", put, None))) == 1
            assert ok(await answer(scope.handle_io("t", "a", get, None))) == {
                "key": "eth",
                "usd": 2,
            }
            stats = scope.stats.operation("blockdb", "get_row")
            assert (stats.backend_calls, stats.cache_hits) == (2, 1)

    run(main())


def test_config_errors_name_the_knob() -> None:
    with pytest.raises(IOConfigError) as caught:
        load_io_config(
            {
                "cache_max_entries": -1,
                "blockdb": {"engine": "mysql"},
                "rpc": {"endpoints": {"eth": ["ftp://x"]}},
                "nope": 1,
            },
            env={},
        )
    text = str(caught.value)
    assert "io.nope: unknown knob" in text
    with pytest.raises(IOConfigError, match=r"engine='postgres' needs io\.blockdb\.postgres_dsn"):
        load_io_config({"blockdb": {"engine": "postgres"}}, env={})
    with pytest.raises(IOConfigError, match="not an http"):
        load_io_config({"rpc": {"endpoints": {"eth": ["ftp://x"]}}}, env={})
    config = load_io_config(
        {},
        env={
            "RPC_ENDPOINTS": "eth=http://a:1,http://b:2;arb=http://c",
            "IO_CACHE_MAX_BYTES": "1000",
            "BLOCKDB_POSTGRES_DSN": "postgresql://x@y/z",
        },
    )
    assert config.rpc.endpoints == {"eth": ("http://a:1", "http://b:2"), "arb": ("http://c",)}
    assert config.cache_max_bytes == 1000
    assert config.blockdb.effective_engine == "postgres"
    assert load_io_config({"data_dir": "/d"}, env={}).sqlite_path == "/d/blockdb.sqlite3"


def test_closing_a_scope_cancels_its_backend_calls_still_running() -> None:
    """The task is over: a read or write still at its backend (an RPC request retrying a node
    that does not answer, a wait the executor already cut off) is cancelled, not left to
    run through every try. Its waiters, if any, get a retryable error."""
    gate = GateBackend()

    async def main() -> None:
        io = subsystem(gate)
        scope = io.task_scope("t1")
        read = scope.handle_io("t1", "c1", payload("gate", "get", {"table": "a"}), None)
        write = scope.handle_io("t1", "c2", payload("gate", "put", {"table": "b"}, io_kind=W), None)
        assert [future.done() for _op, _body, future in gate.open] == [False, False]
        scope.close(cancel_running=True)
        assert [future.cancelled() for _op, _body, future in gate.open] == [True, True]
        for pending in (read, write):
            result = await answer(pending)
            assert result.error is not None and result.error.retryable
            assert "cancelled" in result.error.message
        # A scope closed with nothing running cancels nothing.
        other = io.task_scope("t2")
        done = other.handle_io("t2", "c3", payload("gate", "get", {"table": "c"}), None)
        gate.open[-1][2].set_result(Reply({"v": 1}))
        assert ok(await answer(done))["v"] == 1
        other.close(cancel_running=True)
        await io.close()

    run(main())


def test_a_scope_dropped_while_its_task_runs_lets_its_calls_answer() -> None:
    """The subsystem drops the least recently used scope past ``max_task_scopes`` (and
    ``end_task`` drops one) while its task may still run: its reads and writes in flight
    answer as usual — a cancelled write would still be applied, then retried."""
    gate = GateBackend()

    async def main() -> None:
        io = subsystem(gate, max_task_scopes=2)
        read = io.handle_io("a", "a/c1", payload("gate", "get", {"table": "t"}), None)
        write = io.handle_io("a", "a/c2", payload("gate", "put", {"table": "t"}, io_kind=W), None)
        for task in ("b", "c"):  # "a" is dropped
            io.handle_io(task, f"{task}/c1", payload("gate", "get", {"table": task}), None)
        assert io.scope_of("a") is None
        assert not any(future.cancelled() for _op, _body, future in gate.open)
        gate.release("v")
        assert ok(await answer(read))["result"] == "v"
        assert ok(await answer(write))["result"] == "v"
        await io.close()

    run(main())


def test_a_read_keeps_running_while_one_of_its_waiters_is_left() -> None:
    """The worker cancels a waiter's future when its call stops waiting (budget cut-off,
    failure, cancel): that waiter only. The read goes on for the others — whether the
    one that left started it or joined it — and its answer is cached as usual."""
    gate = GateBackend()

    async def main() -> None:
        io = subsystem(gate)
        scope = io.task_scope("t")
        p = payload("gate", "get", {"table": "prices", "k": 1})
        for leaver in (0, 1):
            scope.cache.clear()
            waiters = [scope.handle_io("t", f"c{i}", p, None) for i in range(2)]
            assert gate.calls == leaver + 1  # one backend call each round
            assert waiters[leaver].cancel()
            [(_op, _body, backend_future)] = gate.open
            assert not backend_future.cancelled() and scope.in_flight == 1
            gate.release("v")
            assert ok(await answer(waiters[1 - leaver]))["result"] == "v"
            assert waiters[leaver].cancelled()
            assert type(scope.handle_io("t", "c9", p, None)) is IOResult  # cached
        op = scope.stats.operation("gate", "get")
        assert (op.backend_calls, op.singleflight_joins, op.abandoned) == (2, 2, 0)
        await io.close()

    run(main())


def test_a_read_whose_waiters_all_left_is_cancelled_and_forgotten() -> None:
    """Every waiter gone while the backend call runs: the backend's future is cancelled
    (an RPC request stops at its next try), the flight is dropped — an identical read
    later makes a call of its own — and the read counts as abandoned, not as a call."""
    gate = GateBackend()

    async def main() -> None:
        io = subsystem(gate)
        scope = io.task_scope("t")
        p = payload("gate", "get", {"table": "prices", "k": 1})
        first, joined = (scope.handle_io("t", f"c{i}", p, None) for i in range(2))
        [(_op, _body, backend_future)] = gate.open
        assert joined.cancel() and not backend_future.cancelled()
        assert first.cancel()
        assert backend_future.cancelled() and scope.in_flight == 0
        assert not first.cancel()  # a second cancel changes nothing
        op = scope.stats.operation("gate", "get")
        assert (op.requests, op.backend_calls, op.errors, op.abandoned) == (2, 0, 0, 1)
        assert op.max_ms == 0  # no latency recorded for it
        assert scope.stats.totals()["abandoned"] == 1
        assert io.stats.operation("gate", "get").abandoned == 1  # rolled up
        assert "abandoned" in scope.stats.format_table()
        assert scope.stats.as_dict()["operations"][0]["abandoned"] == 1
        await asyncio.sleep(0)  # the cancelled backend future's callbacks run: nothing
        again = scope.handle_io("t", "c2", p, None)
        assert gate.calls == 2 and type(again) is not IOResult
        gate.release("fresh")
        assert ok(await answer(again))["result"] == "fresh"
        assert len(scope.cache) == 1
        await io.close()

    run(main())


def test_a_write_or_an_unkeyed_capability_call_runs_on_when_its_waiter_left() -> None:
    """Cancelling a write does not undo it: its waiter's future is cancelled, the write
    runs to its answer (which still invalidates the table). So does a capability call
    without a cacheKey (it may have effects too)."""
    gate = GateBackend()

    async def main() -> None:
        io = subsystem(gate)
        scope = io.task_scope("t")
        read = payload("gate", "get", {"table": "prices"})
        first = scope.handle_io("t", "r", read, None)
        gate.release("old")
        await answer(first)
        assert type(scope.handle_io("t", "r", read, None)) is IOResult  # cached
        write = scope.handle_io(
            "t", "w", payload("gate", "put", {"table": "prices"}, io_kind=W), None
        )
        sign = scope.handle_io("t", "s", payload("gate", "sign", {"m": 1}, io_kind=C), None)
        assert write.cancel() and sign.cancel()
        assert [future.cancelled() for _op, _body, future in gate.open] == [False, False]
        gate.release("done")
        await asyncio.sleep(0)
        for name in ("put", "sign"):
            op = scope.stats.operation("gate", name)
            assert (op.backend_calls, op.abandoned) == (1, 0)
        assert type(scope.handle_io("t", "r", read, None)) is not IOResult  # invalidated
        gate.release()
        await io.close()

    run(main())


def test_a_read_with_one_waiter_is_cancelled_when_it_leaves_but_not_after_its_answer() -> None:
    gate = GateBackend()

    async def main() -> None:
        io = subsystem(gate)
        scope = io.task_scope("t")
        alone = scope.handle_io("t", "a", payload("gate", "get", {"k": 1}), None)
        [(_op, _body, backend_future)] = gate.open
        assert alone.cancel() and backend_future.cancelled() and scope.in_flight == 0
        answered = scope.handle_io("t", "b", payload("gate", "get", {"k": 2}), None)
        gate.release("v")
        assert ok(await answer(answered))["result"] == "v"
        assert not answered.cancel()  # answered: nothing to leave
        op = scope.stats.operation("gate", "get")
        assert (op.requests, op.backend_calls, op.abandoned) == (2, 1, 1)
        await io.close()

    run(main())


def test_an_ended_flight_and_its_answers_are_freed_without_the_cyclic_gc() -> None:
    """A flight and its waiters' answer futures point at each other while it runs (a
    waiter's cancel must reach its flight); once the flight ended -- answered, abandoned
    by every waiter, a write answered after its waiter left -- that cycle is broken, so
    the flight and the answer it holds (rows, sidecar bytes) are freed by reference
    counting, not only at a GC pass (the worker runs the collector rarely: tune_gc)."""
    gate = GateBackend()

    def flights() -> int:
        return sum(1 for o in gc.get_objects() if type(o) is _Flight)

    async def main() -> None:
        io = subsystem(gate)
        scope = io.task_scope("t")
        before = flights()
        for k in range(3):
            # answered: alone, and with a waiter that joined (one of them left first)
            p = payload("gate", "get", {"table": "x", "k": k, "cacheable": False})
            alone = scope.handle_io("t", "a", p, None)
            gate.release("v" * 1000)
            await answer(alone)
            waiters = [scope.handle_io("t", f"c{i}", p, None) for i in range(3)]
            assert waiters[2].cancel()
            gate.release("v" * 1000)
            for waiter in waiters[:2]:
                await answer(waiter)
            # abandoned by every waiter
            gone = [scope.handle_io("t", f"g{i}", p, None) for i in range(2)]
            for waiter in gone:
                assert waiter.cancel()
            # a write whose waiter left: it runs to its answer
            write = scope.handle_io("t", "w", payload("gate", "put", {"k": k}, io_kind=W), None)
            assert write.cancel()
            gate.release()
            del alone, waiters, waiter, gone, write
        await asyncio.sleep(0)  # the backend futures' callbacks
        assert flights() == before
        await io.close()

    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        run(main())
    finally:
        if enabled:
            gc.enable()


def test_deliver_to_calls_back_as_the_flight_answers_not_a_loop_turn_later() -> None:
    """The worker takes a read's answer with ``deliver_to``: its callback runs inside the
    flight's own answer (no loop turn between), for the first waiter and a joiner alike,
    each with its own done future; an ordinary done callback still runs a turn later."""
    gate = GateBackend()

    async def main() -> None:
        io = subsystem(gate)
        scope = io.task_scope("t")
        p = payload("gate", "get", {"table": "x", "k": 1})
        first, joined = (scope.handle_io("t", f"c{i}", p, None) for i in range(2))
        seen: list[tuple[str, Any]] = []
        first.deliver_to(lambda f: seen.append(("first", ok(f.result())["result"])))
        joined.deliver_to(lambda f: seen.append(("joined", ok(f.result())["result"])))
        first.add_done_callback(lambda f: seen.append(("ordinary", f.done())))
        gate.release("v")
        await asyncio.sleep(0)  # one turn: the backend future's callback, the flight's answer
        assert seen == [("first", "v"), ("joined", "v")]
        await asyncio.sleep(0)
        assert seen[2:] == [("ordinary", True)]
        assert first.direct is None and joined.direct is None
        assert first.flight is None and joined.flight is None  # let go, as before
        await io.close()

    run(main())


def test_deliver_to_after_the_answer_or_twice_is_an_ordinary_done_callback() -> None:
    gate = GateBackend()

    async def main() -> None:
        io = subsystem(gate)
        scope = io.task_scope("t")
        pending = scope.handle_io("t", "a", payload("gate", "get", {"k": 1}), None)
        calls: list[str] = []
        pending.deliver_to(lambda f: calls.append("direct"))
        pending.deliver_to(lambda f: calls.append("second"))  # a second one: the loop's
        gate.release("v")
        await asyncio.sleep(0)
        assert calls == ["direct"]
        await asyncio.sleep(0)
        assert calls == ["direct", "second"]
        pending.deliver_to(lambda f: calls.append("late"))  # done already
        assert calls == ["direct", "second"]
        await asyncio.sleep(0)
        assert calls == ["direct", "second", "late"]
        await io.close()

    run(main())


def test_a_cancelled_reads_deliver_to_callback_runs_from_the_loop_once() -> None:
    """The worker cancels the answer future of a call that stopped waiting; the callback
    it gave still runs -- from the loop, as a done callback would, and once -- and finds
    the future cancelled. The other waiter still gets the answer at once."""
    gate = GateBackend()

    async def main() -> None:
        io = subsystem(gate)
        scope = io.task_scope("t")
        p = payload("gate", "get", {"k": 1})
        leaving, staying = (scope.handle_io("t", f"c{i}", p, None) for i in range(2))
        seen: list[tuple[str, bool]] = []
        leaving.deliver_to(lambda f: seen.append(("leaving", f.cancelled())))
        staying.deliver_to(lambda f: seen.append(("staying", f.cancelled())))
        assert leaving.cancel()
        assert seen == []  # not from inside cancel()
        await asyncio.sleep(0)
        assert seen == [("leaving", True)]
        gate.release("v")
        await asyncio.sleep(0)
        assert seen == [("leaving", True), ("staying", False)]
        await asyncio.sleep(0.01)
        assert len(seen) == 2
        await io.close()

    run(main())


def test_a_deliver_to_callback_that_raises_is_logged_and_the_others_still_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gate = GateBackend()

    async def main() -> None:
        io = subsystem(gate)
        scope = io.task_scope("t")
        p = payload("gate", "get", {"k": 1})
        waiters = [scope.handle_io("t", f"c{i}", p, None) for i in range(3)]
        seen: list[int] = []

        def broken(_f: Any) -> None:
            raise RuntimeError("callback bug")

        waiters[0].deliver_to(broken)
        waiters[1].deliver_to(lambda f: seen.append(1))
        waiters[2].deliver_to(lambda f: seen.append(2))
        gate.release("v")
        await asyncio.sleep(0)
        assert seen == [1, 2]
        assert all(ok(w.result())["result"] == "v" for w in waiters)
        assert type(scope.handle_io("t", "c9", p, None)) is IOResult  # cached as usual
        await io.close()

    with caplog.at_level("ERROR", logger="blockx.worker.io"):
        run(main())
    assert any("answer callback" in r.getMessage() and r.exc_info for r in caplog.records)


def test_the_answer_values_behave_as_the_plain_classes_they_replaced() -> None:
    """IOResult, PreparedRequest and Reply are compiled (io/answers.py) and re-exported by
    handler / backend: keyword construction, defaults, repr, IOResult's value equality."""
    from blockx.worker.io import backend, handler
    from blockx.worker.io.answers import IOResult as Native

    assert handler.IOResult is Native is IOResult
    plain = IOResult()
    assert (plain.result, plain.error, plain.sidecar, plain.budget_used_ms) == (None,) * 4
    one = IOResult(result={"v": 1}, sidecar=b"x", budget_used_ms=3)
    assert one == IOResult(result={"v": 1}, sidecar=b"x", budget_used_ms=3)
    assert one != IOResult(result={"v": 1}, sidecar=b"x") and one != "IOResult"
    assert repr(one) == "IOResult(result={'v': 1}, error=None, sidecar=b'x', budget_used_ms=3)"
    with pytest.raises(TypeError):
        hash(one)  # mutable, compared by value
    assert one == mock.ANY  # another type decides (NotImplemented), as a dataclass does
    nan = IOResult(result=[float("nan")])
    assert nan == nan  # the fields compared as one tuple: identity first
    for value in (one, backend.Reply(), backend.PreparedRequest("get", 1, domain=None)):
        with pytest.raises(AttributeError):
            value.budget_ms = 5  # type: ignore[union-attr]  # a typo is an error, not a field
    with pytest.raises(TypeError):
        IOResult({"v": 1})  # type: ignore[misc]  # keywords only
    failed = backend.Reply.failure("down", retryable=True)
    assert failed.error is not None and failed.error.retryable and failed.nbytes == 0
    assert failed.to_io_result(7) == IOResult(error=failed.error, budget_used_ms=7)
    assert repr(backend.Reply([1], nbytes=3)) == "Reply(nbytes=3, sidecar=False)"
    prepared = backend.PreparedRequest("get", {"k": 1}, domain="t")
    assert (prepared.operation, prepared.body, prepared.domain, prepared.cacheable) == (
        "get",
        {"k": 1},
        "t",
        True,
    )
    assert repr(prepared) == "PreparedRequest('get', domain='t', cacheable=True)"


def test_a_scope_used_on_a_second_loop_binds_its_answers_to_that_loop() -> None:
    """The scope keeps its loop (asking for the running loop costs a system call per read
    on CPython 3.11) but never hands out a future of a loop that is no longer running."""
    gate = GateBackend()
    io = subsystem(gate)
    scope = io.task_scope("t1")

    async def read(k: int) -> None:
        first = scope.handle_io("t1", "c1", payload("gate", "get", {"k": k}), None)
        joined = scope.handle_io("t1", "c2", payload("gate", "get", {"k": k}), None)
        assert isinstance(first, asyncio.Future) and isinstance(joined, asyncio.Future)
        loop = asyncio.get_running_loop()
        assert first.get_loop() is loop and joined.get_loop() is loop
        gate.release(k)
        assert ok(await answer(first))["result"] == k
        assert ok(await answer(joined))["result"] == k

    run(read(1))
    run(read(2))  # a fresh loop: the kept one is closed
    assert gate.calls == 2
