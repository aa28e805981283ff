"""End to end: user functions using ``Table`` and ``ChainState`` (no imports) on real
executors, through a Worker whose IO is the real subsystem: SQLite and the JSON-RPC node."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from jsonrpc_node import ALICE, BOB, CONTRACT, FakeNode, balance

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "worker", "e2e"))
from e2e_support import SLEEPER, WorkerSession, e2e_config

from blockx.worker.api import Call, Task, TaskPolicy
from blockx.worker.io.backend import PreparedRequest, Reply
from blockx.worker.io.config import load_io_config
from blockx.worker.io.registry import IOSubsystem, default_registry

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

WRITER = """
def _(p):
    n = Table("prices").upsert_rows([{"key": p["token"], "usd": p["usd"]}])
    return {"written": n}
"""

READER = """
def _(p):
    state = ChainState("eth", p["block"])
    row = Table("prices").get_row(p["token"])
    child = function.call("double", {"x": row["usd"]})
    return {
        "token": p["token"],
        "usd2": child["y"],
        "wei": state.get_address_balance(p["addr"]),
        "nonce": state.get_address_nonce(p["addr"]),
        "code": state.get_address_code(p["contract"]),
        "missing": Table("prices").get_row("nope"),
    }
"""

DOUBLE = "def _(p):\n    return {'y': p['x'] * 2}\n"

BAD_TABLE = """
def _(p):
    return Table("prices").get_row({"not": "a key"})
"""

REVERTS = """
def _(p):
    return {"out": ChainState("eth", "latest").call(p["to"], "0xdeadbeef")}
"""


@pytest.fixture(scope="module")
def session() -> Iterator[WorkerSession]:
    with WorkerSession(e2e_config()) as s:
        yield s


def _io(tmp_path: Any, node: FakeNode) -> IOSubsystem:
    return IOSubsystem(
        load_io_config(
            {
                "blockdb": {"sqlite_path": str(tmp_path / "e2e.sqlite3")},
                "rpc": {"endpoints": {"eth": [node.url]}},
            },
            env={},
        )
    )


def test_tables_and_chain_state_from_user_functions(
    session: WorkerSession, tmp_path: Any, node: FakeNode
) -> None:
    io = _io(tmp_path, node)
    tokens = [("eth", 3000), ("btc", 60000), ("sol", 150)]

    async def scenario() -> Any:
        try:
            write = Task(
                functions={"write": WRITER},
                calls=[Call("write", {"token": t, "usd": u}) for t, u in tokens],
            )
            scope_w = io.task_scope(write.task_id)
            write.io_handler = scope_w
            written = await session.worker.run_task(write)
            assert written.success, written.errors
            calls = [
                Call(
                    "read",
                    {
                        "token": t,
                        "block": 100 + i % 11,
                        "addr": ALICE if i % 2 else BOB,
                        "contract": CONTRACT,
                    },
                )
                for i, (t, _) in enumerate(tokens * 10)
            ]
            read = Task(functions={"read": READER, "double": DOUBLE}, calls=calls)
            scope = io.task_scope(read.task_id)
            read.io_handler = scope
            result = await session.worker.run_task(read)
            return written, result, scope
        finally:
            await io.close()

    written, result, scope = session.run(scenario())
    assert [row["written"] for row in written.outputs] == [1, 1, 1]
    assert result.success, result.errors
    assert len(result.outputs) == 30
    for i, row in enumerate(result.outputs):
        token, usd = tokens[i % 3]
        addr = ALICE if i % 2 else BOB
        assert row == {
            "token": token,
            "usd2": usd * 2,
            "wei": balance(addr, 100 + i % 11),
            "nonce": i % 11,
            "code": "0x6080604052348015600f57600080fd5b50",
            "missing": None,
        }
    get_row = scope.stats.operation("blockdb", "get_row")
    assert get_row.requests == 60
    # 3 tokens + "nope": at most 4 reads reached SQLite, the rest were cached or joined
    assert get_row.backend_calls <= 4
    assert get_row.cache_hits + get_row.singleflight_joins >= 56
    code = scope.stats.operation("rpc", "eth_getCode")
    assert code.backend_calls < code.requests
    assert max(node.bodies) > 1  # concurrent node reads went out as JSON-RPC batches
    assert "blockdb/get_row" in scope.stats.format_table()


def test_user_errors_and_io_errors_reach_the_task_result(
    session: WorkerSession, tmp_path: Any, node: FakeNode
) -> None:
    io = _io(tmp_path, node)

    async def scenario() -> Any:
        try:
            task = Task(
                functions={"bad": BAD_TABLE, "reverts": REVERTS},
                calls=[Call("bad", {}), Call("reverts", {"to": CONTRACT})],
                policy=TaskPolicy(failure="continue", max_attempts=2),
            )
            task.io_handler = io.task_scope(task.task_id)
            return await session.worker.run_task(task)
        finally:
            await io.close()

    result = session.run(scenario())
    errors = {e.function_id: e for e in result.errors}
    bad = errors["bad"]
    assert bad.kind == "user_error" and not bad.retryable and bad.attempts == 1
    assert "TableError: table 'prices': key must be str, int or a list of them" in bad.message
    reverts = errors["reverts"]
    assert reverts.kind == "io_error" and not reverts.retryable
    assert "JSON-RPC error 3: execution reverted" in reverts.message


def test_each_run_reads_through_its_own_cache_even_under_one_task_id(
    session: WorkerSession, tmp_path: Any
) -> None:
    # A run caches what it read; a later run of the same task id must not see that cache
    # after another task wrote the table (nor may concurrent runs share one).
    io = IOSubsystem(
        load_io_config({"blockdb": {"sqlite_path": str(tmp_path / "runs.sqlite3")}}, env={})
    )
    reader = "def _(p):\n    return Table('prices').get_row('eth')\n"

    def write(usd: int) -> None:
        task = Task(functions={"w": WRITER}, calls=[Call("w", {"token": "eth", "usd": usd})])
        task.io_handler = io
        assert session.run(session.worker.run_task(task)).success

    def read() -> Any:
        task = Task(functions={"r": reader}, calls=[Call("r", None)], task_id="demo")
        task.io_handler = io
        result = session.run(session.worker.run_task(task))
        assert result.success, result.errors
        return result.outputs

    try:
        write(1)
        assert read() == [{"key": "eth", "usd": 1}]
        write(2)
        assert read() == [{"key": "eth", "usd": 2}]
        assert io.scope_of("demo") is None  # nothing routed by the user's id is kept
    finally:
        session.run(io.close())


class NeverAnswers:
    """A backend whose reads never answer (a node that hangs): it notes when each
    request started and when its future was cancelled (event-loop clock)."""

    name = "never"

    def __init__(self) -> None:
        self.started: list[float] = []
        self.cancelled: list[float] = []

    def prepare(
        self, io_kind: str, operation: str, params: Any, sidecar: bytes | None
    ) -> PreparedRequest:
        return PreparedRequest(operation, params, domain=None, cacheable=True)

    def execute(self, request: PreparedRequest) -> asyncio.Future[Reply]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Reply] = loop.create_future()
        self.started.append(loop.time())

        def note(done: asyncio.Future[Reply]) -> None:
            if done.cancelled():
                self.cancelled.append(loop.time())

        future.add_done_callback(note)
        return future

    async def close(self) -> None:
        return None


HANGS = """
from blockx.sdk import get_provider

