"""``TaskStore`` (src/blockx/serve/store.py) on real SQLite files: the durable state of ``blockx serve``.

The issue's words under test: a task is on disk before its 201; each call's
outcome and its rows are appended durably in batches; after ``kill -9`` and a
restart on the same data dir every unfinished task resumes from what was
persisted, and ``rows?after=N`` gives every remaining row once.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import blockx.serve.store as store_module
from blockx.serve.store import (
    SCHEMA_VERSION,
    NewTask,
    SettledBatch,
    StoreError,
    TaskClosed,
    TaskStore,
)

ID1, ID2, ID3 = "t-0000000000000001", "t-0000000000000002", "t-0000000000000003"


def call_lines(first: int, count: int) -> bytes:
    return b"".join(b'{"function": "f", "args": [%d]}\n' % i for i in range(first, first + count))


def new_task(
    id: str = ID1, *, streamed: bool = False, calls: int = 3, created_at: float = 1000.25
) -> NewTask:
    return NewTask(
        id=id,
        task_id=f"task-{id[-1]}",
        instance="alpha",
        spec=b'{"functions": {"f": "def f(x): return x"}}',
        streamed=streamed,
        calls_body=call_lines(0, calls) if calls else None,
        calls_count=calls,
        created_at=created_at,
    )


def row_lines(first: int, count: int) -> bytes:
    return b"".join(b'{"row": %d}\n' % i for i in range(first, first + count))


def settled(
    first_call: int, call_count: int, first_row: int, row_count: int, failed: tuple[int, ...] = ()
) -> SettledBatch:
    return SettledBatch(
        first_call=first_call,
        call_count=call_count,
        rows_body=row_lines(first_row, row_count),
        row_count=row_count,
        failures=tuple((index, b'{"index": %d}' % index) for index in failed),
        succeeded=call_count - len(failed),
        failed=len(failed),
        cancelled=0,
    )


@pytest.fixture
def store(tmp_path: Path) -> Iterator[TaskStore]:
    opened = TaskStore(tmp_path / "data")
    yield opened
    opened.close()


# ---- tasks: create, get, list ---------------------------------------------------------------


def test_created_tasks_read_back_and_list_in_creation_order(store: TaskStore) -> None:
    # created_at runs backwards: the order is the creation order, not the float times
    for number, id in enumerate((ID1, ID2, ID3)):
        store.create_task(new_task(id, created_at=2000.0 - number))
    record = store.get(ID2)
    assert record is not None
    assert (record.id, record.task_id, record.instance, record.state) == (
        ID2,
        "task-2",
        "alpha",
        "queued",
    )
    assert record.spec == b'{"functions": {"f": "def f(x): return x"}}'
    assert (record.streamed, record.closed, record.calls, record.done, record.rows) == (
        False,
        True,
        3,
        0,
        0,
    )
    assert (record.created_at, record.started_at, record.ended_at) == (1999.0, None, None)
    assert (record.summary, record.failure, record.finished) == (None, None, False)
    assert "state=queued" in repr(record) and ID2 in repr(record)
    assert [r.id for r in store.list()] == [ID1, ID2, ID3]
    assert [r.id for r in store.list("queued")] == [ID1, ID2, ID3]
    assert store.list("running") == []
    assert store.get("t-ffffffffffffffff") is None
    assert store.call_chunks(ID1, 0) == [(0, 3, call_lines(0, 3))]
    assert store.counts_by_state() == {
        "queued": 3,
        "running": 0,
        "succeeded": 0,
        "failed": 0,
        "cancelled": 0,
    }


def test_a_duplicate_id_or_an_unknown_state_is_refused(store: TaskStore) -> None:
    store.create_task(new_task(ID1))
    with pytest.raises(ValueError, match="exists already"):
        store.create_task(new_task(ID1, calls=5))
    assert store.get(ID1).calls == 3  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="state must be one of"):
        store.list("done")


def test_calls_count_must_match_the_body(store: TaskStore) -> None:
    bad = NewTask(
        id=ID1,
        task_id="t",
        instance=None,
        spec=b"{}",
        streamed=False,
        calls_body=call_lines(0, 2),
        calls_count=3,
        created_at=1.0,
    )
    with pytest.raises(ValueError, match="2 lines, its count says 3"):
        store.create_task(bad)
    for body in (None, b""):
        with pytest.raises(ValueError, match="empty for a count of 1"):
            store.create_task(dataclasses.replace(bad, calls_body=body, calls_count=1))
    assert store.get(ID1) is None


# ---- streamed calls ------------------------------------------------------------------------


def test_a_streamed_task_takes_calls_until_closed(store: TaskStore) -> None:
    store.create_task(new_task(ID1, streamed=True, calls=0))
    record = store.get(ID1)
    assert record is not None and (record.streamed, record.closed, record.calls) == (True, False, 0)
    assert store.call_chunks(ID1, 0) == []
    assert store.append_calls(ID1, call_lines(0, 4), 4) == 4
    # a body without its last newline is taken, the newline added
    assert store.append_calls(ID1, call_lines(4, 3).rstrip(b"\n"), 3) == 7
    assert store.append_calls(ID1, b"", 0) == 7
    assert store.append_calls(ID1, call_lines(7, 2), 2) == 9
    chunks = [(0, 4, call_lines(0, 4)), (4, 3, call_lines(4, 3)), (7, 2, call_lines(7, 2))]
    assert store.call_chunks(ID1, 0) == chunks
    assert store.call_chunks(ID1, 3) == chunks
    assert store.call_chunks(ID1, 4) == chunks[1:]
    assert store.call_chunks(ID1, 8) == chunks[2:]
    assert store.call_chunks(ID1, 9) == []
    with pytest.raises(ValueError, match="1 lines, its count says 2"):
        store.append_calls(ID1, call_lines(9, 1), 2)
    store.close_calls(ID1)
    store.close_calls(ID1)  # closing twice is no error
    with pytest.raises(TaskClosed, match=f"task {ID1} is closed"):
        store.append_calls(ID1, call_lines(9, 1), 1)
    record = store.get(ID1)
    assert record is not None and (record.closed, record.calls) == (True, 9)


def test_calls_to_an_inline_finished_or_unknown_task_are_refused(store: TaskStore) -> None:
    store.create_task(new_task(ID1))
    with pytest.raises(TaskClosed, match="not streamed"):
        store.append_calls(ID1, call_lines(3, 1), 1)
    store.create_task(new_task(ID2, streamed=True, calls=0))
    store.finish(ID2, "cancelled", 5.0, None, None)
    with pytest.raises(TaskClosed, match=r"finished \(cancelled\)"):
        store.append_calls(ID2, call_lines(0, 1), 1)
    assert store.get(ID2).calls == 0  # type: ignore[union-attr]
    for method, args in (
        (store.append_calls, (call_lines(0, 1), 1)),
        (store.close_calls, ()),
        (store.call_chunks, (0,)),
        (store.rows_after, (0,)),
        (store.failures, ()),
        (store.mark_started, (1.0,)),
        (store.settle_batch, (settled(0, 1, 0, 1),)),
        (store.finish, ("succeeded", 1.0, None, None)),
    ):
        with pytest.raises(KeyError):
            method(ID3, *args)


# ---- settling batches ----------------------------------------------------------------------


def test_settled_batches_move_the_counters_and_a_replay_changes_nothing(store: TaskStore) -> None:
    store.create_task(new_task(ID1, calls=10))
    store.mark_started(ID1, 50.5)
    store.mark_started(ID1, 60.5)  # a resumed task keeps its first start
    record = store.get(ID1)
    assert record is not None and (record.state, record.started_at) == ("running", 50.5)
    assert store.settle_batch(ID1, settled(0, 4, 0, 3, failed=(2,)))
    assert store.settle_batch(ID1, settled(4, 2, 3, 0))  # no rows: no blob, counters move
    # the same batches again (a restart replaying what was persisted): nothing changes
    assert not store.settle_batch(ID1, settled(0, 4, 0, 3, failed=(2,)))
    assert not store.settle_batch(ID1, settled(4, 2, 3, 0))
    # a batch past `done` (a gap) is not applied either
    assert not store.settle_batch(ID1, settled(7, 1, 3, 1))
    cancelled = SettledBatch(
        first_call=6,
        call_count=4,
        rows_body=row_lines(3, 2),
        row_count=2,
        failures=(),
        succeeded=2,
        failed=0,
        cancelled=2,
    )
    assert store.settle_batch(ID1, cancelled)
    record = store.get(ID1)
    assert record is not None
    assert (record.done, record.succeeded, record.failed, record.cancelled, record.rows) == (
        10,
        7,
        1,
        2,
        5,
    )
    assert store.rows_after(ID1, 0) == (row_lines(0, 5), 5)
    assert store.failures(ID1) == [b'{"index": 2}']


def test_a_malformed_batch_is_refused_and_nothing_stored(store: TaskStore) -> None:
    store.create_task(new_task(ID1, calls=2))
    with pytest.raises(ValueError, match="past the 2 calls"):
        store.settle_batch(ID1, settled(0, 3, 0, 1))
    lying = SettledBatch(
        first_call=0,
        call_count=1,
        rows_body=row_lines(0, 2),
        row_count=1,
        failures=(),
        succeeded=1,
        failed=0,
        cancelled=0,
    )
    with pytest.raises(ValueError, match="holds 2 lines, its count says 1"):
        store.settle_batch(ID1, lying)
    with pytest.raises(ValueError, match="rows or failures without calls"):
        store.settle_batch(ID1, settled(0, 0, 0, 1))
    assert not store.settle_batch(ID1, settled(0, 0, 0, 0))
    record = store.get(ID1)
    assert record is not None and (record.done, record.rows) == (0, 0)
    assert store.rows_after(ID1, 0) == (b"", 0)


def test_rows_after_slices_across_batches_by_whole_lines(store: TaskStore) -> None:
    store.create_task(new_task(ID1, calls=6))
    # rows [0, 3) [3, 3) [3, 8) [8, 9) [9, 13)
    for first_call, first_row, count in ((0, 0, 3), (1, 3, 0), (2, 3, 5), (3, 8, 1), (4, 9, 4)):
        assert store.settle_batch(ID1, settled(first_call, 1, first_row, count))
    assert store.rows_after(ID1, 0) == (row_lines(0, 13), 13)
    assert store.rows_after(ID1, 2) == (row_lines(2, 11), 11)
    assert store.rows_after(ID1, 3) == (row_lines(3, 10), 10)
    assert store.rows_after(ID1, 7, max_rows=3) == (row_lines(7, 3), 3)
    assert store.rows_after(ID1, 4, max_rows=2) == (row_lines(4, 2), 2)
    assert store.rows_after(ID1, 12) == (row_lines(12, 1), 1)
    assert store.rows_after(ID1, 13) == (b"", 0)
    assert store.rows_after(ID1, 500) == (b"", 0)
    assert store.rows_after(ID1, 1, max_rows=0) == (b"", 0)
    with pytest.raises(ValueError, match="after must be >= 0"):
        store.rows_after(ID1, -1)
    # paging by max_rows from any point gives every row once
    for after in range(14):
        got, position = b"", after
        while True:
            body, count = store.rows_after(ID1, position, max_rows=4)
            if not count:
                break
            assert body.count(b"\n") == count and body.endswith(b"\n")
            got, position = got + body, position + count
        assert got == row_lines(after, 13 - after)


@pytest.mark.parametrize("query", [store_module._ROWS_FROM, store_module._CALL_CHUNKS_FROM])
def test_the_first_blob_is_found_by_the_index_not_a_scan(store: TaskStore, query: str) -> None:
    assert store._connection is not None
    plan = store._connection.execute(f"EXPLAIN QUERY PLAN {query}", (ID1, 5)).fetchall()
    details = [row[-1] for row in plan]
    assert not [detail for detail in details if detail.startswith("SCAN")], details
    assert sum("USING" in detail and "INDEX" in detail for detail in details) == 2, details


def test_a_batch_that_fails_midway_leaves_nothing_behind(store: TaskStore) -> None:
    store.create_task(new_task(ID1, calls=4))
    broken = SettledBatch(
        first_call=0,
        call_count=2,
        rows_body=row_lines(0, 2),
        row_count=2,
        failures=((1, {"not": "bytes"}),),  # type: ignore[arg-type]
        succeeded=1,
        failed=1,
        cancelled=0,
    )
    # the rows blob is inserted, then the failure record fails: the whole batch rolls back
    with pytest.raises(StoreError, match=r"serve\.sqlite3: database error"):
        store.settle_batch(ID1, broken)
    record = store.get(ID1)
    assert record is not None and (record.done, record.rows, record.failed) == (0, 0, 0)
    assert store.failures(ID1) == []
    assert store.settle_batch(ID1, settled(0, 2, 0, 2, failed=(1,)))
    assert store.rows_after(ID1, 0) == (row_lines(0, 2), 2)


def test_failures_come_back_by_call_index(store: TaskStore) -> None:
    store.create_task(new_task(ID1, calls=8))
    unordered = SettledBatch(
        first_call=0,
        call_count=5,
        rows_body=b"",
        row_count=0,
        failures=((4, b'{"index": 4}'), (1, b'{"index": 1}')),
        succeeded=3,
        failed=2,
        cancelled=0,
    )
    assert store.settle_batch(ID1, unordered)
    assert store.settle_batch(ID1, settled(5, 3, 0, 0, failed=(7, 5)))
    assert store.failures(ID1) == [b'{"index": %d}' % i for i in (1, 4, 5, 7)]


def test_finish_keeps_the_summary_and_failure_as_json(store: TaskStore) -> None:
    store.create_task(new_task(ID1, calls=3))
    store.mark_started(ID1, 10.0)
    assert store.settle_batch(ID1, settled(0, 2, 0, 2, failed=(1,)))
    summary = {"task_id": "task-1", "success": False, "calls": 2, "calls_per_s": 1.5, "io": {}}
    failure = {"kind": "user_error", "message": "boom"}
    with pytest.raises(ValueError, match="not 'running'"):
        store.finish(ID1, "running", 11.0, summary, failure)
    store.finish(ID1, "failed", 11.0, summary, failure)
    record = store.get(ID1)
    assert record is not None
    assert (record.state, record.finished, record.ended_at) == ("failed", True, 11.0)
    assert (record.summary, record.failure) == (summary, failure)
    # a finished task's figures are final: a late batch and a late start change nothing
    assert not store.settle_batch(ID1, settled(2, 1, 2, 1))
    store.mark_started(ID1, 12.0)
    record = store.get(ID1)
    assert record is not None and (record.state, record.done, record.rows) == ("failed", 2, 2)
    assert store.counts_by_state()["failed"] == 1


# ---- restart -------------------------------------------------------------------------------


def test_a_reopened_store_requeues_what_was_running(tmp_path: Path) -> None:
    crashed = TaskStore(tmp_path)  # never closed: the process "died"
    crashed.create_task(new_task(ID1, calls=4))
    crashed.create_task(new_task(ID2, calls=4, created_at=1.0))
    crashed.create_task(new_task(ID3, calls=4))
    crashed.mark_started(ID1, 5.0)
    assert crashed.settle_batch(ID1, settled(0, 2, 0, 2))
    crashed.mark_started(ID3, 6.0)
    crashed.finish(ID3, "succeeded", 7.0, {"calls": 4}, None)
    restarted = TaskStore(tmp_path)
    queued = restarted.requeue_unfinished()
    assert [(r.id, r.state, r.done, r.rows, r.started_at) for r in queued] == [
        (ID1, "queued", 2, 2, 5.0),
        (ID2, "queued", 0, 0, None),
    ]
    assert restarted.rows_after(ID1, 0) == (row_lines(0, 2), 2)
    assert restarted.call_chunks(ID1, 2) == [(0, 4, call_lines(0, 4))]
    assert restarted.get(ID3).state == "succeeded"  # type: ignore[union-attr]
    restarted.close()
    crashed.close()


def make_batch(number: int, first_call: int, first_row: int) -> SettledBatch:
    """The crash test's batch ``number`` (run in the child and in the test alike)."""
    call_count = 1 + number % 7 * 300
    row_count = number * 7919 % 4000
    pad = b"x" * 40
    rows = b"".join(
        b'{"row": %d, "batch": %d, "pad": "%s"}\n' % (first_row + i, number, pad)
        for i in range(row_count)
    )
    failures = tuple(
        (first_call + i, b'{"index": %d}' % (first_call + i)) for i in range(0, call_count, 97)
    )
    return SettledBatch(
        first_call=first_call,
        call_count=call_count,
        rows_body=rows,
        row_count=row_count,
        failures=failures,
        succeeded=call_count - len(failures),
        failed=len(failures),
        cancelled=0,
    )


