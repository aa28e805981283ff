"""End to end: sub-calls and IO waits on real executors.

Sub-calls run next to their parent (same executor), chain, and are refused
with their own kinds past ``MaxSubcallDepth`` or on a cycle. IO waits go to a
small real backend: an asyncio handler that answers after a real delay and
counts its requests. A wait that outlasts the call's budget ends the call when
the budget runs out, not when the backend gives up — and the backend's request,
which nobody waits for any more, is cancelled then.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from e2e_support import SLEEPER, WorkerSession, e2e_config, eventually

from blockx.wire import RemoteError
from blockx.worker.api import Call, Task, TaskPolicy
from blockx.worker.io import IOResult

pytestmark = [pytest.mark.timeout(120)]

PARENT = """
def _(p):
    child = function.call("child", {"x": p["x"]})
    return {"parent": child["child"] + 1}
"""
CHILD = """
def _(p):
    grandchild = function.call("grandchild", {"x": p["x"]})
    return {"child": grandchild["g"] * 10}
"""
GRANDCHILD = "def _(p):\n    return {'g': p['x'] + 1}\n"
LOOP = "def _(p):\n    return function.call('loop', p)\n"
DEEP = """
def _(p):
    if p["n"] == 0:
        return {"bottom": True}
    return function.call("deep", {"n": p["n"] - 1})
"""
CATCHES = """
from blockx.executor.sdk_bridge import SubcallFailedError

def _(p):
    try:
        function.call("fails", p)
    except SubcallFailedError as exc:
        return {"caught": exc.child_error_kind}
"""
FAILS = "def _(p):\n    raise RuntimeError('child failed')\n"

READER = """
from blockx.sdk import db

def _(p):
    total = 0
    for k in range(p["reads"]):
        row = db.get("prices", p["key"] + k)
        total += row["usd"]
    return {"key": p["key"], "total": total}
"""
IO_ERROR = """
from blockx.sdk import db

def _(p):
    return db.get("prices", -1)
