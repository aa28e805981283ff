"""A run leaves no process that user code started (process spawn mode).

User code starts a child in a session of its own (``setsid``: outside the executor's
process group). The pool kills it with the executor (the tree, walked while the executor
lives), after the executor crashed (the mark in its environment), when the pool stops,
and -- when the worker itself was killed with SIGKILL -- at the next pool start.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from executor_peer import Recorder, process_is_gone

from blockx.wire import keys
from blockx.worker.link.adapter import ExecutorAdapter
from blockx.worker.pool import process_tree
from blockx.worker.pool.manager import PoolManager

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

#: Starts ``sleep`` in a new session, writes its pid to ``p['path']``, then sleeps or exits.
STARTER = """
import os, shutil, subprocess, time

def _(p):
    env = {} if p.get("clean_env") else None  # {}: no mark either
    child = subprocess.Popen([shutil.which("sleep"), "300"], start_new_session=True, env=env)
    with open(p["path"] + ".tmp", "w") as f:
        f.write(str(child.pid))
    os.rename(p["path"] + ".tmp", p["path"])
    if p.get("exit"):
        os._exit(p["exit"])
    time.sleep(300)
"""
DIGEST = "sha256:" + hashlib.sha256(STARTER.encode()).hexdigest()


def resolver(task_id: str, function_id: str, digest: str) -> str:
    return STARTER


def execute(args: Any) -> dict[str, Any]:
    return {
        keys.FP_TASK_ID: "t1",
        keys.FP_FUNCTION_ID: "starter",
        keys.FP_FUNCTION_CODE_DIGEST: DIGEST,
        keys.FP_ENTRY_SELECTOR: "_",
        keys.FP_ARGS: args,
        keys.FP_CALL_BUDGET_MS: 300_000,
        keys.FP_ATTEMPT_SEQ: 1,
    }


@asynccontextmanager
async def linked_pool(rec: Recorder) -> AsyncIterator[tuple[ExecutorAdapter, PoolManager]]:
    async with ExecutorAdapter(
        callbacks=rec.callbacks(), function_code_resolver=resolver
    ) as adapter:
        pool = PoolManager(
            adapter.socket_path, executor_count=1, heartbeat_interval_s=0.2, restart_delay_ms=50
        )
        adapter.set_peer_check(pool.check_peer)
        adapter.set_exit_source(pool)
        async with pool:
            await rec.wait("attached", timeout=60)
            yield adapter, pool


async def start_child(adapter: ExecutorAdapter, path: Path, **args: Any) -> int:
    adapter.bind("t1/starter", "exec-0")
    adapter.send_execute_call("exec-0", "t1/starter", execute({"path": str(path), **args}))
    deadline = time.monotonic() + 30
    while not path.exists():
        assert time.monotonic() < deadline, "the call never started its child"
        await asyncio.sleep(0.02)
    pid = int(path.read_text())
    if not args.get("exit"):  # (an exiting call's child may be killed already)
        assert not process_is_gone(pid)
    return pid


async def gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not process_is_gone(pid):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)  # do not leave it behind the failing test
            return False
        await asyncio.sleep(0.02)
    return True


def test_kill_executor_kills_a_child_that_left_the_process_group(tmp_path: Path) -> None:
    async def scenario() -> None:
        rec = Recorder()
        async with linked_pool(rec) as (adapter, pool):
            child = await start_child(adapter, tmp_path / "pid")
            assert os.getpgid(child) != pool.pid("exec-0")
            assert pool.kill_executor("exec-0")
            assert await gone(child)

    asyncio.run(scenario())


def test_a_child_of_a_crashed_executor_is_killed_by_its_mark(tmp_path: Path) -> None:
    async def scenario() -> None:
        rec = Recorder()
        async with linked_pool(rec) as (adapter, _pool):
            child = await start_child(adapter, tmp_path / "pid", exit=3)
            await rec.wait("lost", timeout=30)
            assert rec.loss().cause == "executor_crashed"
            assert await gone(child)

    asyncio.run(scenario())


def test_stopping_the_pool_kills_what_its_executors_started(tmp_path: Path) -> None:
    async def scenario() -> None:
        rec = Recorder()
        async with linked_pool(rec) as (adapter, _pool):
            child = await start_child(adapter, tmp_path / "pid")
        assert await gone(child)

    asyncio.run(scenario())


def test_pools_of_one_process_leave_each_others_processes_alone(tmp_path: Path) -> None:
    async def scenario() -> None:
        rec_a, rec_b = Recorder(), Recorder()
        async with linked_pool(rec_b) as (adapter_b, pool_b):
            child = await start_child(adapter_b, tmp_path / "pid")
            executor_b = pool_b.pid("exec-0")
            assert executor_b is not None
            async with linked_pool(rec_a) as (_adapter_a, pool_a):
                # Same slot name, same generation: its exit must not touch pool B's.
                assert pool_a.kill_executor("exec-0")
                await rec_a.wait("attached", 2, timeout=60)
            await asyncio.sleep(0.3)  # pool A stopped and swept its marks
            assert not process_is_gone(executor_b) and not process_is_gone(child)
            assert rec_b.named("lost") == []
        assert await gone(child)

    asyncio.run(scenario())


def test_stopping_the_pool_kills_a_child_without_the_mark(tmp_path: Path) -> None:
    """A child that left the group and cleared its environment: the tree seen before the
    executors were told to stop still names it."""

    async def scenario() -> None:
        rec = Recorder()
        async with linked_pool(rec) as (adapter, _pool):
            child = await start_child(adapter, tmp_path / "pid", clean_env=True)
            with open(f"/proc/{child}/environ", "rb") as f:
                assert process_tree.MARK_ENV.encode() not in f.read()
        assert await gone(child)

    asyncio.run(scenario())


#: A worker's link and pool in a process of its own: runs the starter call, then waits to be
#: killed.
WORKER = r"""
import asyncio, hashlib, sys
sys.path.insert(0, sys.argv[2])
from test_pool_process_cleanup import Recorder, linked_pool, start_child
from pathlib import Path