CRASH_ID = "t-00000000000000aa"
CRASH_CHILD = """
import os, signal, sys
from blockx.serve.store import NewTask, SettledBatch, TaskStore

{make_batch}

store = TaskStore(sys.argv[1], synchronous=sys.argv[2])
store.create_task(NewTask(id="{id}", task_id="crash", instance=None, spec=b"{{}}",
    streamed=True, calls_body=None, calls_count=0, created_at=1.0))
print("created", flush=True)
kill_at_statement = int(sys.argv[3])
statements = 0

def count_statement(sql):
    global statements
    statements += 1
    if statements == kill_at_statement:  # as the statement starts: mid-transaction, or at COMMIT
        os.kill(os.getpid(), signal.SIGKILL)

if kill_at_statement:
    store._connection.set_trace_callback(count_statement)
first_call = first_row = number = 0
while True:
    batch = make_batch(number, first_call, first_row)
    store.append_calls("{id}", b"{{}}\\n" * batch.call_count, batch.call_count)
    assert store.settle_batch("{id}", batch)
    first_call += batch.call_count
    first_row += batch.row_count
    number += 1
    print(number, flush=True)
"""


def start_crash_child(
    data: Path, synchronous: str, kill_at_statement: int
) -> subprocess.Popen[bytes]:
    source = CRASH_CHILD.format(
        make_batch=textwrap.dedent(inspect.getsource(make_batch)), id=CRASH_ID
    )
    src = Path(store_module.__file__).resolve().parents[2]
    return subprocess.Popen(
        [sys.executable, "-c", source, str(data), synchronous, str(kill_at_statement)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(src)},
    )