def _(p):
    return get_provider().read_req("never", "get", {"key": p["key"]})
"""


def test_a_read_cut_off_at_the_budget_stops_its_backend_call_while_the_run_goes_on() -> None:
    """Two calls wait on one read (singleflight) of a backend that never answers; the
    executor cuts both waits off at the calls' 500 ms budget. Once the second is gone
    nobody waits for the read: its backend future is cancelled then — not when the run
    ends, which slower calls keep going for another second or more."""
    budget_ms, sleep_s = 500, 0.3
    never = NeverAnswers()
    registry = default_registry()
    registry.register("never", never)
    io = IOSubsystem(load_io_config({}, env={}), registry)
    # Three calls in flight at once: the two readers, then the sleepers one after another.
    config = e2e_config(**{"pool.executor_count": 1, "dispatcher.task_max_inflight_calls": 3})
    # Two different calls (equal ones would share one run: the call singleflight)...
    calls = [Call("hangs", {"key": 1, "n": n}) for n in range(2)]  # ... reading one key
    calls += [Call("sleeper", {"s": sleep_s, "i": i}) for i in range(15)]
    with WorkerSession(config) as session:

        async def scenario() -> tuple[Any, float, float]:
            loop = asyncio.get_running_loop()
            try:
                task = Task(
                    functions={"hangs": HANGS, "sleeper": SLEEPER},
                    calls=calls,
                    policy=TaskPolicy(call_budget_ms=budget_ms, failure="continue"),
                )
                task.io_handler = io  # a scope of its own for the run, closed at its end
                started = loop.time()
                result = await session.worker.run_task(task)
                return result, started, loop.time()
            finally:
                await io.close()

        result, started, ended = session.run(scenario())
    assert len(result.errors) == 2, result.errors
    for error in result.errors:
        assert error.kind == "deadline_exceeded", error
        assert error.message.startswith(f"call budget of {budget_ms} ms ran out after waiting ")
    assert len(result.outputs) == 15
    assert len(never.started) == 1  # one backend call for both readers
    [cancelled] = never.cancelled
    assert cancelled - started < budget_ms / 1000 + 1.0, (cancelled - started, ended - started)
    assert ended - cancelled > 0.5, (cancelled - started, ended - started)
    op = io.stats.operation("never", "get")
    assert (op.requests, op.singleflight_joins, op.abandoned, op.backend_calls) == (2, 1, 1, 0)
