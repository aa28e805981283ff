"""The ``blockdb`` SQLite engine: one file, one thread, batched commits.

Theory of operation
-------------------
The event loop never touches SQLite. :meth:`SQLiteEngine.submit` puts the
operation and a fresh future on a queue and returns the future; one dedicated
thread (started on first use) owns the only connection. It takes whatever is
queued (up to ``batch_max`` operations), runs them in order — the writes of
the batch inside one ``BEGIN IMMEDIATE`` transaction, each under a savepoint
so one failing write does not undo the others — commits once, and hands all
the replies back with one ``call_soon_threadsafe`` per batch. Rows are
decoded from JSON in the thread as well, off the event loop.

Reads in a batch run on the same connection as its writes, in queue order, so
a read queued after a write sees it. A run of ``get_row`` of one table with
nothing else queued between them (many calls reading the same table at once)
is one ``SELECT ... WHERE key IN (...)`` -- the statement ``get_rows`` uses --
and each read still gets the reply (row, ``None`` or error) its own statement
would have given. Replies are delivered only after the
commit; when the commit fails, every reply from the batch's first write on
becomes that error (retryable).

The file and its directory are created on first use, in WAL mode
(``synchronous=NORMAL``: durable across crashes of the process, a power loss
may lose the last commits). Other processes may use the same file (WAL allows
one writer and many readers); a busy lock waits up to ``busy_timeout_s`` and
then fails the request as a retryable ``io_error``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import sqlite3
import threading
from collections.abc import Iterable
from typing import Any, Final

from .backend import Reply
from .blockdb import Delete, GetRow, GetRows, Scan, TableOp, Upsert
from .read_answer import BackendAnswer

__all__ = ["SQLiteEngine"]

_log = logging.getLogger("blockx.worker.io.blockdb")

#: Keys per ``IN (...)`` statement (SQLite's variable limit is 32766; stay far below).
_CHUNK: Final = 500
_STOP: Final = None

_Job = tuple[TableOp, asyncio.Future[Reply], asyncio.AbstractEventLoop]


def _is_locked(exc: BaseException) -> bool:
    """SQLite gave up waiting for another connection's lock (its busy timeout)."""
    text = str(exc).lower()
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in text or "busy" in text)


def _error_reply(path: str, exc: BaseException, op: TableOp | None) -> Reply:
    text = str(exc)
    lowered = text.lower()
    where = f"blockdb {op.operation} on table {op.table!r}" if op is not None else "blockdb"
    if isinstance(exc, sqlite3.OperationalError) and (
        "locked" in lowered or "busy" in lowered or "disk i/o" in lowered
    ):
        return Reply.failure(f"{where}: SQLite {path}: {text} (transient)", retryable=True)
    if isinstance(exc, sqlite3.Error):
        return Reply.failure(f"{where}: SQLite {path}: {text}", retryable=False)
    return Reply.failure(f"{where}: internal error: {exc!r}", retryable=False)


