"""The ``blockdb`` PostgreSQL engine: the same tables over an asyncpg pool.

Theory of operation
-------------------
For deployments where several workers share one table store. The pool is
created on first use from the DSN (``asyncpg.create_pool``, at most
``pool_size`` connections, ``timeout_s`` as the command timeout). Each
operation is one statement on a pooled connection, run as one asyncio task
(:meth:`PostgresEngine.submit` returns the coroutine; the task scope schedules
it): a ``blockdb`` request is a round trip to a server anyway.

Except ``get_row``: many calls reading one table at once would each take a
connection and a round trip. :meth:`PostgresEngine.submit` answers a
``get_row`` with a future and queues it by table; the first read queued
schedules a flush with ``call_soon``, so every ``get_row`` submitted during
the same event-loop turn (and those of the callbacks ahead of the flush) is
read by one ``SELECT key, row ... WHERE key = ANY($1)`` per table — the
statement ``get_rows`` uses —, at most :data:`~blockx.worker.io.blockdb.MAX_BATCH`
distinct keys per statement, each statement on a connection of its own. Each
read still gets the reply its own statement would have given: its row, or
``None`` for a miss (or a missing table), a row that does not decode failing
only that read, a key read twice in the turn sent once and answered to both.
A failed statement (connection lost, timeout...) fails the reads of that
statement, each with its own message. A read whose future is cancelled before
its statement runs is left out of it. Reads are not ordered against writes
any more than before: a call's write has committed before its answer reaches
the call, so a read the call sends afterwards sees it (read-your-writes),
while a read and a write submitted in the same turn by two calls race, as two
pooled connections always did. :attr:`PostgresEngine.read_statements` and
:attr:`PostgresEngine.shared_reads` count the statements and the reads they
served.

Tables are the same as on SQLite (see :mod:`blockx.worker.io.blockdb`):
``key TEXT COLLATE "C" PRIMARY KEY, row TEXT NOT NULL`` — the ``"C"``
collation makes key order byte order, as SQLite's ``BINARY``. Rows are TEXT,
not JSONB, so a row comes back exactly as it was written (JSONB would reorder
keys and drop duplicates). ``upsert_rows`` is one ``INSERT ... SELECT FROM
unnest(...) ON CONFLICT (key) DO UPDATE``; ``CREATE TABLE IF NOT EXISTS`` runs
once per table per engine (a concurrent creator's race is ignored).

Errors: lost connections, timeouts, deadlocks, serialization failures, lock
timeouts, "too many connections" and a server that is starting or shutting
down are retryable ``io_error``; the rest (bad credentials, a missing
database) are not.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from .backend import Reply
from .blockdb import MAX_BATCH, Delete, GetRow, GetRows, Scan, TableOp, Upsert
from .read_answer import BackendAnswer

__all__ = ["PostgresEngine"]

_log = logging.getLogger("blockx.worker.io.blockdb")

#: A queued ``get_row`` and the future its reply goes to.
_Read = tuple[GetRow, asyncio.Future[Reply]]


def _redact(dsn: str) -> str:
    """The DSN without its password."""
    head, sep, tail = dsn.partition("@")
    if not sep or "://" not in head:
        return dsn
    scheme, _, userinfo = head.partition("://")
    user = userinfo.split(":", 1)[0]
    return f"{scheme}://{user}:***@{tail}" if ":" in userinfo else dsn


class PostgresEngine:
    """Runs ``blockdb`` operations on PostgreSQL through an asyncpg pool."""

    __slots__ = (
        "_closed",
        "_known",
        "_pool",
        "_pool_lock",
        "_read_tasks",
        "_reads",
        "dsn",
        "pool_size",
        "read_statements",
        "shared_reads",
        "timeout_s",
    )

    engine = "postgres"

    def __init__(self, dsn: str, *, pool_size: int = 10, timeout_s: float = 30.0) -> None:
        self.dsn = dsn
        self.pool_size = pool_size
        self.timeout_s = timeout_s
        self._pool: Any = None
        self._pool_lock: asyncio.Lock | None = None
        self._known: set[str] = set()
        self._closed = False
        #: ``get_row`` reads queued this turn, by quoted SQL table (see the module docstring).
        self._reads: dict[str, list[_Read]] = {}
        #: The statements reading them, running (held here: the loop keeps weak references).
        self._read_tasks: set[asyncio.Task[None]] = set()
        #: ``get_row`` statements sent (each one ``WHERE key = ANY($1)``): for tests and stats.
        self.read_statements = 0
        #: ``get_row`` reads answered by those statements.
        self.shared_reads = 0

    def __repr__(self) -> str:
        return f"PostgresEngine({_redact(self.dsn)!r}, pool_size={self.pool_size})"

    def submit(self, op: TableOp) -> Any:
        if type(op) is GetRow and not self._closed:
            assert isinstance(op, GetRow)
            return self._queue_read(op)
        return self._run(op)

    # --- get_row: one statement per table per loop turn ---------------------------------------

    def _queue_read(self, op: GetRow) -> asyncio.Future[Reply]:
        loop = asyncio.get_running_loop()
        # Answered straight into the scope's flight (read_answer.BackendAnswer).
        future: asyncio.Future[Reply] = BackendAnswer(loop=loop)
        reads = self._reads
        if not reads:
            loop.call_soon(self._flush_reads)
        queued = reads.get(op.sql_table)
        if queued is None:
            reads[op.sql_table] = [(op, future)]
        else:
            queued.append((op, future))
        return future

    def _flush_reads(self) -> None:
        """The turn's queued reads: one statement per table (per MAX_BATCH distinct keys)."""
        reads, self._reads = self._reads, {}
        for queued in reads.values():
            live = [read for read in queued if not read[1].done()]  # cancelled: left out
            if not live:
                continue
            if self._closed:
                closed = Reply.failure("blockdb: the PostgreSQL engine is closed", retryable=True)
                for _op, future in live:
                    future.set_result(closed)
                continue
            for run in _runs(live):
                task = asyncio.ensure_future(self._read_run(run))
                self._read_tasks.add(task)
                task.add_done_callback(self._read_tasks.discard)

    async def _read_run(self, reads: list[_Read]) -> None:
        """One ``SELECT ... WHERE key = ANY($1)`` for ``reads`` (one table), each read
        answered with the reply its own statement would have had."""
        if self._closed:  # closed between the flush and this task's start
            closed = Reply.failure("blockdb: the PostgreSQL engine is closed", retryable=True)
            for _op, future in reads:
                if not future.done():
                    future.set_result(closed)
            return
        first = reads[0][0]
        probe = GetRows(first.table, first.sql_table, [op.key for op, _ in reads])
        self.read_statements += 1
        try:
            pool = await self._get_pool()
            async with pool.acquire() as conn:
                found = await self._execute(conn, probe)
        except asyncio.CancelledError:
            for _op, future in reads:
                future.cancel()
            raise
        except Exception as exc:
            for op, future in reads:
                if not future.done():
                    future.set_result(self._error_reply(exc, op))
            return
        self.shared_reads += len(reads)
        rows: dict[str, str] = found or {}
        for op, future in reads:
            if future.done():
                continue  # cancelled while the statement ran
            try:
                reply = op.finish(rows.get(op.key))
            except Exception as bad_row:  # own name: mypyc types a name once
                reply = self._error_reply(bad_row, op)
            future.set_result(reply)

    async def close(self) -> None:
        self._closed = True
        if self._reads:
            self._flush_reads()  # the turn's queued reads: answered "closed"
        pool, self._pool = self._pool, None
        if pool is not None:
            try:
                await asyncio.wait_for(pool.close(), timeout=10)
            except (TimeoutError, OSError):  # pragma: no cover
                pool.terminate()

    async def _get_pool(self) -> Any:
        pool = self._pool
        if pool is not None:
            return pool
        if self._pool_lock is None:
            self._pool_lock = asyncio.Lock()
        async with self._pool_lock:
            if self._pool is None:
                import asyncpg

                self._pool = await asyncpg.create_pool(
                    self.dsn,
                    min_size=1,
                    max_size=self.pool_size,
                    command_timeout=self.timeout_s,
                    timeout=self.timeout_s,
                )
            return self._pool

    async def _run(self, op: TableOp) -> Reply:
        if self._closed:
            return Reply.failure("blockdb: the PostgreSQL engine is closed", retryable=True)
        try:
            pool = await self._get_pool()
            async with pool.acquire() as conn:
                raw = await self._execute(conn, op)
            return op.finish(raw)
        except Exception as exc:
            return self._error_reply(exc, op)

    def _error_reply(self, exc: BaseException, op: TableOp) -> Reply:
        import asyncpg
        from asyncpg import exceptions as pg

        where = f"blockdb {op.operation} on table {op.table!r}: PostgreSQL"
        transient = (
            asyncpg.PostgresConnectionError,
            pg.CannotConnectNowError,
            pg.TooManyConnectionsError,
            pg.TransactionRollbackError,  # deadlock, serialization failure
            pg.LockNotAvailableError,
            pg.QueryCanceledError,  # statement timeout
            pg.AdminShutdownError,
            pg.CrashShutdownError,
            asyncpg.InterfaceError,  # connection closed under us, pool closing
            OSError,  # connection refused / reset
            asyncio.TimeoutError,
            ConnectionError,
        )
        if isinstance(exc, transient):
            detail = str(exc) or type(exc).__name__
            return Reply.failure(
                f"{where} {_redact(self.dsn)}: {detail} (transient)", retryable=True
            )
        if isinstance(exc, asyncpg.PostgresError):
            return Reply.failure(f"{where}: {exc}", retryable=False)
        _log.error("blockdb postgres: unexpected %r", exc)
        return Reply.failure(f"{where}: internal error: {exc!r}", retryable=False)

    async def _execute(self, conn: Any, op: TableOp) -> Any:
        from asyncpg import exceptions as pg

        try:
            return await self._statement(conn, op)
        except pg.UndefinedTableError:
            self._known.discard(op.raw_table)
            if type(op) is Upsert:
                return await self._statement(conn, op)
            return None

    async def _ensure_table(self, conn: Any, op: TableOp) -> None:
        from asyncpg import exceptions as pg

        if op.raw_table in self._known:
            return
        try:
            await conn.execute(
                f"CREATE TABLE IF NOT EXISTS {op.sql_table} "
                '(key TEXT COLLATE "C" PRIMARY KEY NOT NULL, row TEXT NOT NULL)'
            )
        except (pg.UniqueViolationError, pg.DuplicateTableError, pg.DuplicateObjectError):
            # Created concurrently by another connection or worker: IF NOT EXISTS does not
            # cover the race on the catalog ('duplicate key ... pg_type', 'type ... already
            # exists').
            pass
        self._known.add(op.raw_table)

    async def _statement(self, conn: Any, op: TableOp) -> Any:
        table = op.sql_table
        kind = type(op)
        if kind is GetRow:
            assert isinstance(op, GetRow)
            return await conn.fetchval(f"SELECT row FROM {table} WHERE key = $1", op.key)
        if kind is GetRows:
            assert isinstance(op, GetRows)
            records = await conn.fetch(
                f"SELECT key, row FROM {table} WHERE key = ANY($1::text[])", op.unique
            )
            return {r[0]: r[1] for r in records}
        if kind is Scan:
            assert isinstance(op, Scan)
            clauses = [
                f"key {operator} ${i}" for i, (operator, _) in enumerate(op.conditions, start=1)
            ]
            args: list[Any] = [value for _, value in op.conditions]
            args.append(op.limit)
            sql = (
                f"SELECT key, row FROM {table}"
                + (" WHERE " + " AND ".join(clauses) if clauses else "")
                + f" ORDER BY key {'DESC' if op.descending else 'ASC'} LIMIT ${len(args)}"
            )
            records = await conn.fetch(sql, *args)
            return [(r[0], r[1]) for r in records]
        if kind is Upsert:
            assert isinstance(op, Upsert)
            await self._ensure_table(conn, op)
            keys = [k for k, _ in op.items]
            rows = [r for _, r in op.items]
            await conn.execute(
                f"INSERT INTO {table} (key, row) "
                "SELECT * FROM unnest($1::text[], $2::text[]) "
                "ON CONFLICT (key) DO UPDATE SET row = EXCLUDED.row",
                keys,
                rows,
            )
            return len(op.items)
        if kind is Delete:
            assert isinstance(op, Delete)
            status = await conn.execute(f"DELETE FROM {table} WHERE key = ANY($1::text[])", op.keys)
            return int(status.rsplit(" ", 1)[-1])
        raise TypeError(f"unknown blockdb operation {op!r}")  # pragma: no cover


def _runs(reads: list[_Read]) -> list[list[_Read]]:
    """``reads`` cut into runs of at most MAX_BATCH distinct keys (a key read twice counts
    once: the statement reads it once)."""
    if len(reads) <= MAX_BATCH:
        return [reads]
    runs: list[list[_Read]] = []
    run: list[_Read] = []
    keys: set[str] = set()
    for read in reads:
        key = read[0].key
        if key not in keys and len(keys) >= MAX_BATCH:
            runs.append(run)
            run, keys = [], set()
        keys.add(key)
        run.append(read)
    runs.append(run)
    return runs
