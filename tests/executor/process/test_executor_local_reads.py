"""A real executor process and its immutable-read cache (executor/local_reads.py).

The worker marks an answer that never changes (``ResumeCall.immutable``); the
executor keeps it per task and answers the task's identical reads itself, with
no ``CallWaiting``, and reports them in the call's terminal frame
(``localReadHits``). Anything not marked, a write, a read without a cache key,
another task, and a v1 worker (which never marks anything) all go through
the worker as before.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
from tests.helpers.fake_worker import FakeWorker, IoReply

from blockx.wire import Frame, keys

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

StartWorker = Callable[..., FakeWorker]

ADDR = "0x" + "a1" * 20

READS = """\
def _(p):
    state = ChainState("eth", p["block"])
    return [state.get_address_balance(p["addr"]) for _ in range(p["n"])]
"""

BLOCKS = """\
def _(p):
    state = ChainState("eth", 7)
    first = state.get_block()
    first["mutated"] = True      # the caller owns its answer
    second = state.get_block()
    return {"second_mutated": "mutated" in second, "number": second["number"]}
"""

WRITE_BETWEEN = """\
from blockx.sdk.runtime import get_provider

def _(p):
    state = ChainState("eth", 7)
    a = state.get_address_balance(p["addr"])
    b = state.get_address_balance(p["addr"])
    get_provider().write_req("rpc", "eth_sendRawTransaction", {"chain": "eth", "params": ["0x00"]})
    c = state.get_address_balance(p["addr"])
    return [a, b, c]
"""

NO_KEY = """\
def _(p):
    from blockx.sdk import rpc
    params = [p["addr"], "0x7"]
    return [rpc.call("eth", "eth_getBalance", params) for _ in range(3)]
