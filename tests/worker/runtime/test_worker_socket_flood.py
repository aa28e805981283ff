"""User code that floods the worker's socket from inside an executor cannot starve the worker.

The issue's case: a function reads the socket path from its own argv and connects in a
loop (19,976 connections were accepted, then every Table read failed "Too many open
files"). The worker holds a bounded number of unattached connections, so its descriptors
stay bounded and Table reads keep working.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from blockx.worker.api import Call, Task, TaskPolicy
from blockx.worker.app import Worker
from blockx.worker.config import load_config
from blockx.worker.io.config import load_io_config
from blockx.worker.io.registry import IOSubsystem
from blockx.worker.pool.sandbox import sandbox_available

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

#: Connects until ``made`` connections got through (a full backlog refuses one: the
#: flooder pauses 1 ms and tries again), holding at most 400 at once. Bounded by
#: count, not by time, so a slow machine floods as hard as a fast one.
FLOOD = """
import socket, sys, time

def _(p):
    path = sys.argv[sys.argv.index("--socket-path") + 1]
    held = []
    made = 0
    tries = 0
    while made < p["made"] and tries < p["tries"]:
        tries += 1
        s = socket.socket(socket.AF_UNIX)
        s.setblocking(False)
        try:
            s.connect(path)
        except OSError:
            s.close()
            time.sleep(0.001)
            continue
        made += 1
        held.append(s)
        if len(held) > 400:
            held.pop(0).close()
    return {"made": made}
"""

WRITER = """
def _(p):
    return {"written": Table("prices").upsert_rows([{"key": p["k"], "usd": p["usd"]}])}
"""

READER = """
def _(p):
    return {"usd": Table("prices").get_row(p["k"])["usd"]}
"""


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("mode", ["process", "sandbox"])
def test_a_flood_from_user_code_leaves_fds_bounded_and_table_reads_working(
    tmp_path: Path, mode: str
) -> None:
    if mode == "sandbox":
        ok, reason = sandbox_available()
        if not ok:
            pytest.skip(f"sandbox mode unavailable here: {reason}")
    config = load_config(env={}).replace(
        **{"pool.executor_count": 2, "pool.heartbeat_interval_s": 0.2, "pool.spawn_mode": mode}
    )

    async def scenario() -> None:
        io = IOSubsystem(
            load_io_config({"blockdb": {"sqlite_path": str(tmp_path / "t.sqlite3")}}, env={})
        )
        try:
            async with Worker(config) as worker:
                await worker.wait_ready(timeout=60)
                write = Task(
                    functions={"w": WRITER},
                    calls=[Call("w", {"k": f"k{i}", "usd": i}) for i in range(20)],
                )
                write.io_handler = io.task_scope(write.task_id)
                assert (await worker.run_task(write)).success
                baseline = _open_fds()
                peak = baseline
                done = asyncio.Event()

                async def sample() -> None:
                    nonlocal peak
                    while not done.is_set():
                        peak = max(peak, _open_fds())
                        await asyncio.sleep(0.002)

                sampler = asyncio.create_task(sample())
                flood = Task(
                    functions={"flood": FLOOD},
                    calls=[Call("flood", {"made": 3_000, "tries": 60_000})],
                    policy=TaskPolicy(call_budget_ms=150_000),
                )
                read = Task(
                    functions={"r": READER}, calls=[Call("r", {"k": f"k{i}"}) for i in range(20)]
                )
                read.io_handler = io.task_scope(read.task_id)
                flooded, reads = await asyncio.gather(worker.run_task(flood), worker.run_task(read))
                done.set()
                await sampler
                assert flooded.success, flooded.errors
                assert flooded.outputs[0]["made"] == 3_000, flooded.outputs
                assert reads.success, reads.errors
                assert reads.outputs == [{"usd": i} for i in range(20)]
                assert peak - baseline <= 8 + 3 * 16 + 16, (peak, baseline)
                assert worker.adapter.dropped_unattached > 1000
                # And after it: reads still work.
                again = Task(functions={"r": READER}, calls=[Call("r", {"k": "k3"})])
                again.io_handler = io.task_scope(again.task_id)
                result = await worker.run_task(again)
                assert result.outputs == [{"usd": 3}]
        finally:
            await io.close()

    asyncio.run(scenario())
