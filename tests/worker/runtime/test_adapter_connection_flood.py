"""A process flooding the worker's socket with connections cannot spend the worker's descriptors.

At most ``max_unattached`` connections that have not attached are held (the oldest is
dropped for a new one), each for at most ``attach_timeout_ms``; attached executors keep
running calls and the worker can still open files.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from executor_peer import Recorder

from blockx.wire import keys
from blockx.worker.link.adapter import ExecutorAdapter
from blockx.worker.pool.manager import PoolManager

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

ADDER = "def _(p):\n    return {'y': p['x'] + 1}\n"
ADDER_DIGEST = "sha256:" + hashlib.sha256(ADDER.encode()).hexdigest()

#: Connects as fast as it can, keeps every socket, until told to stop; prints its count.
FLOODER = r"""
import os, socket, sys, time
path, stop = sys.argv[1], sys.argv[2]
held = []
connected = 0
while not os.path.exists(stop):
    if len(held) >= 3000:
        time.sleep(0.01)
        continue
    s = socket.socket(socket.AF_UNIX)
    s.setblocking(False)
    try:
        s.connect(path)
    except (BlockingIOError, InterruptedError):
        held.append(s)  # in the backlog
        continue
    except OSError:
        s.close()
        time.sleep(0.001)
        continue
    held.append(s)
    connected += 1
print(connected, flush=True)
"""


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_connection_flood_leaves_the_worker_fds_bounded_and_calls_running(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        rec = Recorder()

        def resolver(task_id: str, function_id: str, digest: str) -> str:
            return ADDER

        async with ExecutorAdapter(
            callbacks=rec.callbacks(),
            function_code_resolver=resolver,
            max_unattached=8,
            attach_timeout_ms=2000,
        ) as adapter:
            pool = PoolManager(adapter.socket_path, executor_count=1, heartbeat_interval_s=0.2)
            adapter.set_peer_check(pool.check_peer)
            adapter.set_exit_source(pool)
            async with pool:
                await rec.wait("attached", timeout=60)
                baseline = _open_fds()
                stop = tmp_path / "stop"
                flooder = subprocess.Popen(
                    [sys.executable, "-c", FLOODER, adapter.socket_path, str(stop)],
                    stdout=subprocess.PIPE,
                    text=True,
                )
                try:
                    most = baseline
                    loop = asyncio.get_running_loop()
                    deadline = loop.time() + 3.0
                    completed = 0
                    i = 0
                    while loop.time() < deadline:
                        most = max(most, _open_fds())
                        # Calls keep running on the attached executor meanwhile.
                        adapter.bind(f"t1/c{i}", "exec-0")
                        adapter.send_execute_call("exec-0", f"t1/c{i}", _execute({"x": i}))
                        i += 1
                        await rec.wait("completed", i, timeout=30)
                        completed = len(rec.named("completed"))
                        # ... and the worker can still open files.
                        with open(tmp_path / "probe", "w") as probe:
                            probe.write("ok")
                        await asyncio.sleep(0.02)
                finally:
                    stop.touch()
                    out, _ = flooder.communicate(timeout=30)
                connections = int(out.strip() or 0)
                assert connections > 50, "the flood did not get going"
                # Held: the 8 unattached ones, plus what one loop iteration accepts (the
                # backlog, 16) and what the previous one dropped and is closing.
                assert most - baseline <= 8 + 3 * 16, (most, baseline)
                assert adapter.dropped_unattached >= connections - 16
                assert completed == i and completed >= 5
                assert adapter.is_attached("exec-0")
                assert rec.named("lost") == []

    asyncio.run(scenario())


def _execute(args: Any) -> dict[str, Any]:
    return {
        keys.FP_TASK_ID: "t1",
        keys.FP_FUNCTION_ID: "adder",
        keys.FP_FUNCTION_CODE_DIGEST: ADDER_DIGEST,
        keys.FP_ENTRY_SELECTOR: "_",
        keys.FP_ARGS: args,
        keys.FP_CALL_BUDGET_MS: 10_000,
        keys.FP_ATTEMPT_SEQ: 1,
    }