def check_after_crash(data: Path, printed: int) -> int:
    """The reopened store holds exactly the first k >= ``printed`` batches, whole; returns k.

    Then the task resumes as the runner would: the next batch settles on top.
    """
    store = TaskStore(data)
    assert store._connection is not None
    assert store._connection.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    (queued,) = store.requeue_unfinished()
    assert queued.id == CRASH_ID
    first_call = first_row = settled_batches = 0
    rows: list[bytes] = []
    failures: list[bytes] = []
    while first_call < queued.done:
        batch = make_batch(settled_batches, first_call, first_row)
        rows.append(batch.rows_body)
        failures.extend(record for _, record in batch.failures)
        first_call, first_row = first_call + batch.call_count, first_row + batch.row_count
        settled_batches += 1
    assert first_call == queued.done, "done falls inside a batch"
    assert settled_batches >= printed
    assert queued.rows == first_row and queued.calls >= queued.done
    assert (queued.failed, queued.succeeded) == (len(failures), queued.done - len(failures))
    stored = store._connection.execute(
        "SELECT coalesce(sum(count), 0) FROM rows WHERE id = ?", (CRASH_ID,)
    ).fetchone()
    assert stored == (first_row,), "rows stored that the counters do not count"
    assert store.rows_after(CRASH_ID, 0, max_rows=10**9) == (b"".join(rows), first_row)
    assert store.failures(CRASH_ID) == failures
    # resume: the next batch (its calls appended again if they were lost) settles on top
    following = make_batch(settled_batches, first_call, first_row)
    missing = first_call + following.call_count - queued.calls
    if missing > 0:
        store.append_calls(CRASH_ID, b"{}\n" * missing, missing)
    assert store.settle_batch(CRASH_ID, following)
    assert not store.settle_batch(CRASH_ID, following)
    end = first_row + following.row_count
    assert store.rows_after(CRASH_ID, 0, max_rows=10**9) == (
        b"".join(rows) + following.rows_body,
        end,
    )
    assert store.failures(CRASH_ID) == failures + [record for _, record in following.failures]
    store.close()
    return settled_batches


