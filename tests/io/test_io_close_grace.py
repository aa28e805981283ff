"""Closing the IO subsystem is bounded (issue 16, item 4): a SQLite write waiting for a lock
another connection holds is abandoned after the grace, and the close says what was left."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

from io_support import call_backend, run

from blockx.wire import keys
from blockx.worker.io.config import load_io_config
from blockx.worker.io.registry import IOSubsystem


def _locked(path: Path) -> sqlite3.Connection:
    """Another connection holding the file's write lock (until the test closes it)."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE IF NOT EXISTS other (x)")
    conn.execute("BEGIN EXCLUSIVE")
    return conn


def test_a_write_waiting_for_a_lock_is_abandoned_after_the_grace(tmp_path: Path) -> None:
    config = load_io_config({"data_dir": str(tmp_path), "blockdb": {"timeout_s": 60}}, env={})
    holder = _locked(tmp_path / "blockdb.sqlite3")
    io = IOSubsystem(config)

    async def main() -> tuple[list[str], float]:
        backend = io.backend("blockdb")
        assert backend is not None
        write = asyncio.ensure_future(
            call_backend(
                backend, keys.IO_WRITE, "upsert_rows", {"table": "t", "rows": [{"key": 1}]}
            )
        )
        engine = backend.engine  # type: ignore[attr-defined]
        while engine.in_flight == 0:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # the thread is in SQLite's busy wait (60 s)
        started = time.monotonic()
        notes = await io.close(grace_s=0.5)
        took = time.monotonic() - started
        write.cancel()
        return notes, took

    try:
        notes, took = run(main())
    finally:
        holder.close()
    assert took < 10, took  # not SQLite's 60 s busy timeout
    assert notes == [
        "blockdb: 1 operation still running 0.5 s after the task ended: abandoned, not finished"
    ]


def test_a_close_with_nothing_running_abandons_nothing(tmp_path: Path) -> None:
    config = load_io_config({"data_dir": str(tmp_path)}, env={})
    io = IOSubsystem(config)

    async def main() -> list[str]:
        backend = io.backend("blockdb")
        assert backend is not None
        reply = await call_backend(backend, keys.IO_READ, "get_row", {"table": "t", "key": 1})
        assert reply.error is None
        return await io.close(grace_s=5.0)

    assert run(main()) == []