class SQLiteEngine:
    """Runs ``blockdb`` operations on a SQLite file in one worker thread."""

    __slots__ = (
        "_closed",
        "_lock",
        "_queue",
        "_sqlite_thread",
        "_stopped",
        "batch_max",
        "batches",
        "busy_timeout_s",
        "in_flight",
        "path",
        "shared_reads",
    )

    engine = "sqlite"

    def __init__(self, path: str, *, busy_timeout_s: float = 30.0, batch_max: int = 256) -> None:
        self.path = os.path.abspath(path)
        self.busy_timeout_s = busy_timeout_s
        self.batch_max = batch_max
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._sqlite_thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._stopped = threading.Event()
        #: Batches run (transactions committed or read-only batches): for tests and stats.
        self.batches = 0
        #: ``get_row`` reads served by a statement shared with others of a run.
        self.shared_reads = 0
        #: Operations submitted and not answered yet (the loop's count): what a close that
        #: gives up on the thread (a lock held elsewhere, see :meth:`close`) leaves undone.
        self.in_flight = 0

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("running" if self._sqlite_thread else "idle")
        return f"SQLiteEngine({self.path!r}, {state})"

    # --- the loop side ------------------------------------------------------------------------

    def submit(self, op: TableOp) -> asyncio.Future[Reply]:
        loop = asyncio.get_running_loop()
        # Answered straight into the scope's flight (read_answer.BackendAnswer).
        future: asyncio.Future[Reply] = BackendAnswer(loop=loop)
        if self._closed:
            future.set_result(Reply.failure("blockdb: the SQLite engine is closed", retryable=True))
            return future
        if self._sqlite_thread is None:
            self._start()
        self.in_flight += 1  # down again as its reply is delivered (_deliver)
        self._queue.put((op, future, loop))
        return future

    def _deliver(self, results: list[tuple[asyncio.Future[Reply], Reply]]) -> None:
        """On the loop: a batch of replies (a future cancelled meanwhile is skipped)."""
        self.in_flight -= len(results)
        for future, reply in results:
            if not future.done():
                future.set_result(reply)

    def _start(self) -> None:
        with self._lock:
            if self._sqlite_thread is None:
                thread = threading.Thread(
                    target=self._run, name="blockx-blockdb-sqlite", daemon=True
                )
                thread.start()
                self._sqlite_thread = thread

    async def close(self) -> None:
        """Finish what is queued, close the connection, stop the thread. Idempotent.

        The thread may be waiting for another connection's lock (up to ``busy_timeout_s``,
        which SQLite does not let anyone cut short): a caller that cannot wait that long
        bounds this with ``asyncio.wait_for``; cancelled, it leaves the thread (a daemon)
        to finish or die with the process, and :attr:`in_flight` says what is undone."""
        if self._closed:
            return
        self._closed = True
        thread = self._sqlite_thread
        if thread is None:
            return
        self._queue.put(_STOP)
        while not self._stopped.is_set():  # no thread of ours to join the thread
            await asyncio.sleep(0.005)
        thread.join(timeout=1.0)

    # --- the thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        conn: sqlite3.Connection | None = None
        known: set[str] = set()
        try:
            while True:
                first = self._queue.get()
                batch: list[_Job] = []
                stop = first is _STOP
                if first is not None:
                    batch.append(first)
                while len(batch) < self.batch_max and not stop:
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if item is None:
                        stop = True
                    else:
                        batch.append(item)
                if batch:
                    if conn is None:
                        try:
                            conn = self._connect()
                        except Exception as exc:
                            self._fail_all(
                                batch,
                                Reply.failure(
                                    f"blockdb: cannot open the SQLite file {self.path}: {exc}",
                                    retryable=False,
                                ),
                            )
                            conn = None
                            if stop:
                                return
                            continue
                    self._run_batch(conn, known, batch)
                if stop:
                    return
        finally:
            if conn is not None:
                try:
                    conn.close()
                except sqlite3.Error:  # pragma: no cover
                    pass
            self._fail_leftovers()
            self._stopped.set()

    def _connect(self) -> sqlite3.Connection:
        directory = os.path.dirname(self.path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        conn = sqlite3.connect(
            self.path, timeout=self.busy_timeout_s, isolation_level=None, check_same_thread=True
        )
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_s * 1000)}")
        return conn

    def _fail_all(self, batch: Iterable[_Job], reply: Reply) -> None:
        self._send([(job, reply) for job in batch])

    def _fail_leftovers(self) -> None:
        leftovers: list[_Job] = []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                leftovers.append(item)
        if leftovers:
            self._fail_all(
                leftovers,
                Reply.failure(
                    "blockdb: the SQLite engine closed before the request ran", retryable=True
                ),
            )

    def _send(self, results: list[tuple[_Job, Reply]]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Reply], Reply]]] = {}
        for (_op, future, loop), reply in results:
            by_loop.setdefault(loop, []).append((future, reply))
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(self._deliver, items)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                pass

    def _run_batch(self, conn: sqlite3.Connection, known: set[str], batch: list[_Job]) -> None:
        results: list[tuple[_Job, Reply]] = []
        first_write: int | None = None
        # A BEGIN that failed on a locked file: the batch's other writes fail with it at
        # once, rather than waiting one busy timeout each.
        locked: sqlite3.Error | None = None
        count = len(batch)
        i = 0
        while i < count:
            start = i
            job = batch[i]
            op = job[0]
            i += 1
            if type(op) is GetRow:
                # A run of get_row of one table (no write between them, so they see the
                # same rows): one SELECT ... IN for all of them.
                while (
                    i < count
                    and type(batch[i][0]) is GetRow
                    and batch[i][0].sql_table == op.sql_table
                ):
                    i += 1
                if i - start > 1:
                    results += self._get_row_run(conn, known, batch[start:i])
                    continue
            if op.write and first_write is None:
                if locked is None:
                    try:
                        conn.execute("BEGIN IMMEDIATE")
                    except sqlite3.Error as exc:
                        if _is_locked(exc):
                            locked = exc
                        results.append((job, _error_reply(self.path, exc, op)))
                        continue
                    first_write = len(results)
                else:
                    results.append((job, _error_reply(self.path, locked, op)))
                    continue
            try:
                if op.write:
                    conn.execute("SAVEPOINT op")
                    try:
                        raw = self._execute(conn, known, op)
                    except BaseException:
                        conn.execute("ROLLBACK TO op")
                        conn.execute("RELEASE op")
                        raise
                    conn.execute("RELEASE op")
                else:
                    raw = self._execute(conn, known, op)
                reply = op.finish(raw)
            except Exception as failure:  # own name: mypyc types a name once
                if op.write and first_write == len(results) and not conn.in_transaction:
                    first_write = None  # the transaction is gone with its first write
                reply = _error_reply(self.path, failure, op)
            results.append((job, reply))
        if first_write is not None:
            try:
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
                known.clear()  # a rolled-back CREATE TABLE is gone again
                failed = Reply.failure(
                    f"blockdb: SQLite {self.path}: commit failed: {exc}", retryable=True
                )
                results[first_write:] = [(job, failed) for job, _ in results[first_write:]]
        self.batches += 1
        self._send(results)

    def _get_row_run(
        self, conn: sqlite3.Connection, known: set[str], jobs: list[_Job]
    ) -> list[tuple[_Job, Reply]]:
        """Several ``get_row`` of one table, in one statement (as ``get_rows`` reads them);
        each job gets the reply its own ``get_row`` would have had."""
        first = jobs[0][0]
        keys: list[str] = []
        for job in jobs:
            op = job[0]
            assert isinstance(op, GetRow)
            keys.append(op.key)
        try:
            found = self._execute(conn, known, GetRows(first.table, first.sql_table, keys))
        except Exception as failure:  # own name: mypyc types a name once
            return [(job, _error_reply(self.path, failure, job[0])) for job in jobs]
        self.shared_reads += len(jobs)
        rows: dict[str, str] = found or {}
        out: list[tuple[_Job, Reply]] = []
        for job in jobs:
            op = job[0]
            assert isinstance(op, GetRow)
            try:
                reply = op.finish(rows.get(op.key))
            except Exception as bad_row:
                reply = _error_reply(self.path, bad_row, op)
            out.append((job, reply))
        return out

    # --- statements -----------------------------------------------------------------------------

    @staticmethod
    def _exists(conn: sqlite3.Connection, known: set[str], op: TableOp) -> bool:
        name = op.raw_table
        if name in known:
            return True
        row = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)
        ).fetchone()
        if row is not None:
            known.add(name)
            return True
        return False

    def _execute(self, conn: sqlite3.Connection, known: set[str], op: TableOp) -> Any:
        try:
            return self._statement(conn, known, op)
        except sqlite3.OperationalError as exc:
            if "no such table" not in str(exc):
                raise
            # Dropped behind our back: forget it and answer as for a missing table.
            known.discard(op.raw_table)
            if type(op) is Upsert:
                return self._statement(conn, known, op)
            return None

    def _statement(self, conn: sqlite3.Connection, known: set[str], op: TableOp) -> Any:
        table = op.sql_table
        kind = type(op)
        if kind is Upsert:
            assert isinstance(op, Upsert)
            if op.raw_table not in known:
                conn.execute(
                    f"CREATE TABLE IF NOT EXISTS {table} "
                    "(key TEXT PRIMARY KEY NOT NULL, row TEXT NOT NULL) WITHOUT ROWID"
                )
                known.add(op.raw_table)
            conn.executemany(
                f"INSERT INTO {table} (key, row) VALUES (?, ?) "
                "ON CONFLICT (key) DO UPDATE SET row = excluded.row",
                op.items,
            )
            return len(op.items)
        if not self._exists(conn, known, op):
            return None
        if kind is GetRow:
            assert isinstance(op, GetRow)
            found = conn.execute(f"SELECT row FROM {table} WHERE key = ?", (op.key,)).fetchone()
            return None if found is None else found[0]
        if kind is GetRows:
            assert isinstance(op, GetRows)
            rows: dict[str, str] = {}
            unique = op.unique
            for start in range(0, len(unique), _CHUNK):
                chunk = unique[start : start + _CHUNK]
                marks = ",".join("?" * len(chunk))
                rows.update(
                    conn.execute(f"SELECT key, row FROM {table} WHERE key IN ({marks})", chunk)
                )
            return rows
        if kind is Scan:
            assert isinstance(op, Scan)
            where = " AND ".join(f"key {operator} ?" for operator, _ in op.conditions)
            sql = (
                f"SELECT key, row FROM {table}"
                + (f" WHERE {where}" if where else "")
                + f" ORDER BY key {'DESC' if op.descending else 'ASC'} LIMIT ?"
            )
            args = [value for _, value in op.conditions]
            args.append(op.limit)  # type: ignore[arg-type]
            return conn.execute(sql, args).fetchall()
        if kind is Delete:
            assert isinstance(op, Delete)
            deleted = 0
            for start in range(0, len(op.keys), _CHUNK):
                chunk = op.keys[start : start + _CHUNK]
                marks = ",".join("?" * len(chunk))
                deleted += conn.execute(
                    f"DELETE FROM {table} WHERE key IN ({marks})", chunk
                ).rowcount
            return deleted
        raise TypeError(f"unknown blockdb operation {op!r}")  # pragma: no cover