def read_printed(child: subprocess.Popen[bytes], until: int | None) -> int:
    """Batches the child printed as committed, read until ``until`` (None: until it dies)."""
    assert child.stdout is not None and child.stderr is not None
    assert child.stdout.readline() == b"created\n", child.stderr.read()
    printed = 0
    while until is None or printed < until:
        line = child.stdout.readline()
        if not line:
            break
        printed = int(line)
    return printed


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kill_after", "synchronous"), [(1, "NORMAL"), (4, "NORMAL"), (15, "NORMAL"), (3, "FULL")]
)
def test_kill_9_mid_loop_keeps_every_committed_batch_whole(
    tmp_path: Path, kill_after: int, synchronous: str
) -> None:
    child = start_crash_child(tmp_path, synchronous, kill_at_statement=0)
    try:
        printed = read_printed(child, until=kill_after)
        assert printed == kill_after, child.stderr.read()  # type: ignore[union-attr]
    finally:
        child.send_signal(signal.SIGKILL)
        child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL
    check_after_crash(tmp_path, printed)


@pytest.mark.slow
@pytest.mark.parametrize("kill_at_statement", range(1, 36))
def test_kill_9_at_every_statement_of_a_batch_leaves_all_or_none_of_it(
    tmp_path: Path, kill_at_statement: int
) -> None:
    # The child kills itself as its k-th SQL statement starts: every point inside the
    # append and settle transactions of its first batches, COMMIT included, is hit once.
    child = start_crash_child(tmp_path, "NORMAL", kill_at_statement)
    try:
        printed = read_printed(child, until=None)
    finally:
        child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL
    assert check_after_crash(tmp_path, printed) in (printed, printed + 1)