"""


class DelayBackend:
    """A real asyncio backend: answers each read after ``delay`` seconds, counts requests."""

    def __init__(self, delay: float = 0.01) -> None:
        self.delay = delay
        self.requests = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.task_ids: set[str] = set()

    async def handle_io(
        self, task_id: str, call_id: str, payload: dict[str, Any], sidecar: bytes | None
    ) -> IOResult:
        self.requests += 1
        self.task_ids.add(task_id)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay)
        finally:
            self.in_flight -= 1
        key = payload["params"]["key"]
        if key < 0:
            return IOResult(
                error=RemoteError(kind="io_error", message="no such row", retryable=False)
            )
        return IOResult(result={"usd": key * 2}, budget_used_ms=1)


BACKEND = DelayBackend()


@pytest.fixture(scope="module")
def session() -> Iterator[WorkerSession]:
    config = e2e_config(**{"dispatcher.max_subcall_depth": 4})
    with WorkerSession(config, io_handlers={"blockdb": BACKEND}) as s:
        yield s


def test_subcall_chain_parent_child_grandchild(session: WorkerSession) -> None:
    async def scenario() -> None:
        task = Task(
            functions={"parent": PARENT, "child": CHILD, "grandchild": GRANDCHILD},
            calls=[Call("parent", {"x": i}) for i in range(20)],
        )
        result = await session.worker.run_task(task)
        assert result.success, result.errors
        assert result.outputs == [{"parent": (i + 1) * 10 + 1} for i in range(20)]
        assert result.stats.calls == 20  # sub-calls are not the task's calls
        assert result.stats.subcalls == 40

    session.run(scenario())


def test_depth_exceeded_and_cycles_are_reported_with_their_kinds(session: WorkerSession) -> None:
    async def scenario() -> None:
        task = Task(
            functions={"loop": LOOP, "deep": DEEP},
            calls=[Call("loop", {"x": 1}), Call("deep", {"n": 2}), Call("deep", {"n": 10})],
            policy=TaskPolicy(failure="continue"),
        )
        result = await session.worker.run_task(task)
        assert result.outputs == [{"bottom": True}]
        kinds = {e.index: e.kind for e in result.errors}
        assert kinds == {0: "subcall_cycle_detected", 2: "subcall_depth_exceeded"}
        assert all(not e.retryable for e in result.errors)
        assert "the limit is 4" in result.errors[1].message

    session.run(scenario())


def test_a_failed_child_is_an_exception_the_parent_may_catch(session: WorkerSession) -> None:
    async def scenario() -> None:
        task = Task(functions={"catches": CATCHES, "fails": FAILS}, calls=[Call("catches", {})])
        result = await session.worker.run_task(task)
        assert result.outputs == [{"caught": "user_error"}]

    session.run(scenario())


def test_io_waits_through_a_real_backend_run_concurrently(session: WorkerSession) -> None:
    async def scenario() -> None:
        before = BACKEND.requests
        BACKEND.max_in_flight = 0
        task = Task(
            task_id="io-task",
            functions={"reader": READER},
            calls=[Call("reader", {"key": i * 10, "reads": 3}) for i in range(100)],
        )
        result = await session.worker.run_task(task)
        assert result.success, result.errors
        assert result.outputs == [
            {"key": i * 10, "total": sum((i * 10 + k) * 2 for k in range(3))} for i in range(100)
        ]
        assert BACKEND.requests - before == 300
        assert result.stats.io_calls == 300
        assert "io-task" in BACKEND.task_ids  # the handler sees the caller's task id
        # 100 calls x 3 sequential reads of 10 ms: concurrent, not serial (how fast
        # is the machine's business: the reads in flight at once say it).
        assert BACKEND.max_in_flight >= 50

    session.run(scenario())


def test_an_io_error_fails_the_call_with_the_backends_kind(session: WorkerSession) -> None:
    async def scenario() -> None:
        task = Task(functions={"bad": IO_ERROR}, calls=[Call("bad", {})])
        result = await session.worker.run_task(task)
        [error] = result.errors
        assert error.kind == "io_error" and "no such row" in error.message

    session.run(scenario())


def test_a_task_without_a_backend_fails_io_clearly() -> None:
    with WorkerSession(e2e_config(**{"pool.executor_count": 1})) as session:

        async def scenario() -> None:
            task = Task(
                functions={"reader": READER}, calls=[Call("reader", {"key": 1, "reads": 1})]
            )
            result = await session.worker.run_task(task)
            [error] = result.errors
            assert error.kind == "io_error" and "no IO backend" in error.message

        session.run(scenario())


class HangingBackend:
    """A backend that gives up only after ``timeout`` seconds (a node that never answers,
    behind a client's timeouts and retries): then ``io_error``, retryable."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.requests = 0
        self.answered = 0

    async def handle_io(
        self, task_id: str, call_id: str, payload: dict[str, Any], sidecar: bytes | None
    ) -> IOResult:
        self.requests += 1
        try:
            await asyncio.sleep(self.timeout)
        finally:
            self.answered += 1
        return IOResult(
            error=RemoteError(kind="io_error", message="node timed out", retryable=True),
            budget_used_ms=int(self.timeout * 1000),
        )


CALLS_CHILD = "def _(p):\n    return function.call('reader', p)\n"


@pytest.mark.parametrize("via_subcall", [False, True], ids=["io", "subcall"])
def test_a_wait_that_outlasts_the_budget_ends_the_call_at_the_budget(
    session: WorkerSession, caplog: pytest.LogCaptureFixture, via_subcall: bool
) -> None:
    backend = HangingBackend(timeout=30.0)

    async def scenario() -> None:
        worker = session.worker
        stats = worker.orchestrator.stats
        failures_before = stats.resume_send_failures
        released_before = stats.io_waits_released
        task = Task(
            functions={"reader": READER, "parent": CALLS_CHILD},
            calls=[Call("parent" if via_subcall else "reader", {"key": 1, "reads": 1})],
            policy=TaskPolicy(call_budget_ms=300, max_attempts=3),
            io_handler=backend,
        )
        loop = asyncio.get_running_loop()
        started = loop.time()
        result = await worker.run_task(task)
        elapsed = loop.time() - started
        # About the budget (0.3 s), nowhere near the backend's 30 s.
        assert 0.25 <= elapsed < 15.0, elapsed
        [error] = result.errors
        assert error.kind == "deadline_exceeded", error
        assert not error.retryable and error.attempts == 1  # not retried
        assert "300 ms" in error.message, error.message
        if not via_subcall:
            assert error.message.startswith("call budget of 300 ms ran out after waiting ")
            assert "on IO blockdb.get_row (request req-" in error.message
        assert backend.requests == 1
        # Nobody waits for the answer any more: the handler's coroutine is cancelled at
        # once (not after its 30 s), and nothing is sent for it.
        await eventually(lambda: backend.answered == 1, timeout=10.0)
        await asyncio.sleep(0.1)
        assert stats.resume_send_failures == failures_before
        assert stats.io_waits_released == released_before + 1
        adapter = worker.adapter
        await eventually(
            lambda: not any(adapter.reserved_calls(e) for e in worker.pool.executor_ids)
        )
        after = await worker.run_task(
            Task(functions={"a": SLEEPER}, calls=[Call("a", {"s": 0, "i": 1})])
        )
        assert after.success and after.outputs == [{"i": 1}]

    with caplog.at_level(logging.WARNING, logger="blockx"):
        session.run(scenario())
    # Nothing to warn of -- but a loaded machine's stalled event loop, which the tick
    # reports whatever runs (not this test's subject).
    noise = [
        r
        for r in caplog.records
        if r.levelno >= logging.WARNING and "event loop stalled" not in r.getMessage()
    ]
    assert noise == [], [r.getMessage() for r in noise]
