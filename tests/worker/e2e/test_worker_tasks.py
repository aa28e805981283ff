"""End to end: tasks through the Worker API on real executor processes.

One worker (two executors) serves every test of this module; each test runs
its task on that worker's loop. The session's close checks for orphans.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from e2e_support import ADDER, SLEEPER, WorkerSession, e2e_config

from blockx.worker.api import Call, Task, TaskPolicy, TaskSpecError

pytestmark = [pytest.mark.timeout(120)]

ROWS = """
def _(p):
    kind = p["kind"]
    if kind == "dict":
        return {"v": p["v"]}
    if kind == "list":
        return [{"v": p["v"]}, {"v": p["v"] + 100}]
    if kind == "none":
        return None
    return p["v"]
"""

FAILS_ON_3 = """
import time

def _(p):
    if p["i"] == 3:
        raise ValueError("call three fails")
    time.sleep(p["s"])
    return {"i": p["i"]}
"""

USER_ERROR = """
def helper(x):
    return x["missing"]


def _(p):
    value = 1
    return helper(p)
"""

SYNTAX_ERROR = "def _(p):\n    x = (1,\n    return x\n"

DEBUG = "def _(p):\n    print('hello from', p)\n    return {'ok': True}\n"


@pytest.fixture(scope="module")
def session() -> Iterator[WorkerSession]:
    with WorkerSession(e2e_config()) as s:
        yield s


def test_outputs_arrive_in_call_order_with_stats(session: WorkerSession) -> None:
    async def scenario() -> None:
        task = Task(
            task_id="basic",
            functions={"adder": ADDER},
            calls=[Call("adder", {"x": i}) for i in range(300)],
        )
        result = await session.worker.run_task(task)
        assert result.success and result.failure is None
        assert result.task_id == "basic"
        assert result.outputs == [{"y": i + 1} for i in range(300)]
        assert result.errors == []
        stats = result.stats
        assert (stats.calls, stats.succeeded, stats.failed, stats.cancelled) == (300, 300, 0, 0)
        assert stats.wall_time_s > 0 and stats.calls_per_s > 0

    session.run(scenario())


def test_rows_a_dict_is_one_a_list_many_none_none(session: WorkerSession) -> None:
    async def scenario() -> None:
        calls = [
            Call("rows", {"kind": "dict", "v": 1}),
            Call("rows", {"kind": "none", "v": 2}),
            Call("rows", {"kind": "list", "v": 3}),
            ("rows", {"kind": "scalar", "v": 4}),  # a (function_id, args) pair works too
        ]
        result = await session.worker.run_task(Task(functions={"rows": ROWS}, calls=calls))
        assert result.outputs == [{"v": 1}, {"v": 3}, {"v": 103}, 4]
        assert result.stats.succeeded == 4

    session.run(scenario())


def test_equal_calls_share_one_result(session: WorkerSession) -> None:
    async def scenario() -> None:
        calls = [Call("adder", {"x": 7}) for _ in range(50)]
        result = await session.worker.run_task(Task(functions={"adder": ADDER}, calls=calls))
        assert result.outputs == [{"y": 8}] * 50
        assert result.stats.cache_hits + result.stats.singleflight_hits >= 1

    session.run(scenario())


KEY_ORDER = "def _(p):\n    return {'keys': list(p), 'inner': list(p['m'])}\n"


def test_arguments_are_canonical_keys_sorted_and_key_order_is_not_identity(
    session: WorkerSession,
) -> None:
    """docs/taskspec.md: a mapping reaches the function with sorted keys, at every
    depth, and two calls differing only in key order are one call."""

    async def scenario() -> None:
        calls = [
            Call("order", {"b": 1, "a": 2, "m": {"z": 1, "y": 2}}),
            Call("order", {"a": 2, "m": {"y": 2, "z": 1}, "b": 1}),
        ]
        result = await session.worker.run_task(Task(functions={"order": KEY_ORDER}, calls=calls))
        assert result.outputs == [{"keys": ["a", "b", "m"], "inner": ["y", "z"]}] * 2
        assert result.stats.cache_hits + result.stats.singleflight_hits == 1

    session.run(scenario())


def test_user_error_reports_the_users_line(session: WorkerSession) -> None:
    async def scenario() -> None:
        task = Task(
            functions={"broken": USER_ERROR},
            calls=[Call("broken", {"x": 1})],
            policy=TaskPolicy(max_attempts=3),
        )
        result = await session.worker.run_task(task)
        assert not result.success
        assert result.failure is not None and result.failure.kind == "CALL_FAILED"
        assert result.failure.call_index == 0 and result.failure.error_kind == "user_error"
        [failure] = result.errors
        assert failure.kind == "user_error" and not failure.retryable
        assert failure.attempts == 1  # user errors are not retried
        assert failure.function_id == "broken" and failure.args == {"x": 1}
        assert "KeyError" in failure.message and "missing" in failure.message
        assert failure.stack is not None
        assert 'File "<blockx:broken>", line 3, in helper' in failure.stack
        assert 'return x["missing"]' in failure.stack
        assert "line 8, in _" in failure.stack

    session.run(scenario())


def test_a_syntax_error_fails_that_functions_calls_and_the_others_run(
    session: WorkerSession,
) -> None:
    async def scenario() -> None:
        calls = [Call("adder", {"x": i}) if i % 2 else Call("bad", {"i": i}) for i in range(10)]
        task = Task(
            functions={"adder": ADDER, "bad": SYNTAX_ERROR},
            calls=calls,
            policy=TaskPolicy(failure="continue"),
        )
        result = await session.worker.run_task(task)
        assert result.success  # policy continue: the failures are listed
        assert result.outputs == [{"y": i + 1} for i in range(1, 10, 2)]
        assert [e.index for e in result.errors] == [0, 2, 4, 6, 8]
        assert {e.kind for e in result.errors} == {"user_error"}
        error = result.errors[0]
        assert "SyntaxError" in error.message and "line 2" in error.message
        assert error.stack is not None and "<blockx:bad>" in error.stack
        assert list(result.code_errors) == ["bad"]
        assert "line 2" in result.code_errors["bad"]

    session.run(scenario())


def test_fast_fail_stops_the_task_and_cancels_the_rest(session: WorkerSession) -> None:
    async def scenario() -> None:
        # 2 executors x 128 contexts: the first 256 calls run, call 3 fails at once.
        calls = [Call("f", {"i": i, "s": 0.05}) for i in range(600)]
        task = Task(functions={"f": FAILS_ON_3}, calls=calls)  # fast_fail is the default
        result = await session.worker.run_task(task)
        assert not result.success
        assert result.failure is not None
        assert result.failure.kind == "CALL_FAILED" and result.failure.call_index == 3
        stats = result.stats
        assert stats.failed == 1 and stats.cancelled > 0
        assert stats.succeeded + stats.failed + stats.cancelled == 600
        assert stats.succeeded < 300
        assert [e.index for e in result.errors] == [3]

    session.run(scenario())


def test_debug_captures_a_calls_output(session: WorkerSession) -> None:
    async def scenario() -> None:
        task = Task(
            functions={"dbg": DEBUG},
            calls=[Call("dbg", {"n": 1})],
            policy=TaskPolicy(debug=True),
        )
        result = await session.worker.run_task(task)
        assert result.outputs == [{"ok": True}]
        assert "hello from {'n': 1}" in result.debug_output[0]

    session.run(scenario())


def test_tasks_run_concurrently(session: WorkerSession) -> None:
    async def scenario() -> None:
        tasks = [
            Task(
                task_id=f"t{k}",
                functions={"sleeper": SLEEPER},
                calls=[Call("sleeper", {"i": k * 100 + i, "s": 0.5}) for i in range(40)],
            )
            for k in range(4)
        ]
        loop = asyncio.get_running_loop()
        started = loop.time()
        results = await asyncio.gather(*(session.worker.run_task(t) for t in tasks))
        elapsed = loop.time() - started
        for k, result in enumerate(results):
            assert result.outputs == [{"i": k * 100 + i} for i in range(40)]
        # 160 calls of 0.5 s run at once: serially they would take 80 s.
        assert elapsed < 40.0

    session.run(scenario())


def test_a_streamed_task_yields_rows_as_batches_settle() -> None:
    config = e2e_config(**{"stream_build.batch_max_rows": 100})
    with WorkerSession(config) as session:

        async def scenario() -> None:
            def calls() -> Iterator[Call]:
                for i in range(1000):
                    yield Call("adder", {"x": i})

            handle = session.worker.submit(
                Task(functions={"adder": ADDER}, calls=calls()), collect=False
            )
            seen = []
            max_outstanding = 0
            async for row in handle.rows():
                seen.append(row["y"])
                run = handle.run_state
                max_outstanding = max(max_outstanding, run.committed_batches - run.released_batches)
            result = await handle.result()
            assert result.success and result.outputs == []
            assert seen == list(range(1, 1001))
            assert result.stats.calls == result.stats.succeeded == 1000
            assert max_outstanding <= config.stream_build.max_outstanding_batches

        session.run(scenario())


def test_flush_sends_the_calls_a_waiting_source_gave_without_a_full_batch(
    session: WorkerSession,
) -> None:
    # Batches hold 8192 calls here; the source gives 3, FLUSH, then waits until their
    # rows arrived. Without FLUSH the 3 calls would wait for a batch to fill: forever.
    from blockx.worker.api import FLUSH

    async def scenario() -> None:
        first_rows = asyncio.Event()

        async def calls():  # type: ignore[no-untyped-def]
            for i in range(3):
                yield Call("adder", {"x": i})
            yield FLUSH
            yield FLUSH  # nothing pending: ignored
            await asyncio.wait_for(first_rows.wait(), 60)
            yield Call("adder", {"x": 3})

        handle = session.worker.submit(
            Task(functions={"adder": ADDER}, calls=calls()), collect=False
        )
        batches = []
        async for batch in handle.settled_batches():
            batches.append((batch.first_call, batch.call_count, [r["y"] for r in batch.rows]))
            first_rows.set()
        result = await handle.result()
        assert result.success and result.stats.calls == 4
        assert batches == [(0, 3, [1, 2, 3]), (3, 1, [4])]

    session.run(scenario())


def test_an_async_stream_collects_its_rows_in_run_task(session: WorkerSession) -> None:
    async def scenario() -> None:
        async def calls():  # type: ignore[no-untyped-def]
            for i in range(250):
                if i % 50 == 0:
                    await asyncio.sleep(0)
                yield Call("adder", {"x": i})

        result = await session.worker.run_task(Task(functions={"adder": ADDER}, calls=calls()))
        assert sorted(r["y"] for r in result.outputs) == list(range(1, 251))

    session.run(scenario())


def test_malformed_tasks_are_refused_before_running(session: WorkerSession) -> None:
    async def scenario() -> None:
        with pytest.raises(TaskSpecError, match="not define"):
            session.worker.submit(Task(functions={"adder": ADDER}, calls=[Call("nope", 1)]))
        with pytest.raises(TaskSpecError, match="at least one function"):
            session.worker.submit(Task(functions={}, calls=[]))
        with pytest.raises(TaskSpecError, match="args"):
            session.worker.submit(
                Task(functions={"adder": ADDER}, calls=[Call("adder", {"x": float("nan")})])
            )
        with pytest.raises(TaskSpecError):
            TaskPolicy(failure="sometimes")  # type: ignore[arg-type]
        empty = await session.worker.run_task(Task(functions={"adder": ADDER}, calls=[]))
        assert empty.success and empty.outputs == [] and empty.stats.calls == 0

    session.run(scenario())


def test_executor_task_slots_admit_tasks_one_at_a_time() -> None:
    config = e2e_config(**{"pool.executor_count": 1, "admission.executor_task_slots": 1})
    with WorkerSession(config) as session:

        async def scenario() -> None:
            worker = session.worker
            first = worker.submit(
                Task(functions={"s": SLEEPER}, calls=[Call("s", {"i": 0, "s": 0.3})])
            )
            second = worker.submit(
                Task(functions={"s": SLEEPER}, calls=[Call("s", {"i": 1, "s": 0})])
            )
            await asyncio.sleep(0.15)
            # The second task waits for the slot: the core has never seen it.
            assert first.registered and not second.registered
            assert len(worker.orchestrator.live_task_ids) == 1
            assert (await second.result()).outputs == [{"i": 1}]
            assert first.done()

        session.run(scenario())


def _breaking_calls() -> Iterator[Call]:
    """A call source that yields ten calls, then raises."""
    for i in range(10):
        yield Call("adder", {"x": i})
    raise RuntimeError("the call source broke")


def test_rows_of_a_call_stream_that_raises_end_with_its_error(
    session: WorkerSession,
) -> None:
    # Iterating rows() alone must not make a broken source look like a finished stream.
    async def scenario() -> None:
        handle = session.worker.submit(
            Task(functions={"adder": ADDER}, calls=_breaking_calls()), collect=False
        )
        rows: list[Any] = []
        with pytest.raises(RuntimeError, match="the call source broke"):
            async for row in handle.rows():
                rows.append(row)
        assert len(rows) <= 10  # the rows that settled before the cancel, if any
        with pytest.raises(RuntimeError, match="the call source broke"):
            await handle.result()

    session.run(scenario())


def test_a_call_stream_that_raises_cancels_the_task_and_result_raises(
    session: WorkerSession,
) -> None:
    async def scenario() -> None:
        handle = session.worker.submit(Task(functions={"adder": ADDER}, calls=_breaking_calls()))
        with pytest.raises(RuntimeError, match="the call source broke"):
            await handle.result()
        assert handle.run_state.converged_with is not None
        assert handle.run_state.converged_with.failure is not None
        assert session.worker.orchestrator.live_task_ids == []

    session.run(scenario())