# ---- retention -----------------------------------------------------------------------------


def test_purge_and_expire_delete_a_task_and_all_its_data(store: TaskStore) -> None:
    for number, id in enumerate((ID1, ID2, ID3)):
        store.create_task(new_task(id, calls=2))
        assert store.settle_batch(id, settled(0, 2, 0, 2, failed=(1,)))
        if id != ID3:
            store.finish(id, "succeeded", 100.0 + number, {"n": number}, None)
    assert store.expire(100.5) == 1  # ID1 ended at 100.0; ID2 at 101.0; ID3 runs
    assert store.get(ID1) is None
    assert store.expire(1e12) == 1  # ID2; ID3 is not finished: kept
    assert [r.id for r in store.list()] == [ID3]
    assert store.purge(ID3)
    assert not store.purge(ID3)
    assert store.list() == []
    assert store._connection is not None
    for table in ("calls", "rows", "failures"):
        assert store._connection.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)


# ---- the file ------------------------------------------------------------------------------


def test_the_data_dir_is_private_and_the_log_is_wal(tmp_path: Path) -> None:
    data = tmp_path / "a" / "data"
    store = TaskStore(data, synchronous="FULL")
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    assert stat.S_IMODE((data / "serve.sqlite3").stat().st_mode) == 0o600
    assert store._connection is not None
    assert store._connection.execute("PRAGMA synchronous").fetchone() == (2,)  # FULL
    assert "synchronous=FULL" in repr(store)
    store.close()
    with sqlite3.connect(data / "serve.sqlite3") as other:
        assert other.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    normal = TaskStore(data)
    assert normal._connection is not None
    assert normal._connection.execute("PRAGMA synchronous").fetchone() == (1,)  # NORMAL
    normal.close()
    with pytest.raises(StoreError, match="the store is closed"):
        normal.get(ID1)
    with pytest.raises(ValueError, match="synchronous"):
        TaskStore(data, synchronous="OFF")  # type: ignore[arg-type]


