"""Every lost era is reported with an ExecutorLoss saying why (real processes through the pool).

The adapter's exit source is the pool: a connection that ends waits for the process's exit
status and black box, and the loss's cause comes from them (docs/security.md, "Fault
containment").
"""

from __future__ import annotations

import asyncio
import hashlib
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from executor_peer import Recorder

from blockx.wire import RemoteError, keys
from blockx.wire.blackbox import EXIT_MEMORY_EXCEEDED
from blockx.worker.link.adapter import ExecutorAdapter
from blockx.worker.link.loss import ExecutorLoss
from blockx.worker.pool.manager import PoolManager
from blockx.worker.pool.spawner import ExecutorLaunchSpec, ProcessSpawner

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

FUNCTIONS = {
    "exit3": "import os\n\ndef _(p):\n    os._exit(3)\n",
    "segv": "import ctypes\n\ndef _(p):\n    ctypes.string_at(0)\n",
    "sleeper": "import time\n\ndef _(p):\n    time.sleep(p['seconds'])\n    return {'slept': True}\n",
}
DIGESTS = {
    name: "sha256:" + hashlib.sha256(s.encode()).hexdigest() for name, s in FUNCTIONS.items()
}
SOURCES = {DIGESTS[name]: source for name, source in FUNCTIONS.items()}


def resolver(task_id: str, function_id: str, digest: str) -> str | RemoteError:
    source = SOURCES.get(digest)
    if source is None:
        return RemoteError(kind="function_code_fetch_failed", message="unknown digest")
    return source


def execute(name: str, args: Any, attempt: int = 1) -> dict[str, Any]:
    return {
        keys.FP_TASK_ID: "t1",
        keys.FP_FUNCTION_ID: name,
        keys.FP_FUNCTION_CODE_DIGEST: DIGESTS[name],
        keys.FP_ENTRY_SELECTOR: "_",
        keys.FP_ARGS: args,
        keys.FP_CALL_BUDGET_MS: 30_000,
        keys.FP_ATTEMPT_SEQ: attempt,
    }


@asynccontextmanager
async def linked_pool(
    rec: Recorder, *, spawner: ProcessSpawner | None = None, **pool_kwargs: Any
) -> AsyncIterator[tuple[ExecutorAdapter, PoolManager]]:
    """An adapter whose exit source is a one-slot pool, as the worker wires them."""
    async with ExecutorAdapter(
        callbacks=rec.callbacks(), function_code_resolver=resolver
    ) as adapter:
        pool = PoolManager(
            adapter.socket_path,
            executor_count=1,
            heartbeat_interval_s=0.2,
            restart_delay_ms=50,
            spawner=spawner,
            **pool_kwargs,
        )
        adapter.set_peer_check(pool.check_peer)
        adapter.set_exit_source(pool)
        async with pool:
            await rec.wait("attached", timeout=60)
            yield adapter, pool


async def run_one(adapter: ExecutorAdapter, rec: Recorder, name: str, args: Any) -> ExecutorLoss:
    adapter.bind(f"t1/{name}", "exec-0")
    adapter.bind("t1/bystander", "exec-0")  # bound, never sent: not started
    adapter.send_execute_call("exec-0", f"t1/{name}", execute(name, args))
    [(executor_id, lost_calls, _reason)] = await rec.wait("lost", timeout=30)
    assert executor_id == "exec-0"
    assert {c.call_id for c in lost_calls} == {f"t1/{name}", "t1/bystander"}
    loss = rec.loss()
    assert "t1/bystander" not in loss.started_call_ids
    if loss.running_call_known:  # the executor's black box (where it writes one)
        assert loss.running_call_id == f"t1/{name}"
    return loss


def test_a_call_that_exits_the_process_is_reported_crashed_with_its_status() -> None:
    async def scenario() -> None:
        rec = Recorder()
        async with linked_pool(rec) as (adapter, _pool):
            loss = await run_one(adapter, rec, "exit3", {})
            assert loss.cause == "executor_crashed"
            assert "status 3" in loss.message and loss.returncode == 3

    asyncio.run(scenario())


def test_a_segfault_is_reported_crashed_by_sigsegv() -> None:
    async def scenario() -> None:
        rec = Recorder()
        async with linked_pool(rec) as (adapter, _pool):
            loss = await run_one(adapter, rec, "segv", {})
            assert loss.cause == "executor_crashed"
            assert "SIGSEGV" in loss.message

    asyncio.run(scenario())


def test_an_executor_killed_by_the_worker_is_reported_with_the_kill_cause() -> None:
    async def scenario() -> None:
        rec = Recorder()
        async with linked_pool(rec) as (adapter, pool):
            adapter.bind("t1/slow", "exec-0")
            adapter.send_execute_call("exec-0", "t1/slow", execute("sleeper", {"seconds": 60}))
            await _running(rec)
            assert pool.kill_executor("exec-0", "wedged on t1/slow")
            await rec.wait("lost", timeout=30)
            loss = rec.loss()
            assert loss.cause == "executor_wedged"
            assert "wedged on t1/slow" in loss.message and "SIGKILL" in loss.message

    asyncio.run(scenario())


