"""The durable state of ``blockx serve``: tasks, their calls, rows and failures, in SQLite.

Theory of operation (the guarantee in users' words: docs/serve.md, "Durability")
-------------------------------------------------------------------------------
One file, ``DATA_DIR/serve.sqlite3`` (the directory made ``0o700``, the file
``0o600``), opened with the standard library's :mod:`sqlite3` in write-ahead-log
mode. Five tables:

* ``tasks``: one row per task, everything :class:`TaskRecord` shows: the spec the
  runner rebuilds the task from (JSON bytes), the state, the counters (``calls``
  known, ``done`` settled, ``succeeded`` / ``failed`` / ``cancelled``, ``rows``),
  the times, the summary and failure (JSON). ``seq`` (the integer primary key)
  is the creation order: listings and the restart queue sort by it, never by a
  float time.
* ``calls(id, first_call, count, body)``: the task's calls, a blob of JSON Lines
  per chunk (the inline list at creation, then one per ``append_calls``). The
  chunks tile ``[0, calls)``.
* ``rows(id, first_row, count, body)``: the task's rows, a blob of JSON Lines
  (each line ends in ``\\n``) per settled batch. The blobs tile ``[0, rows)``.
* ``failures(id, call_index, record)``: the failure record of each finally
  failed call (JSON, no newline).
* ``schema_version``: one row; a file written by a newer schema is refused.

**One transaction per change.** Every method that writes runs ``BEGIN
IMMEDIATE`` ... ``COMMIT`` around all it changes, so a reader (or a restart)
sees all of a change or none of it: a batch's rows, its failure records and the
counters move together, and ``rows`` in ``tasks`` always equals the rows stored.

**Idempotent settle.** A batch names the position of its first call.
:meth:`TaskStore.settle_batch` applies it only when that position is the
task's ``done``; otherwise (a batch already persisted, replayed after a
restart) it writes nothing and returns False. The caller settles batches in
call order: a batch ahead of ``done`` (a gap) is refused the same way, so it
must be held until the batches before it are stored. Since calls settle in order,
``done`` is also the point a restarted task resumes from: the calls before it
are never run again, and each row is stored exactly once.

**What survives.** A committed transaction survives ``kill -9`` of the process
in both modes: in WAL mode the commit is in the log file (the operating
system's page cache) before ``COMMIT`` returns. With ``synchronous=NORMAL``
(the default) the log is synced to the disk only at checkpoints, so a power
loss or an operating system crash may lose the last commits (never leaving a
half transaction: the database goes back to an earlier commit).
``synchronous="FULL"`` syncs the log at every commit, so a commit also survives
a power loss, at the cost of one fsync per transaction.

**Threads.** The connection is made with ``check_same_thread=False``; the caller
uses the store from one thread at a time (the server: one worker thread). There
is no lock here.

Errors: a caller's mistake raises ``ValueError`` (a bad count or state),
``KeyError`` (an unknown task) or :class:`TaskClosed`; a failure of the
database file raises :class:`StoreError` naming the file; either way the
transaction is rolled back and nothing of it is stored.
"""

from __future__ import annotations

import builtins
import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

import orjson

#: The schema this module writes and reads; a file with a higher one is refused.
SCHEMA_VERSION: Final = 1
#: The database file's name inside the data directory.
DATABASE_NAME: Final = "serve.sqlite3"
#: How long a statement waits for another connection's write lock.
BUSY_TIMEOUT_MS: Final = 10_000

TaskState = Literal["queued", "running", "succeeded", "failed", "cancelled"]
#: Every state, in the order of a task's life.
STATES: Final[tuple[TaskState, ...]] = ("queued", "running", "succeeded", "failed", "cancelled")
#: The states of a finished task (its figures are final).
FINISHED_STATES: Final[frozenset[str]] = frozenset({"succeeded", "failed", "cancelled"})
Synchronous = Literal["NORMAL", "FULL"]

# SQLite's primary result codes for a file that is not (or no longer) a database.
_SQLITE_CORRUPT: Final = 11
_SQLITE_NOTADB: Final = 26