def test_a_newer_schema_is_refused_naming_the_file(tmp_path: Path) -> None:
    TaskStore(tmp_path).close()
    with sqlite3.connect(tmp_path / "serve.sqlite3") as connection:
        connection.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    connection.close()
    with pytest.raises(StoreError, match="newer BlockX") as raised:
        TaskStore(tmp_path)
    assert str(tmp_path / "serve.sqlite3") in str(raised.value)


def test_a_file_that_is_not_a_database_is_refused_saying_what_to_do(tmp_path: Path) -> None:
    (tmp_path / "serve.sqlite3").write_bytes(b"these are not the pages you are looking for\n" * 200)
    with pytest.raises(StoreError, match="not a BlockX serve database") as raised:
        TaskStore(tmp_path)
    message = str(raised.value)
    assert str(tmp_path / "serve.sqlite3") in message and "--data-dir" in message


def test_another_sqlite_database_is_refused(tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / "serve.sqlite3") as connection:
        connection.execute("CREATE TABLE prices (token TEXT)")
    connection.close()
    with pytest.raises(StoreError, match=r"database of something else.*prices"):
        TaskStore(tmp_path)


def test_a_data_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "data").write_text("")
    with pytest.raises(StoreError, match="not a directory"):
        TaskStore(tmp_path / "data")


