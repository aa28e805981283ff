"""Immutable reads answered inside the executor, from the worker's side.

The ``rpc`` backend marks a read immutable only at a block number or hash (never a
tag, never a volatile method); the task scope passes the mark on with a successful,
non-null answer (fresh or cached) and never with an error; the worker's
``ResumeCall`` carries it; the executors' hits come back with each call and are
counted in the task's statistics apart from the worker's own requests. End to end
through a real Worker, real executors and the JSON-RPC node: a repeated read at a
block costs one request in all, a read at ``latest`` and a table read are never
answered by the executor.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from io_support import payload
from jsonrpc_node import ALICE, BOB, FakeNode, balance

from blockx.worker.io.config import load_io_config
from blockx.worker.io.handler import IOResult
from blockx.worker.io.registry import IOSubsystem
from blockx.worker.io.rpc import immutable_read
from blockx.worker.io.stats import IOStats

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "worker", "e2e"))
from e2e_support import WorkerSession, e2e_config

from blockx.worker.api import Call, Task

HASH = "0x" + "ab" * 32


# --- which reads are immutable ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "params", "expected"),
    [
        ("eth_getBalance", [ALICE, "0x64"], True),
        ("eth_getBalance", [ALICE, {"blockHash": HASH}], True),
        ("eth_getBalance", [ALICE, {"blockNumber": "0x64"}], True),
        ("eth_getBalance", [ALICE, HASH], True),
        ("eth_getBalance", [ALICE, "latest"], False),
        ("eth_getBalance", [ALICE, "finalized"], False),
        ("eth_getBalance", [ALICE, "safe"], False),
        ("eth_getBalance", [ALICE, "earliest"], False),
        ("eth_getBalance", [ALICE, "pending"], False),
        ("eth_getBalance", [ALICE, {"blockHash": "latest"}], False),
        ("eth_getBalance", [ALICE], False),  # the node's default block: latest
        ("eth_getStorageAt", [ALICE, "0x0", "0x64"], True),
        ("eth_getStorageAt", [ALICE, "0x0", "latest"], False),
        ("eth_call", [{"to": ALICE, "data": "0x"}, "0x64"], True),
        ("eth_call", [{"to": ALICE, "data": "0x"}, "latest"], False),
        ("eth_getBlockByNumber", ["0x64", False], True),
        ("eth_getBlockByNumber", ["latest", False], False),
        ("eth_getBlockByHash", [HASH, True], True),
        ("eth_blockNumber", [], False),
        ("eth_getLogs", [{"blockHash": HASH}], False),  # not among the kept methods
        ("eth_getTransactionReceipt", [HASH], False),  # null until mined
        ("eth_getBalance", [ALICE, "0x" + "1" * 17], False),  # not a block number
    ],
)
def test_only_reads_at_a_fixed_block_are_immutable(
    method: str, params: list[Any], expected: bool
) -> None:
    assert immutable_read(method, params) is expected


# --- the scope passes the mark on -----------------------------------------------------------------


def _rpc_io(node: FakeNode) -> IOSubsystem:
    return IOSubsystem(load_io_config({"rpc": {"endpoints": {"eth": [node.url]}}}, env={}))


def _serve_all(io: IOSubsystem, bodies: list[dict[str, Any]]) -> list[IOResult]:
    """Serve ``bodies`` one after another on one event loop (the subsystem's HTTP
    session belongs to the loop that made it), then close the subsystem."""
    scope = io.task_scope("t")

    async def serve() -> list[IOResult]:
        answers = []
        try:
            for body in bodies:
                returned = scope.handle_io("t", "c1", body, None)
                answers.append(returned if type(returned) is IOResult else await returned)
        finally:
            await io.close()
        return answers

    return asyncio.run(serve())


def _balance_read(block: Any, address: str = ALICE) -> dict[str, Any]:
    params = {"chain": "eth", "params": [address, block]}
    return payload("rpc", "eth_getBalance", params, cache_key=f"{address}@{block}")


def test_the_scope_marks_fresh_and_cached_answers_at_a_block(node: FakeNode) -> None:
    fresh, cached = _serve_all(_rpc_io(node), [_balance_read("0x64"), _balance_read("0x64")])
    for answer in (fresh, cached):
        assert answer.error is None and answer.immutable
        assert int(answer.result, 16) == balance(ALICE, 100)
    assert node.methods == ["eth_getBalance"]  # the second from the worker's cache


def test_the_scope_never_marks_a_tag_an_error_or_a_null(node: FakeNode) -> None:
    node.faults = [None, None, "400"]
    far_block = payload(
        "rpc",
        "eth_getBlockByNumber",
        {"chain": "eth", "params": ["0x99999", False]},
        cache_key="far",
    )
    latest, missing, failed = _serve_all(
        _rpc_io(node), [_balance_read("latest"), far_block, _balance_read("0x65", BOB)]
    )
    assert latest.error is None and not latest.immutable
    assert missing.error is None and missing.result is None and not missing.immutable
    assert failed.error is not None and not failed.immutable


def test_table_reads_are_never_immutable(tmp_path: Any) -> None:
    io = IOSubsystem(
        load_io_config({"blockdb": {"sqlite_path": str(tmp_path / "t.sqlite3")}}, env={})
    )
    read = payload("blockdb", "get_row", {"table": "prices", "key": "eth"}, cache_key="eth")
    (answer,) = _serve_all(io, [read])
    assert answer.error is None and not answer.immutable


def test_local_hits_are_counted_apart_from_requests() -> None:
    stats = IOStats()
    stats.operation("rpc", "eth_getBalance").record_cache_hit()
    stats.operation("rpc", "eth_getBalance").record_local_hits(4)
    op = stats.operation("rpc", "eth_getBalance")
    assert (op.requests, op.cache_hits, op.local_hits) == (1, 1, 4)
    assert stats.totals()["local_hits"] == 4
    assert stats.as_dict()["operations"][0]["local_hits"] == 4
    table = stats.format_table()
    assert "in executor" in table.splitlines()[0] and table.splitlines()[1].endswith(" 4")
    assert "in executor" not in IOStats().format_table()


# --- end to end -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def session() -> Iterator[WorkerSession]:
    with WorkerSession(e2e_config()) as s:
        yield s


READER = """
def _(p):
    state = ChainState("eth", p["block"])
    return {"wei": [state.get_address_balance(a) for a in p["addrs"]]}