_SCHEMA: Final = (
    "CREATE TABLE schema_version (version INTEGER NOT NULL)",
    """CREATE TABLE tasks (
        seq INTEGER PRIMARY KEY,          -- creation order
        id TEXT NOT NULL UNIQUE,
        task_id TEXT NOT NULL,
        instance TEXT,
        state TEXT NOT NULL,
        spec BLOB NOT NULL,
        streamed INTEGER NOT NULL,
        closed INTEGER NOT NULL,
        calls INTEGER NOT NULL,           -- calls known: the calls chunks tile [0, calls)
        done INTEGER NOT NULL,            -- calls settled, in order: [0, done)
        succeeded INTEGER NOT NULL,
        failed INTEGER NOT NULL,
        cancelled INTEGER NOT NULL,
        rows INTEGER NOT NULL,            -- rows stored: the rows blobs tile [0, rows)
        created_at REAL NOT NULL,
        started_at REAL,
        ended_at REAL,
        summary BLOB,                     -- JSON
        failure BLOB,                     -- JSON
        cancel_reason TEXT                -- a cancel asked for, kept across a restart
    )""",
    "CREATE INDEX tasks_by_state ON tasks (state, seq)",
    """CREATE TABLE calls (
        id TEXT NOT NULL, first_call INTEGER NOT NULL, count INTEGER NOT NULL, body BLOB NOT NULL,
        PRIMARY KEY (id, first_call)
    )""",
    """CREATE TABLE rows (
        id TEXT NOT NULL, first_row INTEGER NOT NULL, count INTEGER NOT NULL, body BLOB NOT NULL,
        PRIMARY KEY (id, first_row)
    )""",
    """CREATE TABLE failures (
        id TEXT NOT NULL, call_index INTEGER NOT NULL, record BLOB NOT NULL,
        PRIMARY KEY (id, call_index)
    )""",
)

#: The columns of ``tasks`` a :class:`TaskRecord` holds, in its fields' order.
_TASK_FIELDS: Final = tuple(
    "id task_id instance state spec streamed closed calls done succeeded failed cancelled rows"
    " created_at started_at ended_at summary failure cancel_reason".split()
)
_TASK_COLUMNS: Final = ", ".join(_TASK_FIELDS)

# The blob holding call (row) ?2 is the last one starting at or before it (the blobs
# tile the range); the primary key's index finds it, and the blobs after it, without a
# scan of the task's other blobs (tests/serve/test_store.py checks the query plans).
#: Call chunks of task ?1 from the one holding call ?2 on, in order.
_CALL_CHUNKS_FROM: Final = (
    "SELECT first_call, count, body FROM calls WHERE id = ?1"
    " AND first_call >= coalesce((SELECT first_call FROM calls WHERE id = ?1"
    "   AND first_call <= ?2 ORDER BY first_call DESC LIMIT 1), 0)"
    " AND first_call + count > ?2 ORDER BY first_call"
)
#: Rows blobs of task ?1 from the one holding row ?2 on, in order.
_ROWS_FROM: Final = (
    "SELECT first_row, count, body FROM rows WHERE id = ?1"
    " AND first_row >= (SELECT first_row FROM rows WHERE id = ?1"
    "   AND first_row <= ?2 ORDER BY first_row DESC LIMIT 1)"
    " ORDER BY first_row"
)


class StoreError(Exception):
    """The database file cannot be used: not a database, a newer schema, an IO failure.

    The message names the file and says why (and, where there is one, what to do).
    """


