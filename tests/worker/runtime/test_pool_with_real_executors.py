"""The pool's real ``python -m blockx.executor`` processes attach to the adapter and run calls."""

from __future__ import annotations

import asyncio
import hashlib
import signal
from typing import Any

import pytest
from executor_peer import Recorder, eventually, process_is_gone

from blockx.wire import RemoteError, keys
from blockx.worker.link.adapter import ExecutorAdapter
from blockx.worker.pool.fork_server import ForkedProcess
from blockx.worker.pool.manager import PoolManager, SlotState
from blockx.worker.pool.spawner import ProcessSpawner

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

ADDER = "def _(p):\n    return {'y': p['x'] + 1}\n"
SLEEPER = "import time\n\ndef _(p):\n    time.sleep(p['seconds'])\n    return {'slept': True}\n"
SOURCES = {
    "sha256:" + hashlib.sha256(source.encode()).hexdigest(): source for source in (ADDER, SLEEPER)
}
ADDER_DIGEST, SLEEPER_DIGEST = SOURCES


def resolver(task_id: str, function_id: str, digest: str) -> str | RemoteError:
    source = SOURCES.get(digest)
    if source is None:
        return RemoteError(kind="function_code_fetch_failed", message="unknown digest")
    return source


def execute(digest: str, args: Any, attempt: int = 1) -> dict[str, Any]:
    return {
        keys.FP_TASK_ID: "t1",
        keys.FP_FUNCTION_ID: "adder" if digest == ADDER_DIGEST else "sleeper",
        keys.FP_FUNCTION_CODE_DIGEST: digest,
        keys.FP_ENTRY_SELECTOR: "_",
        keys.FP_ARGS: args,
        keys.FP_CALL_BUDGET_MS: 10_000,
        keys.FP_ATTEMPT_SEQ: attempt,
    }


def spawned_as_asked(pool: PoolManager, spawner: ProcessSpawner, forked: bool) -> None:
    """Each running executor was forked by the server when ``forked``, else started cold."""
    processes = [slot.process for slot in pool._slots.values()]
    assert processes and all(p is not None for p in processes)
    assert all(isinstance(p, ForkedProcess) is forked for p in processes), processes
    assert (spawner.fork_server is not None) is forked


SPAWNS = pytest.mark.parametrize("forked", [False, True], ids=["cold", "forked"])


@SPAWNS
def test_real_executors_attach_run_calls_and_stop_without_orphans(forked: bool) -> None:
    async def scenario() -> None:
        rec = Recorder()
        async with ExecutorAdapter(
            callbacks=rec.callbacks(), function_code_resolver=resolver
        ) as adapter:
            spawner = ProcessSpawner(fork_server=forked)
            pool = PoolManager(
                adapter.socket_path,
                executor_count=2,
                spawner=spawner,
                heartbeat_interval_s=0.2,
                max_inflight=16,
                restart_delay_ms=100,
                stop_grace_ms=5000,
            )
            await pool.start()
            try:
                attached = await rec.wait("attached", 2, timeout=60)
                spawned_as_asked(pool, spawner, forked)
                assert sorted(e for e, _ in attached) == ["exec-0", "exec-1"]
                assert all(s.usable_contexts == 16 for _, s in attached)
                for i, executor_id in enumerate(["exec-0", "exec-1", "exec-0"]):
                    call_id = f"t1/c{i}"
                    adapter.bind(call_id, executor_id)
                    adapter.send_execute_call(executor_id, call_id, execute(ADDER_DIGEST, {"x": i}))
                completed = await rec.wait("completed", 3, timeout=30)
                outputs = {c: p[keys.FP_OUTPUT] for _, c, p in completed}
                assert outputs == {"t1/c0": {"y": 1}, "t1/c1": {"y": 2}, "t1/c2": {"y": 3}}
                # Each executor fetched the source once (then it is compiled and cached).
                assert adapter.function_code_answered == 2
                assert adapter.reserved_calls("exec-0") == adapter.reserved_calls("exec-1") == ()
                await rec.wait("heartbeat", 2, timeout=10)  # heartbeats keep flowing
                pids = list(pool.pids().values())
            finally:
                await pool.stop()
            lost = await rec.wait("lost", 2, timeout=10)
            assert sorted(e for e, _, _ in lost) == ["exec-0", "exec-1"]
            assert all(calls == () for _, calls, _ in lost)
            assert all(process_is_gone(pid) for pid in pids)
            assert {s.last_returncode for s in pool.slots()} == {0}  # clean SIGTERM exits

    asyncio.run(scenario())


@SPAWNS
def test_killed_executor_loses_its_call_and_comes_back_in_a_new_era(forked: bool) -> None:
    async def scenario() -> None:
        rec = Recorder()
        async with ExecutorAdapter(
            callbacks=rec.callbacks(), function_code_resolver=resolver
        ) as adapter:
            spawner = ProcessSpawner(fork_server=forked)
            pool = PoolManager(
                adapter.socket_path,
                executor_count=1,
                spawner=spawner,
                heartbeat_interval_s=0.2,
                restart_delay_ms=100,
            )
            async with pool:
                await rec.wait("attached", timeout=60)
                adapter.bind("t1/slow", "exec-0")
                adapter.send_execute_call(
                    "exec-0", "t1/slow", execute(SLEEPER_DIGEST, {"seconds": 30}, attempt=1)
                )
                # Running: the executor reports it (its sleep is cooperative).
                await eventually(
                    lambda: (
                        rec.named("heartbeat") and rec.named("heartbeat")[-1][1].inflight_count == 1
                    ),
                    timeout=20,
                )
                first_pid = pool.pid("exec-0")
                assert first_pid is not None
                assert pool.kill_executor("exec-0")  # the wedge backstop
                [(executor_id, lost_calls, reason)] = await rec.wait("lost", timeout=10)
                assert executor_id == "exec-0"
                assert [(c.call_id, c.attempt_seq) for c in lost_calls] == [("t1/slow", 1)]
                assert "closed" in reason or "lost" in reason
                assert rec.named("completed") == rec.named("failed") == []
                # The slot restarts and the executor reattaches: era 2, nothing reserved.
                [_, (_, snapshot)] = await rec.wait("attached", 2, timeout=60)
                assert snapshot.era == 2 and snapshot.local_inflight == 0
                assert pool.slot("exec-0").last_returncode == -signal.SIGKILL
                assert pool.slot_state("exec-0") is SlotState.RUNNING
                assert process_is_gone(first_pid)
                spawned_as_asked(pool, spawner, forked)
                # The retried attempt runs on the new process.
                adapter.bind("t1/slow", "exec-0")
                adapter.send_execute_call(
                    "exec-0", "t1/slow", execute(SLEEPER_DIGEST, {"seconds": 0.01}, attempt=2)
                )
                [(_, call_id, payload)] = await rec.wait("completed", timeout=30)
                assert call_id == "t1/slow" and payload[keys.FP_OUTPUT] == {"slept": True}
                assert payload[keys.FP_ATTEMPT_SEQ] == 2

    asyncio.run(scenario())