"""


class Node:
    """The test's IO handler: answers every read with a balance, marks reads immutable
    when told to, counts the reads that reached it."""

    def __init__(self, *, immutable: bool) -> None:
        self.immutable = immutable
        self.reads: list[dict[str, Any]] = []
        self.writes = 0

    def __call__(self, frame: Frame) -> IoReply:
        payload = frame.envelope[keys.F_PAYLOAD]
        if payload[keys.FP_IO_KIND] == keys.IO_WRITE:
            self.writes += 1
            return IoReply(result="0xtx")
        self.reads.append(payload)
        if payload[keys.FP_OPERATION] == "eth_getBlockByNumber":
            return IoReply(result={"number": "0x7", "hash": "0x" + "ab" * 32}, immutable=True)
        return IoReply(result=hex(1000 + len(self.reads)), immutable=self.immutable)


def _terminal(worker: FakeWorker, call_id: str) -> dict[str, Any]:
    frame = worker.wait_terminal(call_id, timeout=30)
    assert frame.message_type == keys.MT_CALL_COMPLETED, frame.envelope
    payload: dict[str, Any] = frame.envelope[keys.F_PAYLOAD]
    return payload


def test_an_immutable_answer_serves_the_tasks_identical_reads(start_worker: StartWorker) -> None:
    node = Node(immutable=True)
    worker = start_worker(io_handler=node)
    worker.execute_call("c1", source=READS, args={"block": 7, "addr": ADDR, "n": 5})
    payload = _terminal(worker, "c1")
    assert payload[keys.FP_OUTPUT] == [1001] * 5  # one answer, read five times
    assert len(node.reads) == 1
    assert payload[keys.FP_LOCAL_READ_HITS] == {"rpc": {"eth_getBalance": 4}}
    # A later call of the same task: answered without asking at all.
    worker.execute_call("c2", source=READS, args={"block": 7, "addr": ADDR, "n": 2})
    payload = _terminal(worker, "c2")
    assert payload[keys.FP_OUTPUT] == [1001, 1001]
    assert len(node.reads) == 1
    assert payload[keys.FP_LOCAL_READ_HITS] == {"rpc": {"eth_getBalance": 2}}


def test_an_answer_not_marked_immutable_is_never_kept(start_worker: StartWorker) -> None:
    # A v1 worker never sends "immutable": every read crosses the socket, as before.
    node = Node(immutable=False)
    worker = start_worker(io_handler=node)
    worker.execute_call("c1", source=READS, args={"block": "latest", "addr": ADDR, "n": 3})
    payload = _terminal(worker, "c1")
    assert payload[keys.FP_OUTPUT] == [1001, 1002, 1003]
    assert len(node.reads) == 3
    assert keys.FP_LOCAL_READ_HITS not in payload


def test_tasks_do_not_share_their_reads(start_worker: StartWorker) -> None:
    node = Node(immutable=True)
    worker = start_worker(io_handler=node)
    args = {"block": 7, "addr": ADDR, "n": 2}
    worker.execute_call("a1", source=READS, args=args, task_id="task-a")
    assert _terminal(worker, "a1")[keys.FP_OUTPUT] == [1001, 1001]
    worker.execute_call("b1", source=READS, args=args, task_id="task-b")
    assert _terminal(worker, "b1")[keys.FP_OUTPUT] == [1002, 1002]
    assert len(node.reads) == 2


def test_a_kept_object_is_a_fresh_copy_for_every_read(start_worker: StartWorker) -> None:
    node = Node(immutable=True)
    worker = start_worker(io_handler=node)
    worker.execute_call("c1", source=BLOCKS)
    payload = _terminal(worker, "c1")
    assert payload[keys.FP_OUTPUT] == {"second_mutated": False, "number": "0x7"}
    assert len(node.reads) == 1
    assert payload[keys.FP_LOCAL_READ_HITS] == {"rpc": {"eth_getBlockByNumber": 1}}


def test_a_write_to_the_backend_drops_what_was_kept(start_worker: StartWorker) -> None:
    node = Node(immutable=True)
    worker = start_worker(io_handler=node)
    worker.execute_call("c1", source=WRITE_BETWEEN, args={"addr": ADDR})
    payload = _terminal(worker, "c1")
    # a from the worker, b kept, the write, c from the worker again
    assert payload[keys.FP_OUTPUT] == [1001, 1001, 1002]
    assert (len(node.reads), node.writes) == (2, 1)
    assert payload[keys.FP_LOCAL_READ_HITS] == {"rpc": {"eth_getBalance": 1}}


def test_a_read_without_a_cache_key_always_asks(start_worker: StartWorker) -> None:
    node = Node(immutable=True)
    worker = start_worker(io_handler=node)
    worker.execute_call("c1", source=NO_KEY, args={"addr": ADDR})
    payload = _terminal(worker, "c1")
    assert payload[keys.FP_OUTPUT] == ["0x3e9", "0x3ea", "0x3eb"]
    assert len(node.reads) == 3


def test_the_cache_can_be_turned_off(start_worker: StartWorker) -> None:
    node = Node(immutable=True)
    env = {**os.environ, "BLOCKX_EXECUTOR_LOCAL_READ_CACHE": "0"}
    worker = start_worker(io_handler=node, env=env)
    worker.execute_call("c1", source=READS, args={"block": 7, "addr": ADDR, "n": 3})
    payload = _terminal(worker, "c1")
    assert payload[keys.FP_OUTPUT] == [1001, 1002, 1003]
    assert keys.FP_LOCAL_READ_HITS not in payload


def test_hits_are_reported_by_a_failed_call_too(start_worker: StartWorker) -> None:
    source = READS.replace("return [", "raise ValueError([").replace('["n"])]', '["n"])])')
    node = Node(immutable=True)
    worker = start_worker(io_handler=node)
    worker.execute_call("c1", source=source, args={"block": 7, "addr": ADDR, "n": 3})
    frame = worker.wait_terminal("c1", timeout=30)
    assert frame.message_type == keys.MT_CALL_FAILED
    payload = frame.envelope[keys.F_PAYLOAD]
    assert payload[keys.FP_ERROR_KIND] == "user_error"
    assert payload[keys.FP_LOCAL_READ_HITS] == {"rpc": {"eth_getBalance": 2}}