class TaskClosed(Exception):
    """Calls appended to a task that takes no more: closed, finished, or not streamed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NewTask:
    """A task as submitted, stored by :meth:`TaskStore.create_task` (state ``queued``)."""

    id: str
    task_id: str
    instance: str | None
    #: JSON of what the runner needs to rebuild the task (functions, policy, audit, ids).
    spec: bytes
    #: True: calls arrive later (``append_calls``) until ``close_calls``; False: all are here.
    streamed: bool
    #: JSON Lines, one call per line (``calls_count`` lines), or None for no calls yet.
    calls_body: bytes | None
    calls_count: int
    created_at: float

    def __repr__(self) -> str:
        kind = "streamed" if self.streamed else "inline"
        return (
            f"NewTask(id={self.id!r}, task_id={self.task_id!r}, instance={self.instance!r},"
            f" {kind}, calls={self.calls_count})"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class SettledBatch:
    """Calls ``[first_call, first_call + call_count)`` settled: their rows and failures.

    ``rows_body`` holds ``row_count`` JSON Lines (a missing final newline is
    added); ``failures`` the ``(call index, JSON record)`` of each call that
    finally failed.
    """

    first_call: int
    call_count: int
    rows_body: bytes
    row_count: int
    failures: tuple[tuple[int, bytes], ...]
    succeeded: int
    failed: int
    cancelled: int

    def __repr__(self) -> str:
        end = self.first_call + self.call_count
        return (
            f"SettledBatch(calls=[{self.first_call}, {end}), rows={self.row_count},"
            f" succeeded={self.succeeded}, failed={self.failed}, cancelled={self.cancelled},"
            f" failures={len(self.failures)})"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskRecord:
    """A task as stored: every column of ``tasks`` (``summary`` and ``failure`` decoded)."""

    id: str
    task_id: str
    instance: str | None
    state: TaskState
    spec: bytes
    streamed: bool
    closed: bool
    calls: int
    done: int
    succeeded: int
    failed: int
    cancelled: int
    rows: int
    created_at: float
    started_at: float | None
    ended_at: float | None
    summary: dict[str, Any] | None
    failure: dict[str, Any] | None
    #: Why a cancel was asked for (``request_cancel``), until the task ends cancelled: a
    #: server that restarts first ends the task instead of running it again.
    cancel_reason: str | None = None

    @property
    def finished(self) -> bool:
        """True once the task succeeded, failed or was cancelled: its figures are final."""
        return self.state in FINISHED_STATES

    def __repr__(self) -> str:
        flags = ("streamed" if self.streamed else "inline") + (", closed" if self.closed else "")
        return (
            f"TaskRecord(id={self.id!r}, task_id={self.task_id!r}, instance={self.instance!r},"
            f" state={self.state}, {flags}, calls={self.calls}, done={self.done},"
            f" succeeded={self.succeeded}, failed={self.failed}, cancelled={self.cancelled},"
            f" rows={self.rows})"
        )


class TaskStore:
    """The service's tasks in ``DATA_DIR/serve.sqlite3`` (module docstring: how and what survives).

    Open it once per process (the server, at start) and :meth:`close` it at exit.
    Every method is synchronous and runs one transaction.
    """

    data_dir: Path
    path: Path
    synchronous: Synchronous
    _connection: sqlite3.Connection | None

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        synchronous: Synchronous = "NORMAL",
        busy_timeout_ms: int = BUSY_TIMEOUT_MS,
    ) -> None:
        """Open (or create) the store; StoreError when the file cannot be used, saying why."""
        if synchronous not in ("NORMAL", "FULL"):
            raise ValueError(f"synchronous must be 'NORMAL' or 'FULL', got {synchronous!r}")
        self.data_dir = Path(data_dir)
        self.path = self.data_dir / DATABASE_NAME
        self.synchronous = synchronous
        self._connection = None
        _make_private_directory(self.data_dir)
        _make_private_file(self.path)
        try:
            connection = sqlite3.connect(
                self.path,
                timeout=busy_timeout_ms / 1000,
                isolation_level=None,  # transactions are explicit: BEGIN IMMEDIATE ... COMMIT
                check_same_thread=False,
            )
        except sqlite3.Error as error:
            raise StoreError(f"{self.path}: cannot open the database: {error}") from error
        try:
            connection.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            mode = connection.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(
                    f"{self.path}: cannot use write-ahead logging (journal mode stays {mode!r});"
                    " put the data directory on a local file system"
                )
            connection.execute(f"PRAGMA synchronous = {synchronous}")
            self._check_schema(connection)
        except sqlite3.Error as error:
            connection.close()
            raise self._error(error, "cannot open the database") from error
        except BaseException:
            connection.close()
            raise
        self._connection = connection

    def __repr__(self) -> str:
        state = "closed" if self._connection is None else "open"
        return f"TaskStore({str(self.path)!r}, synchronous={self.synchronous}, {state})"

    def close(self) -> None:
        """Close the database (committed work is on disk already); later calls raise StoreError."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    # ---- writes -----------------------------------------------------------------------------

    def create_task(self, rec: NewTask) -> None:
        """Store a new task, ``queued``, with its inline calls; ValueError if the id exists."""
        body = _checked_lines(rec.calls_body or b"", rec.calls_count, "calls_body")
        with self._write() as connection:
            if connection.execute("SELECT 1 FROM tasks WHERE id = ?", (rec.id,)).fetchone():
                raise ValueError(f"task {rec.id} exists already")
            connection.execute(
                f"INSERT INTO tasks ({_TASK_COLUMNS}) VALUES"
                " (?, ?, ?, 'queued', ?, ?, ?, ?, 0, 0, 0, 0, 0, ?, NULL, NULL, NULL, NULL, NULL)",
                (
                    rec.id,
                    rec.task_id,
                    rec.instance,
                    rec.spec,
                    rec.streamed,
                    not rec.streamed,  # an inline task's calls are all known: it is closed
                    rec.calls_count,
                    rec.created_at,
                ),
            )
            if rec.calls_count:
                connection.execute(
                    "INSERT INTO calls (id, first_call, count, body) VALUES (?, 0, ?, ?)",
                    (rec.id, rec.calls_count, body),
                )

    def append_calls(self, id: str, body: bytes, count: int) -> int:
        """Append ``count`` calls (JSON Lines) to a streamed task; return its calls known now.

        Raises KeyError for an unknown task, TaskClosed (saying which) when the
        task is not streamed, finished or closed; then nothing is appended.
        """
        body = _checked_lines(body, count, "body")
        with self._write() as connection:
            row = connection.execute(
                "SELECT streamed, closed, state, calls FROM tasks WHERE id = ?", (id,)
            ).fetchone()
            if row is None:
                raise KeyError(id)
            streamed, closed, state, calls = row
            if not streamed:
                raise TaskClosed(f"task {id} is not streamed: its calls came with it")
            if state in FINISHED_STATES:
                raise TaskClosed(f"task {id} is finished ({state}): it takes no more calls")
            if closed:
                raise TaskClosed(f"task {id} is closed: it takes no more calls")
            if count:
                connection.execute(
                    "INSERT INTO calls (id, first_call, count, body) VALUES (?, ?, ?, ?)",
                    (id, calls, count, body),
                )
                connection.execute("UPDATE tasks SET calls = ? WHERE id = ?", (calls + count, id))
            return int(calls) + count

    def request_cancel(self, id: str, reason: str) -> bool:
        """Record that the task is to be cancelled (kept across a restart); False when it
        had finished already or a cancel was recorded before. KeyError for an unknown id."""
        with self._write() as connection:
            self._require(connection, id)
            changed = connection.execute(
                "UPDATE tasks SET cancel_reason = ? WHERE id = ? AND cancel_reason IS NULL"
                " AND state NOT IN ('succeeded', 'failed', 'cancelled')",
                (reason, id),
            ).rowcount
        return changed > 0

    def close_calls(self, id: str) -> None:
        """No more calls for this task (a no-op when it is closed already); KeyError if unknown."""
        with self._write() as connection:
            cursor = connection.execute("UPDATE tasks SET closed = 1 WHERE id = ?", (id,))
            if cursor.rowcount == 0:
                raise KeyError(id)

    def mark_started(self, id: str, at: float) -> None:
        """State ``running``; ``started_at`` set the first time only (a resumed task keeps it).

        A finished task is left as it is. KeyError for an unknown task.
        """
        with self._write() as connection:
            cursor = connection.execute(
                "UPDATE tasks SET state = 'running', started_at = coalesce(started_at, ?)"
                " WHERE id = ? AND state IN ('queued', 'running')",
                (at, id),
            )
            if cursor.rowcount == 0:
                self._require(connection, id)

    def settle_batch(self, id: str, b: SettledBatch) -> bool:
        """Persist a settled batch in one transaction; False (nothing written) for a replay.

        The batch is applied only when ``b.first_call`` is the task's ``done`` and
        the task is not finished; its rows get positions ``[rows, rows +
        row_count)``. ValueError for a batch that is malformed (counts that do not
        match the body, calls past those known); KeyError for an unknown task.
        """
        if b.call_count < 0 or b.first_call < 0:
            raise ValueError(f"{b!r}: negative call position or count")
        if min(b.succeeded, b.failed, b.cancelled) < 0:
            raise ValueError(f"{b!r}: negative counter")
        if b.call_count == 0:
            if b.row_count or b.failures:
                raise ValueError(f"{b!r}: rows or failures without calls")
            return False
        rows_body = _checked_lines(b.rows_body, b.row_count, "rows_body")
        with self._write() as connection:
            row = connection.execute(
                "SELECT state, calls, done, rows FROM tasks WHERE id = ?", (id,)
            ).fetchone()
            if row is None:
                raise KeyError(id)
            state, calls, done, rows = row
            if state in FINISHED_STATES or b.first_call != done:
                return False
            if b.first_call + b.call_count > calls:
                raise ValueError(f"{b!r}: past the {calls} calls task {id} has")
            if b.row_count:
                connection.execute(
                    "INSERT INTO rows (id, first_row, count, body) VALUES (?, ?, ?, ?)",
                    (id, rows, b.row_count, rows_body),
                )
            if b.failures:
                connection.executemany(
                    "INSERT OR REPLACE INTO failures (id, call_index, record) VALUES (?, ?, ?)",
                    [(id, index, record) for index, record in b.failures],
                )
            connection.execute(
                "UPDATE tasks SET done = done + ?, succeeded = succeeded + ?,"
                " failed = failed + ?, cancelled = cancelled + ?, rows = rows + ? WHERE id = ?",
                (b.call_count, b.succeeded, b.failed, b.cancelled, b.row_count, id),
            )
            return True

    def finish(
        self,
        id: str,
        state: str,
        at: float,
        summary: dict[str, Any] | None,
        failure: dict[str, Any] | None,
    ) -> None:
        """The task ended: its final state, ``ended_at``, summary and failure (JSON-encodable).

        ValueError for a state that is not a finished one; KeyError for an unknown task.
        """
        if state not in FINISHED_STATES:
            raise ValueError(f"a task finishes as one of {sorted(FINISHED_STATES)}, not {state!r}")
        summary_json = None if summary is None else orjson.dumps(summary)
        failure_json = None if failure is None else orjson.dumps(failure)
        with self._write() as connection:
            cursor = connection.execute(
                "UPDATE tasks SET state = ?, ended_at = ?, summary = ?, failure = ? WHERE id = ?",
                (state, at, summary_json, failure_json, id),
            )
            if cursor.rowcount == 0:
                raise KeyError(id)

    def requeue_unfinished(self) -> builtins.list[TaskRecord]:
        """At start: every ``running`` task back to ``queued``; return all queued, oldest first."""
        with self._write() as connection:
            connection.execute("UPDATE tasks SET state = 'queued' WHERE state = 'running'")
            return [
                _record(row)
                for row in connection.execute(
                    f"SELECT {_TASK_COLUMNS} FROM tasks WHERE state = 'queued' ORDER BY seq"
                )
            ]

    def purge(self, id: str) -> bool:
        """Delete the task and all its data, whatever its state; False if there was none."""
        with self._write() as connection:
            return self._delete(connection, id)

    def expire(self, ended_before: float) -> int:
        """Purge every finished task that ended before ``ended_before``; how many."""
        with self._write() as connection:
            ids = [
                row[0]
                for row in connection.execute(
                    "SELECT id FROM tasks WHERE state IN ('succeeded', 'failed', 'cancelled')"
                    " AND ended_at < ?",
                    (ended_before,),
                )
            ]
            for id in ids:
                self._delete(connection, id)
            return len(ids)

    # ---- reads ------------------------------------------------------------------------------

    def get(self, id: str) -> TaskRecord | None:
        """The task, or None."""
        with self._read() as connection:
            row = connection.execute(
                f"SELECT {_TASK_COLUMNS} FROM tasks WHERE id = ?", (id,)
            ).fetchone()
            return None if row is None else _record(row)

    def call_chunks(self, id: str, start: int) -> builtins.list[tuple[int, int, bytes]]:
        """``(first, count, body)`` of every call chunk with ``first + count > start``, in order.

        KeyError for an unknown task.
        """
        with self._read() as connection:
            self._require(connection, id)
            return [
                (int(first), int(count), bytes(body))
                for first, count, body in connection.execute(_CALL_CHUNKS_FROM, (id, start))
            ]

    def rows_after(self, id: str, after: int, max_rows: int = 65536) -> tuple[bytes, int]:
        """JSON Lines of the stored rows ``[after, after + k)``, ``k <= max_rows``; and ``k``.

        Whole lines only, each ending in a newline; ``(b"", 0)`` when there is no
        row past ``after`` yet. KeyError for an unknown task.
        """
        if after < 0:
            raise ValueError(f"after must be >= 0, got {after}")
        with self._read() as connection:
            total = connection.execute("SELECT rows FROM tasks WHERE id = ?", (id,)).fetchone()
            if total is None:
                raise KeyError(id)
            if after >= total[0] or max_rows <= 0:
                return b"", 0
            parts: builtins.list[bytes] = []
            taken = 0
            cursor = connection.execute(_ROWS_FROM, (id, after))
            for first, count, body in cursor:
                skip = max(after - first, 0)
                take = min(count - skip, max_rows - taken)
                if skip == 0 and take == count:
                    parts.append(body)
                else:
                    lines = body.split(b"\n")
                    parts.append(b"\n".join(lines[skip : skip + take]) + b"\n")
                taken += take
                if taken >= max_rows:
                    break
            cursor.close()
            return b"".join(parts), taken

    def failures(self, id: str) -> builtins.list[bytes]:
        """The failure records (JSON, no newline) of the task's failed calls, by call index."""
        with self._read() as connection:
            self._require(connection, id)
            return [
                bytes(row[0])
                for row in connection.execute(
                    "SELECT record FROM failures WHERE id = ? ORDER BY call_index", (id,)
                )
            ]

    def counts_by_state(self) -> dict[str, int]:
        """How many tasks are in each state (every state named, zeros included)."""
        counts: dict[str, int] = dict.fromkeys(STATES, 0)
        with self._read() as connection:
            for state, count in connection.execute(
                "SELECT state, count(*) FROM tasks GROUP BY state"
            ):
                counts[state] = int(count)
        return counts

    def list(self, state: str | None = None) -> builtins.list[TaskRecord]:
        """Every task (in ``state`` when given), oldest first; ValueError for an unknown state."""
        if state is not None and state not in STATES:
            raise ValueError(f"state must be one of {list(STATES)}, got {state!r}")
        with self._read() as connection:
            if state is None:
                rows = connection.execute(f"SELECT {_TASK_COLUMNS} FROM tasks ORDER BY seq")
            else:
                rows = connection.execute(
                    f"SELECT {_TASK_COLUMNS} FROM tasks WHERE state = ? ORDER BY seq", (state,)
                )
            return [_record(row) for row in rows]

    def newest(self, state: str, limit: int) -> builtins.list[TaskRecord]:
        """The ``limit`` newest tasks in ``state``, newest first (the dashboard's list)."""
        if state not in STATES:
            raise ValueError(f"state must be one of {list(STATES)}, got {state!r}")
        with self._read() as connection:
            rows = connection.execute(
                f"SELECT {_TASK_COLUMNS} FROM tasks WHERE state = ? ORDER BY seq DESC LIMIT ?",
                (state, limit),
            )
            return [_record(row) for row in rows]

    # ---- internals --------------------------------------------------------------------------

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: all of the block's changes are committed, or none."""
        with self._transaction("BEGIN IMMEDIATE") as connection:
            yield connection

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """One read transaction: the block's queries see one snapshot."""
        with self._transaction("BEGIN") as connection:
            yield connection

    @contextmanager
    def _transaction(self, begin: str) -> Iterator[sqlite3.Connection]:
        connection = self._connection
        if connection is None:
            raise StoreError(f"{self.path}: the store is closed")
        try:
            connection.execute(begin)
            try:
                yield connection
                connection.execute("COMMIT")
            finally:
                if connection.in_transaction:  # an exception, or a COMMIT that failed
                    connection.execute("ROLLBACK")
        except sqlite3.Error as error:
            raise self._error(error, "database error") from error

    def _check_schema(self, connection: sqlite3.Connection) -> None:
        """Create the tables in a new file; refuse a file of something else or a newer schema."""
        connection.execute("BEGIN IMMEDIATE")
        try:
            tables = {
                row[0]
                for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            }
            if "schema_version" not in tables:
                if tables:
                    raise StoreError(
                        f"{self.path}: an SQLite database of something else (tables:"
                        f" {', '.join(sorted(tables))}); move it away or start with another"
                        " --data-dir"
                    )
                for statement in _SCHEMA:
                    connection.execute(statement)
                connection.execute(
                    "INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,)
                )
            else:
                query = "SELECT max(version) FROM schema_version"
                version = connection.execute(query).fetchone()[0]
                if not isinstance(version, int):
                    raise StoreError(
                        f"{self.path}: damaged (no schema version); move it away or start with"
                        " another --data-dir"
                    )
                if version > SCHEMA_VERSION:
                    raise StoreError(
                        f"{self.path}: written by a newer BlockX (store schema {version}; this"
                        f" BlockX reads up to {SCHEMA_VERSION}); run that BlockX or a newer one,"
                        " or start with another --data-dir"
                    )
                # Older schemas would be migrated here; version 1 is the first.
            connection.execute("COMMIT")
        finally:
            if connection.in_transaction:
                connection.execute("ROLLBACK")

    def _error(self, error: sqlite3.Error, doing: str) -> StoreError:
        code = getattr(error, "sqlite_errorcode", None)
        if code is not None and code & 0xFF in (_SQLITE_CORRUPT, _SQLITE_NOTADB):
            return StoreError(
                f"{self.path}: not a BlockX serve database, or damaged ({error}); move the file"
                " away (keep it if its tasks matter) or start with another --data-dir"
            )
        return StoreError(f"{self.path}: {doing}: {error}")

    @staticmethod
    def _require(connection: sqlite3.Connection, id: str) -> None:
        if connection.execute("SELECT 1 FROM tasks WHERE id = ?", (id,)).fetchone() is None:
            raise KeyError(id)

    @staticmethod
    def _delete(connection: sqlite3.Connection, id: str) -> bool:
        if connection.execute("DELETE FROM tasks WHERE id = ?", (id,)).rowcount == 0:
            return False
        for table in ("calls", "rows", "failures"):
            connection.execute(f"DELETE FROM {table} WHERE id = ?", (id,))
        return True