def test_stopping_the_pool_reports_shutdown() -> None:
    async def scenario() -> None:
        rec = Recorder()
        async with linked_pool(rec) as (adapter, pool):
            adapter.bind("t1/slow", "exec-0")
            adapter.send_execute_call("exec-0", "t1/slow", execute("sleeper", {"seconds": 60}))
            await _running(rec)
            await pool.stop()
            await rec.wait("lost", timeout=30)
            assert rec.loss().cause == "shutdown"

    asyncio.run(scenario())


async def _running(rec: Recorder) -> None:
    """Until a heartbeat shows the call in flight on the executor."""
    deadline = asyncio.get_running_loop().time() + 30
    while not any(s.inflight_count for _, s in rec.named("heartbeat")):
        assert asyncio.get_running_loop().time() < deadline, "the call never started"
        await asyncio.sleep(0.02)


# --- the black box, independent of the executor: a scripted process that attaches ----------

#: Attaches as the slot's executor, names a running call in its black box, sets a cause and
#: exits with a status: what an executor does when its memory watchdog fires.
BOXED = r"""
import os, socket, sys
from blockx.wire import encode_frame, keys
from blockx.wire.blackbox import BlackboxWriter
sock_path, box_path, executor_id, cause, status = sys.argv[1:6]
box = BlackboxWriter(box_path)
s = socket.socket(socket.AF_UNIX)
s.connect(sock_path)
s.sendall(encode_frame({keys.F_MESSAGE_TYPE: keys.MT_HEARTBEAT, keys.F_PAYLOAD: {
    keys.FP_EXECUTOR_ID: executor_id, keys.FP_HEARTBEAT_SEQ: 1, keys.FP_RUNNABLE_COUNT: 0,
    keys.FP_INFLIGHT_COUNT: 0, keys.FP_AVAILABLE_CONTEXTS: 8, keys.FP_MEMORY_BYTES: 1,
    keys.FP_LAST_SCHEDULER_ACTIVE_AT_MS: 1, keys.FP_RUNNING_CALL_ID: None}}))
s.recv(1)  # attached (the HeartbeatAck)
while not os.path.exists(box_path + ".go"):
    import time; time.sleep(0.01)
box.enter(box.record_of("t1/hog", 4))
box.set_cause(int(cause))
os._exit(int(status))
"""


def boxed_spawner(cause: int, status: int) -> ProcessSpawner:
    def argv(spec: ExecutorLaunchSpec) -> list[str]:
        assert spec.blackbox_path is not None
        return [
            sys.executable,
            "-c",
            BOXED,
            spec.socket_path,
            spec.blackbox_path,
            spec.executor_id,
            str(cause),
            str(status),
        ]

    return ProcessSpawner(argv_factory=argv)


@pytest.mark.parametrize(
    ("cause", "status", "expected", "words"),
    [
        (1, EXIT_MEMORY_EXCEEDED, "memory_exceeded", "memory limit of 300 MB"),
        (0, 1, "executor_crashed", "status 1"),
    ],
)
def test_the_black_box_names_the_running_call(
    cause: int, status: int, expected: str, words: str
) -> None:
    async def scenario() -> None:
        rec = Recorder()
        spawner = boxed_spawner(cause, status)
        async with linked_pool(rec, spawner=spawner, memory_limit_mb=300) as (adapter, pool):
            box = pool._slots["exec-0"].blackbox_path
            assert box is not None
            adapter.bind("t1/hog", "exec-0")
            adapter.bind("t1/other", "exec-0")
            open(box + ".go", "w").close()
            [(_, lost_calls, _)] = await rec.wait("lost", timeout=30)
            loss = rec.loss()
            assert loss.cause == expected and words in loss.message
            assert loss.running_call_id == "t1/hog" and loss.running_call_known
            assert {c.call_id for c in lost_calls} == {"t1/hog", "t1/other"}

    asyncio.run(scenario())


class _WrappedSpawner(ProcessSpawner):
    """A spawner whose launcher reports a signal death as 128 + N (bubblewrap does)."""

    signals_as_exit_status = True


def test_a_launcher_reporting_128_plus_a_signal_is_read_as_that_signal() -> None:
    async def scenario() -> None:
        rec = Recorder()
        boxed = boxed_spawner(0, 139)
        spawner = _WrappedSpawner(argv_factory=boxed._argv_factory)
        async with linked_pool(rec, spawner=spawner) as (adapter, pool):
            box = pool._slots["exec-0"].blackbox_path
            assert box is not None
            adapter.bind("t1/hog", "exec-0")
            open(box + ".go", "w").close()
            await rec.wait("lost", timeout=30)
            loss = rec.loss()
            assert loss.cause == "executor_crashed" and loss.message == "killed by SIGSEGV"
            assert loss.returncode == -11

    asyncio.run(scenario())