"""

TABLE = """
def _(p):
    prices = Table("prices")
    seen = []
    for usd in range(p["first"], p["first"] + 3):
        prices.upsert_rows([{"key": p["token"], "usd": usd}])
        seen.append(prices.get_row(p["token"])["usd"])
        seen.append(prices.get_row(p["token"])["usd"])
    return {"seen": seen}
"""


def _run(session: WorkerSession, io: IOSubsystem, task: Task) -> tuple[Any, Any]:
    async def scenario() -> Any:
        scope = io.task_scope(task.task_id)
        task.io_handler = scope
        try:
            return await session.worker.run_task(task), scope
        finally:
            await io.close()

    return session.run(scenario())  # type: ignore[no-any-return]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_repeated_reads_at_a_block_are_answered_in_the_executors(
    session: WorkerSession, node: FakeNode
) -> None:
    # Distinct args: identical calls would be answered once by the worker's call cache.
    calls = [Call("read", {"block": 105, "addrs": [ALICE, BOB] * 5, "i": i}) for i in range(20)]
    result, scope = _run(session, _rpc_io(node), Task(functions={"read": READER}, calls=calls))
    assert result.success, result.errors
    assert result.outputs == [{"wei": [balance(ALICE, 105), balance(BOB, 105)] * 5}] * 20
    op = scope.stats.operation("rpc", "eth_getBalance")
    # Every read counted once: by the worker, or by the executor that answered it.
    assert op.requests + op.local_hits == 200
    # In each call, reads 2..5 of each address come from its executor's cache at least.
    assert op.local_hits >= 160
    assert node.methods.count("eth_getBalance") <= 2  # one per address, however many executors
    assert scope.stats.totals()["local_hits"] == op.local_hits


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_reads_at_a_tag_always_reach_the_worker(session: WorkerSession, node: FakeNode) -> None:
    calls = [Call("read", {"block": "latest", "addrs": [ALICE] * 5, "i": i}) for i in range(10)]
    result, scope = _run(session, _rpc_io(node), Task(functions={"read": READER}, calls=calls))
    assert result.success, result.errors
    op = scope.stats.operation("rpc", "eth_getBalance")
    assert (op.requests, op.local_hits) == (50, 0)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_table_read_after_a_write_sees_the_write(session: WorkerSession, tmp_path: Any) -> None:
    io = IOSubsystem(
        load_io_config({"blockdb": {"sqlite_path": str(tmp_path / "w.sqlite3")}}, env={})
    )
    calls = [Call("t", {"token": f"tok{i}", "first": 10 * i}) for i in range(8)]
    result, scope = _run(session, io, Task(functions={"t": TABLE}, calls=calls))
    assert result.success, result.errors
    assert result.outputs == [
        {"seen": [u for u in range(10 * i, 10 * i + 3) for _ in (0, 1)]} for i in range(8)
    ]
    op = scope.stats.operation("blockdb", "get_row")
    assert (op.requests, op.local_hits) == (48, 0)