def _record(row: tuple[Any, ...]) -> TaskRecord:
    values: dict[str, Any] = dict(zip(_TASK_FIELDS, row, strict=True))
    summary, failure = values["summary"], values["failure"]
    values["spec"] = bytes(values["spec"])
    values["streamed"] = bool(values["streamed"])
    values["closed"] = bool(values["closed"])
    values["summary"] = None if summary is None else orjson.loads(summary)
    values["failure"] = None if failure is None else orjson.loads(failure)
    return TaskRecord(**values)


def _checked_lines(body: bytes, count: int, what: str) -> bytes:
    """``body`` as ``count`` newline-terminated lines (a missing last newline added)."""
    if count < 0:
        raise ValueError(f"{what}: negative count {count}")
    if count == 0:
        if body:
            raise ValueError(f"{what}: {len(body)} bytes for a count of 0")
        return body
    if not body:
        raise ValueError(f"{what}: empty for a count of {count}")
    if not body.endswith(b"\n"):
        body += b"\n"
    lines = body.count(b"\n")
    if lines != count:
        raise ValueError(f"{what} holds {lines} lines, its count says {count}")
    return body


def _make_private_directory(path: Path) -> None:
    """Create the data directory ``0o700`` (an existing one is used as it is)."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=False)
        path.chmod(0o700)  # mkdir's mode is narrowed by the umask, never widened: make it exact
    except FileExistsError:
        if not path.is_dir():
            raise StoreError(f"{path}: exists and is not a directory") from None
    except OSError as error:
        raise StoreError(f"{path}: cannot create the data directory: {error}") from error


def _make_private_file(path: Path) -> None:
    """Create the database file ``0o600`` before SQLite does (its log files copy the mode)."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_RDWR, 0o600))
    except OSError as error:
        raise StoreError(f"{path}: cannot open the database file: {error}") from error
