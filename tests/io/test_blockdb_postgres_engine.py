"""The PostgreSQL engine against a real server: errors, table creation races, sharing."""

from __future__ import annotations

import asyncio
import socket

from io_support import call_backend, run

from blockx.wire import keys
from blockx.worker.io.blockdb import BlockDBBackend
from blockx.worker.io.blockdb_postgres import PostgresEngine

R, W = keys.IO_READ, keys.IO_WRITE


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_server_is_a_retryable_error() -> None:
    dsn = f"postgresql://postgres:secret@127.0.0.1:{_closed_port()}/postgres"
    backend = BlockDBBackend(PostgresEngine(dsn, timeout_s=2))

    async def main() -> None:
        try:
            reply = await call_backend(backend, R, "get_row", {"table": "t", "key": 1})
            assert reply.error is not None and reply.error.retryable
            assert "transient" in reply.error.message
            assert "secret" not in reply.error.message  # the password is not shown
        finally:
            await backend.close()

    run(main())


def test_a_missing_database_is_a_permanent_error(pg_dsn: str) -> None:
    dsn = pg_dsn.rsplit("/", 1)[0] + "/no_such_database"
    backend = BlockDBBackend(PostgresEngine(dsn, timeout_s=5))

    async def main() -> None:
        try:
            reply = await call_backend(backend, R, "get_row", {"table": "t", "key": 1})
            assert reply.error is not None and not reply.error.retryable
            assert "no_such_database" in reply.error.message
        finally:
            await backend.close()

    run(main())


def test_concurrent_first_writes_create_the_table_once(pg_dsn: str) -> None:
    engines = [PostgresEngine(pg_dsn, pool_size=4) for _ in range(3)]
    backends = [BlockDBBackend(e, table_prefix="race_") for e in engines]

    async def main() -> None:
        try:
            replies = await asyncio.gather(
                *(
                    call_backend(
                        backends[i % 3], W, "upsert_rows", {"table": "fresh", "rows": [{"key": i}]}
                    )
                    for i in range(30)
                )
            )
            assert all(r.error is None for r in replies), [r.error for r in replies if r.error]
            scan = await call_backend(backends[0], R, "scan", {"table": "fresh"})
            assert [k for k, _ in scan.result] == list(range(30))
        finally:
            for backend in backends:
                await backend.close()

    run(main())


def test_two_workers_share_one_store(pg_dsn: str) -> None:
    first = BlockDBBackend(PostgresEngine(pg_dsn, pool_size=2), table_prefix="share_")
    second = BlockDBBackend(PostgresEngine(pg_dsn, pool_size=2), table_prefix="share_")

    async def main() -> None:
        try:
            await call_backend(first, W, "upsert_rows", {"table": "t", "rows": [{"key": "a"}]})
            reply = await call_backend(second, R, "get_row", {"table": "t", "key": "a"})
            assert reply.result == {"key": "a"}
            assert (
                await call_backend(second, W, "delete_rows", {"table": "t", "keys": ["a"]})
            ).result == 1
            assert (
                await call_backend(first, R, "get_row", {"table": "t", "key": "a"})
            ).result is None
        finally:
            await first.close()
            await second.close()

    run(main())
