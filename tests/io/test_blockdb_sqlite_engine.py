"""The SQLite engine: file on first use, WAL, one thread, batched commits, transient errors."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
from typing import Any

from io_support import call_backend, run

from blockx.wire import keys
from blockx.worker.io.blockdb import BlockDBBackend, encode_key
from blockx.worker.io.blockdb_sqlite import SQLiteEngine

R, W = keys.IO_READ, keys.IO_WRITE


def _backend(path: str, **kwargs: Any) -> BlockDBBackend:
    return BlockDBBackend(SQLiteEngine(path, **kwargs))


def test_the_file_and_its_directory_appear_on_first_use_in_wal_mode(tmp_path: Any) -> None:
    path = tmp_path / "deep" / "dir" / "store.sqlite3"
    backend = _backend(str(path))
    assert not path.parent.exists()

    async def main() -> None:
        try:
            reply = await call_backend(backend, R, "get_row", {"table": "t", "key": 1})
            assert reply.error is None and reply.result is None
            assert path.exists()
            await call_backend(backend, W, "upsert_rows", {"table": "t", "rows": [{"key": 1}]})
        finally:
            await backend.close()

    run(main())
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute('SELECT key, row FROM "bx_t"').fetchall() == [
            ("\x1e09223372036854775809", '{"key":1}')
        ]


def test_concurrent_writes_share_transactions_and_reads_see_earlier_writes(tmp_path: Any) -> None:
    engine = SQLiteEngine(str(tmp_path / "b.sqlite3"), batch_max=64)
    backend = BlockDBBackend(engine)

    async def main() -> None:
        try:
            await call_backend(backend, W, "upsert_rows", {"table": "t", "rows": [{"key": -1}]})
            before = engine.batches
            ops = []
            for i in range(200):
                ops.append(
                    call_backend(
                        backend, W, "upsert_rows", {"table": "t", "rows": [{"key": i, "v": i}]}
                    )
                )
                ops.append(call_backend(backend, R, "get_row", {"table": "t", "key": i}))
            replies = await asyncio.gather(*ops)
            assert all(r.error is None for r in replies)
            # each read was queued right after its write: it sees it
            assert [r.result for r in replies[1::2]] == [{"key": i, "v": i} for i in range(200)]
            assert engine.batches - before < 40  # 400 operations, a handful of commits
        finally:
            await backend.close()

    run(main())


def test_the_loop_never_runs_sqlite(tmp_path: Any) -> None:
    threads: set[str] = set()
    original = sqlite3.connect

    def spy(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        threads.add(threading.current_thread().name)
        return original(*args, **kwargs)

    backend = _backend(str(tmp_path / "c.sqlite3"))

    async def main() -> None:
        sqlite3.connect = spy  # type: ignore[assignment]
        try:
            await call_backend(backend, R, "scan", {"table": "t"})
        finally:
            sqlite3.connect = original  # type: ignore[assignment]
            await backend.close()

    run(main())
    assert threads == {"blockx-blockdb-sqlite"}


def test_a_busy_database_is_a_retryable_error(tmp_path: Any) -> None:
    path = str(tmp_path / "busy.sqlite3")
    backend = _backend(path, busy_timeout_s=0.2)

    async def main() -> None:
        try:
            await call_backend(backend, W, "upsert_rows", {"table": "t", "rows": [{"key": 1}]})
            other = sqlite3.connect(path, isolation_level=None)
            other.execute("BEGIN EXCLUSIVE")
            try:
                reply = await call_backend(
                    backend, W, "upsert_rows", {"table": "t", "rows": [{"key": 2}]}
                )
                assert reply.error is not None and reply.error.retryable
                assert reply.error.kind == "io_error"
                assert "locked" in reply.error.message and "transient" in reply.error.message
            finally:
                other.execute("ROLLBACK")
                other.close()
            reply = await call_backend(
                backend, W, "upsert_rows", {"table": "t", "rows": [{"key": 2}]}
            )
            assert reply.error is None and reply.result == 1
        finally:
            await backend.close()

    run(main())


def test_a_locked_file_costs_one_busy_timeout_per_batch_not_one_per_write(tmp_path: Any) -> None:
    """Writes that share a batch share its transaction: when the file stays locked for
    the whole busy timeout, every write of the batch fails after that one wait
    (they used to wait one timeout each: 4 writes, 4 x timeout_s)."""
    path = str(tmp_path / "locked.sqlite3")
    # A timeout long against any machine's overhead: one or two waits (the thread may take
    # the first write alone, before the others are queued) end well before four.
    timeout_s = 2.0
    backend = _backend(path, busy_timeout_s=timeout_s)

    async def main() -> None:
        try:
            await call_backend(backend, W, "upsert_rows", {"table": "t", "rows": [{"key": 0}]})
            other = sqlite3.connect(path, isolation_level=None)
            other.execute("BEGIN EXCLUSIVE")
            try:
                loop = asyncio.get_running_loop()
                started = loop.time()
                replies = await asyncio.gather(
                    *(
                        call_backend(
                            backend, W, "upsert_rows", {"table": "t", "rows": [{"key": i}]}
                        )
                        for i in range(1, 5)
                    )
                )
                elapsed = loop.time() - started
            finally:
                other.execute("ROLLBACK")
                other.close()
            for reply in replies:
                assert reply.error is not None and reply.error.retryable
                assert "locked" in reply.error.message
            # At most two busy timeouts (4 s) for the four writes; one per write would be 8 s.
            assert timeout_s <= elapsed < 3 * timeout_s, elapsed
            reply = await call_backend(
                backend, W, "upsert_rows", {"table": "t", "rows": [{"key": 9}]}
            )
            assert reply.error is None
        finally:
            await backend.close()

    run(main())


def test_an_unopenable_file_is_a_permanent_error_naming_the_path(tmp_path: Any) -> None:
    path = tmp_path / "a_directory"
    path.mkdir()
    backend = _backend(str(path))

    async def main() -> None:
        try:
            reply = await call_backend(backend, R, "get_row", {"table": "t", "key": 1})
            assert reply.error is not None and not reply.error.retryable
            assert str(path) in reply.error.message
        finally:
            await backend.close()

    run(main())


def test_a_failed_write_does_not_undo_its_batch_neighbours(tmp_path: Any) -> None:
    path = str(tmp_path / "n.sqlite3")
    backend = _backend(path)

    async def main() -> None:
        try:
            await call_backend(backend, W, "upsert_rows", {"table": "t", "rows": [{"key": 0}]})
            # A table made behind the engine's back with a conflicting schema: its writes fail.
            conn = sqlite3.connect(path)
            conn.execute(
                'CREATE TABLE "bx_odd" (key TEXT PRIMARY KEY, row TEXT NOT NULL, '
                "extra TEXT NOT NULL)"
            )
            conn.commit()
            conn.close()
            replies = await asyncio.gather(
                call_backend(backend, W, "upsert_rows", {"table": "t", "rows": [{"key": 1}]}),
                call_backend(backend, W, "upsert_rows", {"table": "odd", "rows": [{"key": 1}]}),
                call_backend(backend, W, "upsert_rows", {"table": "t", "rows": [{"key": 2}]}),
            )
            assert replies[0].error is None and replies[2].error is None
            assert replies[1].error is not None and not replies[1].error.retryable
            scan = await call_backend(backend, R, "scan", {"table": "t"})
            assert [k for k, _ in scan.result] == [0, 1, 2]
        finally:
            await backend.close()

    run(main())


def test_close_is_idempotent_and_later_requests_fail_retryably(tmp_path: Any) -> None:
    engine = SQLiteEngine(str(tmp_path / "x.sqlite3"))
    backend = BlockDBBackend(engine)

    async def main() -> None:
        await call_backend(backend, R, "get_row", {"table": "t", "key": 1})
        await backend.close()
        await backend.close()
        reply = await call_backend(backend, R, "get_row", {"table": "t", "key": 1})
        assert reply.error is not None and reply.error.retryable

    run(main())
    assert not any(
        t.name == "blockx-blockdb-sqlite" and t.is_alive() for t in threading.enumerate()
    )


def test_another_process_sees_committed_rows(tmp_path: Any) -> None:
    path = str(tmp_path / "shared.sqlite3")
    backend = _backend(path)

    async def main() -> None:
        try:
            await call_backend(
                backend, W, "upsert_rows", {"table": "prices", "rows": [{"key": "eth", "usd": 1}]}
            )
        finally:
            await backend.close()

    run(main())
    code = (
        "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); "
        "print(c.execute('select row from bx_prices').fetchone()[0])"
    )
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", code, path],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ},
    )
    assert out.stdout.strip() == '{"key":"eth","usd":1}'


def test_a_run_of_reads_of_one_table_is_one_statement_with_each_reply_its_own(
    tmp_path: Any,
) -> None:
    """Reads queued together (calls reading one table at once) are served by one
    ``SELECT ... IN``: each still gets its own answer -- row, None for a missing key,
    duplicates both answered, a row that is not JSON failing its own read only -- a
    read after a write sees it, another table's read splits the run, and a missing
    table answers None."""
    path = str(tmp_path / "g.sqlite3")
    engine = SQLiteEngine(path, batch_max=256)
    backend = BlockDBBackend(engine)

    async def main() -> None:
        try:
            rows = [{"key": k, "v": k * 10} for k in range(50)]
            await call_backend(backend, W, "upsert_rows", {"table": "t", "rows": rows})
            await call_backend(backend, W, "upsert_rows", {"table": "u", "rows": [{"key": 1}]})
            await call_backend(backend, R, "get_row", {"table": "t", "key": 0})
            assert engine.shared_reads == 0  # a lone read: its own statement
            with sqlite3.connect(path) as other:  # a row that is not JSON: its read fails alone
                other.execute('UPDATE "bx_t" SET row = ? WHERE key = ?', ("{bad", encode_key(8)))

            keys = [3, 3, 49, 50, -1, "x", 8, 7]
            ops = [call_backend(backend, R, "get_row", {"table": "t", "key": k}) for k in keys]
            ops.append(call_backend(backend, R, "get_row", {"table": "u", "key": 1}))
            ops.append(call_backend(backend, R, "get_row", {"table": "none", "key": 1}))
            ops.append(
                call_backend(backend, W, "upsert_rows", {"table": "t", "rows": [{"key": 50}]})
            )
            ops += [call_backend(backend, R, "get_row", {"table": "t", "key": k}) for k in (50, 3)]
            before = engine.batches
            replies = await asyncio.gather(*ops)
            assert engine.batches == before + 1  # queued together: one batch
            bad = replies.pop(6)
            assert bad.error is not None and not bad.error.retryable
            assert "get_row on table 't'" in bad.error.message
            assert all(r.error is None for r in replies)
            assert [r.result for r in replies] == [
                {"key": 3, "v": 30},
                {"key": 3, "v": 30},
                {"key": 49, "v": 490},
                None,
                None,
                None,
                {"key": 7, "v": 70},
                {"key": 1},
                None,
                1,
                {"key": 50},
                {"key": 3, "v": 30},
            ]
            # the run of 8 reads of t, and the 2 after the write (u's read is alone)
            assert engine.shared_reads == 10
        finally:
            await backend.close()

    run(main())
