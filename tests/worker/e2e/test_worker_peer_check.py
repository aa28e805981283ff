"""End to end: only the process the pool started for a slot may attach as that executor.

An impostor on the worker's socket (another process claiming a pool executor's id, or
an id no slot has) is refused at its Heartbeat: its connection is closed, nothing is
attached, the real executor keeps its era, and tasks carry on.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys

import pytest
from e2e_support import ADDER, WorkerSession, e2e_config

from blockx.wire import FrameDecoder, encode_frame, keys
from blockx.worker.api import Call, Task
from blockx.worker.pool.manager import _descends_from

pytestmark = [pytest.mark.timeout(120)]


def _heartbeat(executor_id: str) -> bytes:
    payload = {
        keys.FP_EXECUTOR_ID: executor_id,
        keys.FP_HEARTBEAT_SEQ: 1,
        keys.FP_RUNNABLE_COUNT: 0,
        keys.FP_INFLIGHT_COUNT: 0,
        keys.FP_AVAILABLE_CONTEXTS: 128,
        keys.FP_MEMORY_BYTES: 50_000_000,
        keys.FP_LAST_SCHEDULER_ACTIVE_AT_MS: 1_700_000_000_000,
        keys.FP_RUNNING_CALL_ID: None,
    }
    return encode_frame(
        {
            keys.F_MESSAGE_TYPE: keys.MT_HEARTBEAT,
            keys.F_EXECUTOR_ID: executor_id,
            keys.F_PAYLOAD: payload,
        }
    )


async def _impostor(socket_path: str, executor_id: str) -> list[str]:
    """Attach as ``executor_id`` from this process; the message types received until
    the worker closes the connection."""
    reader, writer = await asyncio.open_unix_connection(socket_path)
    writer.write(_heartbeat(executor_id))
    await writer.drain()
    decoder = FrameDecoder()
    seen: list[str] = []
    while data := await asyncio.wait_for(reader.read(65536), 10):
        seen += [frame[0][keys.F_MESSAGE_TYPE] for frame in decoder.feed(data)]
    writer.close()
    return seen


@pytest.mark.slow
def test_an_impostor_cannot_attach_as_a_pool_executor() -> None:
    with WorkerSession(e2e_config(**{"pool.executor_count": 2})) as session:
        worker = session.worker
        adapter = worker.adapter
        before = {s.executor_id: s.era for s in adapter.snapshots()}
        assert sorted(before) == ["exec-0", "exec-1"]

        # This process (not the slot's executor) claims exec-0, then an id no slot has.
        assert session.run(_impostor(worker.socket_path, "exec-0")) == []
        assert session.run(_impostor(worker.socket_path, "exec-intruder")) == []
        assert adapter.refused_attaches == 2
        assert not adapter.is_attached("exec-intruder")
        assert {s.executor_id: s.era for s in adapter.snapshots()} == before
        assert all(adapter.is_attached(e) for e in before)

        result = session.run(
            worker.run_task(
                Task(functions={"add": ADDER}, calls=[Call("add", {"x": i}) for i in range(50)])
            )
        )
        assert result.success and result.outputs == [{"y": i + 1} for i in range(50)]


def test_descent_is_checked_through_the_process_tree() -> None:
    # A grandchild of this process descends from it; this process does not descend from
    # its child; an unknown pid descends from nothing.
    child = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys; subprocess.run([sys.executable, "
         "'-c', 'import sys; print(1, flush=True); sys.stdin.read()'], stdin=sys.stdin)"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert child.stdout is not None
        child.stdout.readline()  # the grandchild is up
        grandchildren = _children(child.pid)
        assert len(grandchildren) == 1
        assert _descends_from(grandchildren[0], child.pid)
        assert _descends_from(grandchildren[0], os.getpid())
        assert _descends_from(child.pid, child.pid)
        assert not _descends_from(os.getpid(), child.pid)
        assert not _descends_from(2**22 + 12345, child.pid)
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(10)


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as f:
        return [int(p) for p in f.read().split()]


@pytest.mark.slow
def test_an_attach_refused_while_the_worker_stops_its_executors_is_not_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Stopping, a worker may read an executor's attach only after it reaped that
    executor: an executor that connected before the socket was served (blockx run spawns
    them first) and was told to stop as bad input ended the run. The refusal is expected
    then: debug, not an error on the user's terminal. Before the stop it is an error."""
    with WorkerSession(e2e_config(**{"pool.executor_count": 1})) as session:
        worker = session.worker
        adapter = worker.adapter

        def refusals() -> list[logging.LogRecord]:
            return [r for r in caplog.records if "refused" in r.getMessage()]

        with caplog.at_level(logging.DEBUG, logger="blockx"):
            assert session.run(_impostor(worker.socket_path, "exec-intruder")) == []
            assert [r.levelno for r in refusals()] == [logging.ERROR]
            adapter.expect_disconnects()  # what Worker.close() does first
            assert session.run(_impostor(worker.socket_path, "exec-intruder")) == []
            assert [r.levelno for r in refusals()] == [logging.ERROR, logging.DEBUG]
        assert adapter.refused_attaches == 2