def test_a_100000_call_task_goes_through_in_batches_of_8192(store: TaskStore) -> None:
    total = 100_000
    store.create_task(new_task(ID1, calls=total))
    for first in range(0, total, 8192):
        count = min(8192, total - first)
        assert store.settle_batch(ID1, settled(first, count, first, count))
    record = store.get(ID1)
    assert record is not None and (record.done, record.rows) == (total, total)
    body, count = store.rows_after(ID1, 50_000, max_rows=total)
    assert (body, count) == (row_lines(50_000, 50_000), 50_000)


# ---- property ------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    batches=st.lists(st.tuples(st.integers(1, 3), st.integers(0, 9)), max_size=10),
    max_rows=st.integers(1, 25),
)
def test_rows_after_n_is_every_row_from_n_on(batches: list[tuple[int, int]], max_rows: int) -> None:
    with tempfile.TemporaryDirectory() as data:
        store = TaskStore(data)
        calls = sum(call_count for call_count, _ in batches)
        store.create_task(new_task(ID1, calls=calls))
        first_call = first_row = 0
        for call_count, row_count in batches:
            assert store.settle_batch(ID1, settled(first_call, call_count, first_row, row_count))
            first_call += call_count
            first_row += row_count
        every_row = row_lines(0, first_row).splitlines(keepends=True)
        for after in range(first_row + 2):
            tail = b"".join(every_row[after:])
            assert store.rows_after(ID1, after) == (tail, len(every_row[after:]))
            page, count = store.rows_after(ID1, after, max_rows=max_rows)
            assert count == min(max_rows, max(first_row - after, 0))
            assert page == b"".join(every_row[after : after + count])
        store.close()


def test_a_requested_cancel_is_kept_across_a_reopen_until_the_end(tmp_path: Path) -> None:
    store = TaskStore(tmp_path / "data")
    store.create_task(new_task())
    assert store.get(ID1).cancel_reason is None  # type: ignore[union-attr]
    assert store.request_cancel(ID1, "asked") is True
    assert store.request_cancel(ID1, "again") is False  # the first reason stays
    with pytest.raises(KeyError):
        store.request_cancel("t-ffffffffffffffff", "x")
    store.close()
    reopened = TaskStore(tmp_path / "data")
    (again,) = reopened.requeue_unfinished()
    assert again.cancel_reason == "asked"
    reopened.finish(ID1, "cancelled", 2000.0, None, {"kind": "CANCELLED", "message": "asked"})
    assert reopened.request_cancel(ID1, "late") is False  # finished: nothing to cancel
    reopened.close()
