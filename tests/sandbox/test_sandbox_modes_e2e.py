"""Key worker end-to-end scenarios in both spawn modes: ``process`` and ``sandbox``.

The same tasks, on real executors, with the same assertions: a basic task, a
sub-call chain, an executor killed with SIGKILL mid-call (retried, nothing
lost or duplicated), and the wedge backstop (an executor stuck in code that
swallows its deadline is killed and the call fails as ``executor_wedged``).
The sandbox runs are skipped, with the reason, only where bubblewrap or user
namespaces are unavailable.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator

import pytest
from sandbox_support import (
    SLEEPER,
    SPAWN_MODES,
    WEDGE_KNOBS,
    cgroup_dirs_left,
    processes_mentioning,
    session_for,
    wedge_is_killed,
)
from sandbox_support import WorkerSession as Session

from blockx.worker.api import Call, Task
from blockx.worker.pool.sandbox import SandboxSpawner

pytestmark = [pytest.mark.timeout(60)]

ADDER = "def _(p):\n    return {'y': p['x'] + 1}\n"
PARENT = """
def _(p):
    a = function.call("double", {"v": p["i"]})
    b = function.call("double", {"v": a["v"]})
    return {"i": p["i"], "quad": b["v"]}
"""
DOUBLE = "def _(p):\n    return {'v': p['v'] * 2}\n"


def _closed_cleanly(session: Session) -> None:
    """Close the session (asserts: no executor left, socket dir removed), then check that
    no process of it is left at all — the sandboxed pythons included — and, for the
    sandbox, that its cgroups are gone."""
    socket_dir = session.socket_dir
    session.close()
    if socket_dir is not None:
        assert processes_mentioning(socket_dir) == []
    if isinstance(session.spawner, SandboxSpawner):
        assert cgroup_dirs_left(session.spawner) == []


@pytest.fixture(scope="module", params=SPAWN_MODES)
def session(request: pytest.FixtureRequest) -> Iterator[Session]:
    s = session_for(request.param).start()
    try:
        yield s
    finally:
        _closed_cleanly(s)


def test_a_basic_task(session: Session) -> None:
    async def scenario() -> None:
        task = Task(functions={"adder": ADDER}, calls=[Call("adder", {"x": i}) for i in range(300)])
        result = await session.worker.run_task(task)
        assert result.success and result.errors == []
        assert result.outputs == [{"y": i + 1} for i in range(300)]

    session.run(scenario())


def test_sub_calls(session: Session) -> None:
    async def scenario() -> None:
        task = Task(
            functions={"parent": PARENT, "double": DOUBLE},
            calls=[Call("parent", {"i": i}) for i in range(50)],
        )
        result = await session.worker.run_task(task)
        assert result.success, result.errors[:3]
        assert result.outputs == [{"i": i, "quad": i * 4} for i in range(50)]
        assert result.stats.subcalls == 100

    session.run(scenario())


@pytest.mark.slow
@pytest.mark.parametrize("mode", SPAWN_MODES)
def test_kill_9_mid_call_is_retried_and_loses_nothing(mode: str) -> None:
    session = session_for(mode, **{"dispatcher.default_max_attempts": 3}).start()
    try:

        async def scenario() -> None:
            worker = session.worker
            calls = [Call("sleeper", {"i": i, "s": 0.3}) for i in range(300)]
            handle = worker.submit(Task(functions={"sleeper": SLEEPER}, calls=calls))
            adapter = worker.adapter
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 20
            while len(adapter.reserved_calls("exec-0")) < 80:
                assert loop.time() < deadline, "exec-0 never held 80 calls"
                await asyncio.sleep(0.01)
            victim = worker.pool.pid("exec-0")
            assert victim is not None
            os.kill(victim, signal.SIGKILL)
            result = await handle.result()
            assert result.success, result.errors[:3]
            assert result.outputs == [{"i": i} for i in range(300)]  # none lost, none twice
            # Nothing blames the sleeping calls (none had sent a frame from user code, and
            # none held the executor's thread): each runs again without spending an attempt.
            assert result.stats.retries == 0
            slot = worker.pool.slot("exec-0")
            assert slot.last_returncode == -signal.SIGKILL and slot.restarts_total >= 1
            while not worker.adapter.is_attached("exec-0"):
                assert loop.time() < deadline + 20, "exec-0 did not come back"
                await asyncio.sleep(0.01)
            after = await worker.run_task(
                Task(functions={"adder": ADDER}, calls=[Call("adder", {"x": i}) for i in range(20)])
            )
            assert after.outputs == [{"y": i + 1} for i in range(20)]

        session.run(scenario())
    finally:
        _closed_cleanly(session)


@pytest.mark.slow
@pytest.mark.parametrize("mode", SPAWN_MODES)
def test_the_wedge_backstop_kills_code_that_swallows_its_deadline(mode: str) -> None:
    session = session_for(mode, **WEDGE_KNOBS).start()
    try:
        # The killed slot comes back and serves again.
        session.run(wedge_is_killed(session.worker, sleepers=40))
    finally:
        _closed_cleanly(session)
