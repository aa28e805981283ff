"""The PostgreSQL engine reads a loop turn's ``get_row`` of one table with one statement.

Against a real server (``pg_dsn``). Statements are counted twice: by the server
(``pg_stat_statements``, which the test cluster preloads: executions of each
statement text, the table name in it) and by the engine's own
``read_statements``. Each read must still get exactly its own answer.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import asyncpg
import pytest
from io_support import answer, call_backend, ok, payload, run

from blockx.wire import keys
from blockx.worker.io.backend import Reply
from blockx.worker.io.blockdb import MAX_BATCH, BlockDBBackend
from blockx.worker.io.blockdb_postgres import PostgresEngine
from blockx.worker.io.registry import IOSubsystem

R, W = keys.IO_READ, keys.IO_WRITE

_prefixes = itertools.count(1)


def _backend(dsn: str) -> tuple[BlockDBBackend, PostgresEngine, str]:
    engine = PostgresEngine(dsn, pool_size=4)
    prefix = f"rd{next(_prefixes)}_"
    return BlockDBBackend(engine, table_prefix=prefix), engine, prefix


async def _server_counts(dsn: str, sql_table: str) -> dict[str, int]:
    """``{statement text: executions}`` of the statements naming ``sql_table`` (quoted),
    as the server counted them; skips the test when pg_stat_statements is not loaded."""
    conn = await asyncpg.connect(dsn)
    try:
        try:
            await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            records = await conn.fetch(
                "SELECT query, calls FROM pg_stat_statements WHERE query LIKE $1",
                f"%{sql_table}%",
            )
        except (asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            pytest.skip(f"pg_stat_statements is not available on this server: {exc}")
    finally:
        await conn.close()
    counts: dict[str, int] = {}
    for query, calls in records:
        counts[query] = counts.get(query, 0) + int(calls)
    return counts


def _selects(counts: dict[str, int]) -> dict[str, int]:
    return {q: n for q, n in counts.items() if q.lstrip().upper().startswith("SELECT")}


def _submit_turn(backend: BlockDBBackend, reads: list[tuple[str, Any]]) -> list[Any]:
    """``get_row`` of each ``(table, key)``, all submitted in this one loop turn."""
    return [
        backend.execute(backend.prepare(R, "get_row", {"table": table, "key": key}, None))
        for table, key in reads
    ]


def test_a_turn_of_get_row_is_one_statement_each_read_its_own_answer(pg_dsn: str) -> None:
    backend, engine, prefix = _backend(pg_dsn)
    rows = [{"key": i, "n": i * i} for i in range(0, 60, 2)]  # even keys exist, odd miss

    async def main() -> None:
        try:
            await call_backend(backend, W, "upsert_rows", {"table": "t", "rows": rows})
            before = _selects(await _server_counts(pg_dsn, f'"{prefix}t"'))
            wanted = [*range(60), 4, 4, 7, 7, 58]  # duplicates, a hit and a miss twice
            replies = await asyncio.gather(*_submit_turn(backend, [("t", k) for k in wanted]))
            for key, reply in zip(wanted, replies, strict=True):
                assert reply.error is None, reply.error
                assert reply.result == ({"key": key, "n": key * key} if key % 2 == 0 else None)
            assert engine.read_statements == 1
            assert engine.shared_reads == len(wanted)
            after = _selects(await _server_counts(pg_dsn, f'"{prefix}t"'))
            sent = {q: n - before.get(q, 0) for q, n in after.items() if n != before.get(q, 0)}
            assert list(sent.values()) == [1], sent
            assert "ANY" in next(iter(sent)), sent
        finally:
            await backend.close()

    run(main())


def test_one_statement_per_table_and_a_missing_table_reads_as_empty(pg_dsn: str) -> None:
    backend, engine, prefix = _backend(pg_dsn)

    async def main() -> None:
        try:
            await call_backend(backend, W, "upsert_rows", {"table": "a", "rows": [{"key": "x"}]})
            await call_backend(backend, W, "upsert_rows", {"table": "b", "rows": [{"key": "y"}]})
            reads = [("a", "x"), ("b", "x"), ("nope", "x"), ("a", "y"), ("b", "y"), ("nope", 1)]
            replies = await asyncio.gather(*_submit_turn(backend, reads))
            assert [r.result for r in replies] == [
                {"key": "x"},
                None,
                None,
                None,
                {"key": "y"},
                None,
            ]
            assert all(r.error is None for r in replies)
            assert engine.read_statements == 3
            for table in ("a", "b"):
                selects = _selects(await _server_counts(pg_dsn, f'"{prefix}{table}"'))
                assert sum(selects.values()) == 1, selects
            # the reads did not create the missing table
            scan = await call_backend(backend, R, "scan", {"table": "nope"})
            assert scan.result == []
        finally:
            await backend.close()

    run(main())


def test_a_row_that_does_not_decode_fails_only_its_own_read(pg_dsn: str) -> None:
    backend, engine, prefix = _backend(pg_dsn)

    async def main() -> None:
        try:
            await call_backend(backend, W, "upsert_rows", {"table": "t", "rows": [{"key": "ok"}]})
            conn = await asyncpg.connect(pg_dsn)
            try:  # written behind the engine's back: not JSON
                await conn.execute(f"INSERT INTO \"{prefix}t\" VALUES ('bad', '{{not json')")
            finally:
                await conn.close()
            replies = await asyncio.gather(
                *_submit_turn(backend, [("t", "ok"), ("t", "bad"), ("t", "gone"), ("t", "ok")])
            )
            assert replies[0].result == {"key": "ok"} and replies[0].error is None
            assert replies[1].error is not None and not replies[1].error.retryable
            assert "get_row" in replies[1].error.message
            assert replies[2].result is None and replies[2].error is None
            assert replies[3].result == {"key": "ok"} and replies[3].error is None
            assert engine.read_statements == 1
        finally:
            await backend.close()

    run(main())


def test_a_cancelled_read_is_left_out_and_a_turn_of_cancelled_reads_sends_nothing(
    pg_dsn: str,
) -> None:
    backend, engine, _prefix = _backend(pg_dsn)

    async def main() -> None:
        try:
            await call_backend(backend, W, "upsert_rows", {"table": "t", "rows": [{"key": 1}]})
            pending = _submit_turn(backend, [("t", 1), ("t", 2)])
            for future in pending:
                future.cancel()
            await asyncio.sleep(0)  # the flush runs
            await asyncio.sleep(0)
            assert engine.read_statements == 0
            first, second = _submit_turn(backend, [("t", 1), ("t", 2)])
            second.cancel()
            reply: Reply = await first
            assert reply.result == {"key": 1}
            assert engine.read_statements == 1
        finally:
            await backend.close()

    run(main())


def test_more_than_max_batch_distinct_keys_take_more_statements(pg_dsn: str) -> None:
    backend, engine, _prefix = _backend(pg_dsn)

    async def main() -> None:
        try:
            await call_backend(backend, W, "upsert_rows", {"table": "t", "rows": [{"key": 3}]})
            # MAX_BATCH distinct keys and duplicates: one statement
            wanted = [*range(MAX_BATCH), 3, 3, 5]
            replies = await asyncio.gather(*_submit_turn(backend, [("t", k) for k in wanted]))
            assert [r.result for r in replies] == [{"key": 3} if k == 3 else None for k in wanted]
            assert engine.read_statements == 1
            # one distinct key more: two
            wanted = list(range(MAX_BATCH + 1))
            replies = await asyncio.gather(*_submit_turn(backend, [("t", k) for k in wanted]))
            assert [r.result for r in replies] == [{"key": 3} if k == 3 else None for k in wanted]
            assert engine.read_statements == 3
        finally:
            await backend.close()

    run(main())


def test_reads_queued_when_the_engine_closes_answer_closed(pg_dsn: str) -> None:
    backend, engine, _prefix = _backend(pg_dsn)

    async def main() -> None:
        await call_backend(backend, W, "upsert_rows", {"table": "t", "rows": [{"key": 1}]})
        pending = _submit_turn(backend, [("t", 1)])
        await backend.close()
        reply: Reply = await pending[0]
        assert reply.error is not None and reply.error.retryable
        assert "closed" in reply.error.message
        assert engine.read_statements == 0

    run(main())


def test_a_failed_statement_fails_each_read_of_it_retryably() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    engine = PostgresEngine(f"postgresql://postgres@127.0.0.1:{port}/postgres", timeout_s=2)
    backend = BlockDBBackend(engine)

    async def main() -> None:
        try:
            replies = await asyncio.gather(*_submit_turn(backend, [("t", 1), ("t", 2), ("u", 1)]))
            for reply in replies:
                assert reply.error is not None and reply.error.retryable
                assert "get_row" in reply.error.message
            assert engine.read_statements == 2
        finally:
            await backend.close()

    run(main())


def test_a_turn_of_reads_through_a_task_scope_is_one_statement(pg_dsn: str) -> None:
    """The worker's path: each call's ``CallWaiting(io)`` through the task's IO scope
    (singleflight joins identical reads, a refused key answers at once), all in one turn."""
    prefix = f"sc{next(_prefixes)}_"
    io = IOSubsystem(
        {"blockdb": {"engine": "postgres", "postgres_dsn": pg_dsn, "table_prefix": prefix}}
    )

    async def main() -> None:
        try:
            scope = io.task_scope("t")
            rows = [{"key": k, "v": k * 10} for k in range(0, 40, 3)]
            written = await answer(
                scope.handle_io(
                    "t",
                    "w",
                    payload("blockdb", "upsert_rows", {"table": "t", "rows": rows}, io_kind=W),
                    None,
                )
            )
            assert ok(written) == len(rows)
            keys_: list[Any] = [*range(40), 6, 6, 7, 1.5]  # duplicates; a float is no key
            returned = [
                scope.handle_io(
                    "t", f"c{i}", payload("blockdb", "get_row", {"table": "t", "key": k}), None
                )
                for i, k in enumerate(keys_)
            ]
            results = [await answer(r) for r in returned]
            for key, result in zip(keys_[:-1], results[:-1], strict=True):
                assert ok(result) == ({"key": key, "v": key * 10} if key % 3 == 0 else None)
            refused = results[-1]
            assert refused.error is not None and not refused.error.retryable
            assert "key" in refused.error.message
            backend = io.backend("blockdb")
            assert isinstance(backend, BlockDBBackend)
            engine = backend.engine
            assert isinstance(engine, PostgresEngine)
            assert engine.read_statements == 1 and engine.shared_reads == 40  # 40 distinct
            selects = _selects(await _server_counts(pg_dsn, f'"{prefix}t"'))
            assert list(selects.values()) == [1], selects
        finally:
            await io.close()

    run(main())


def test_reads_flushed_just_before_the_engine_closes_answer_closed(pg_dsn: str) -> None:
    backend, engine, _prefix = _backend(pg_dsn)

    async def main() -> None:
        await call_backend(backend, W, "upsert_rows", {"table": "t", "rows": [{"key": 1}]})
        pending = _submit_turn(backend, [("t", 1), ("t", 2)])
        await asyncio.sleep(0)  # the flush ran: its statement's task is not started yet
        await backend.close()
        for future in pending:
            reply: Reply = await future
            assert reply.error is not None and reply.error.retryable
        assert engine.read_statements == 0

    run(main())