async def main():
    rec = Recorder()
    async with linked_pool(rec) as (adapter, pool):
        await start_child(adapter, Path(sys.argv[1]))
        await asyncio.sleep(300)

asyncio.run(main())
"""


def test_what_a_worker_killed_with_sigkill_left_is_killed_at_the_next_pool_start(
    tmp_path: Path,
) -> None:
    here = os.path.dirname(__file__)
    path = tmp_path / "pid"
    worker = subprocess.Popen([sys.executable, "-c", WORKER, str(path), here])
    try:
        deadline = time.monotonic() + 60
        while not path.exists():
            assert worker.poll() is None, "the worker process ended early"
            assert time.monotonic() < deadline, "the worker never started the child"
            time.sleep(0.02)
        child = int(path.read_text())
    finally:
        worker.kill()
        worker.wait()
    # The worker is gone (its executor with it: the parent-death signal); the child that
    # left the group lives on, reparented, until a pool starts. Not asserted alive here:
    # kill_orphans is machine-wide, so a pool another test starts at this moment may be the
    # one that kills it (the same code); what must hold is that it is gone once a pool started.

    async def scenario() -> None:
        rec = Recorder()
        async with linked_pool(rec):
            assert await gone(child)

    asyncio.run(scenario())


def test_kill_orphans_spares_processes_of_live_workers(tmp_path: Path) -> None:
    live_mark = process_tree.mark_of(process_tree.worker_mark_prefix(), "exec-9", 1)
    dead_mark = "999999999:1:abcd:exec-9:1"
    env = dict(os.environ)
    sleepers = {}
    for name, mark in (("live", live_mark), ("dead", dead_mark)):
        env[process_tree.MARK_ENV] = mark
        sleepers[name] = subprocess.Popen(["sleep", "300"], env=env, start_new_session=True)
    try:
        killed = process_tree.kill_orphans()
        # The dead worker's process is killed -- by this call, or by a pool another test
        # started at this moment (kill_orphans is machine-wide); the live one never.
        assert sleepers["live"].pid not in killed
        assert sleepers["dead"].wait(timeout=10) == -signal.SIGKILL
        assert sleepers["live"].poll() is None
        assert process_tree.kill_marked(live_mark) == [sleepers["live"].pid]
        assert sleepers["live"].wait(timeout=10) == -signal.SIGKILL
    finally:
        for process in sleepers.values():
            if process.poll() is None:
                process.kill()
                process.wait()
