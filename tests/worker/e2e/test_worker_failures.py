"""End to end: executors that die, crash, wedge; tasks that are cancelled.

Each test has a worker of its own (the failures leave marks on it); every
session's close checks that no executor process outlived the worker and that
the socket directory is gone.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

import pytest
from e2e_support import (
    SLEEPER,
    WEDGE_KNOBS,
    RecordingSpawner,
    WorkerSession,
    e2e_config,
    eventually,
    process_is_gone,
    wedge_is_killed,
)

from blockx.worker.api import Call, Task, TaskPolicy
from blockx.worker.pool.manager import SlotState
from blockx.worker.pool.spawner import ExecutorLaunchSpec, executor_command

pytestmark = [pytest.mark.timeout(120)]


def _reserved(session: WorkerSession) -> int:
    adapter = session.worker.adapter
    return sum(len(adapter.reserved_calls(e)) for e in session.worker.pool.executor_ids)


@pytest.mark.slow
def test_kill_9_mid_call_retries_and_loses_or_duplicates_nothing() -> None:
    config = e2e_config(**{"dispatcher.default_max_attempts": 3})
    with WorkerSession(config) as session:

        async def scenario() -> None:
            worker = session.worker
            calls = [Call("sleeper", {"i": i, "s": 0.3}) for i in range(400)]
            handle = worker.submit(Task(functions={"sleeper": SLEEPER}, calls=calls))
            adapter = worker.adapter
            # Wait until exec-0 holds many suspended (sleeping) calls, then SIGKILL it.
            await eventually(lambda: len(adapter.reserved_calls("exec-0")) >= 100, timeout=20)
            victim = worker.pool.pid("exec-0")
            assert victim is not None
            os.kill(victim, signal.SIGKILL)
            result = await handle.result()
            assert result.success, result.errors[:3]
            assert result.outputs == [{"i": i} for i in range(400)]  # none lost, none twice
            # Nothing blames the sleeping calls (none was running user code): each runs
            # again without spending an attempt.
            assert result.stats.succeeded == 400 and result.stats.retries == 0
            assert process_is_gone(victim)
            slot = worker.pool.slot("exec-0")
            assert slot.last_returncode == -signal.SIGKILL and slot.restarts_total >= 1
            await eventually(lambda: worker.adapter.is_attached("exec-0"), timeout=30)

        session.run(scenario())


@pytest.mark.slow
def test_an_executor_that_keeps_crashing_backs_off_while_the_others_serve() -> None:
    def argv(spec: ExecutorLaunchSpec) -> Sequence[str]:
        if spec.executor_id == "exec-1":
            return [sys.executable, "-c", "import sys; sys.exit(7)"]
        return executor_command(spec)

    config = e2e_config(
        **{
            "pool.max_restarts": 2,
            "pool.restart_window_ms": 60_000,
            "pool.backoff_ms": 60_000,
            "pool.restart_delay_ms": 20,
        }
    )
    session = WorkerSession(config, spawner=RecordingSpawner(argv_factory=argv))
    session.start(wait_ready=False)
    try:

        async def scenario() -> None:
            worker = session.worker
            await worker.wait_ready(count=1)
            calls = [Call("sleeper", {"i": i, "s": 0.001}) for i in range(300)]
            result = await worker.run_task(Task(functions={"sleeper": SLEEPER}, calls=calls))
            assert result.outputs == [{"i": i} for i in range(300)]
            await eventually(lambda: worker.pool.slot_state("exec-1") is SlotState.BACKOFF, 10)
            crashed = worker.pool.slot("exec-1")
            assert crashed.last_returncode == 7 and crashed.exits_total == 3
            assert worker.pool.slot_state("exec-0") is SlotState.RUNNING
            assert worker.adapter.attached_executor_ids() == ["exec-0"]

        session.run(scenario())
    finally:
        session.close()


@pytest.mark.slow
def test_a_wedged_executor_is_killed_and_its_call_fails_clearly() -> None:
    with WorkerSession(e2e_config(**WEDGE_KNOBS)) as session:
        session.run(wedge_is_killed(session.worker, sleepers=50))


def test_cancelling_run_task_cancels_its_calls_on_the_executors() -> None:
    with WorkerSession(e2e_config()) as session:

        async def scenario() -> None:
            worker = session.worker
            calls = [Call("sleeper", {"i": i, "s": 30}) for i in range(20)]
            running = asyncio.ensure_future(
                worker.run_task(Task(functions={"sleeper": SLEEPER}, calls=calls))
            )
            await eventually(lambda: _reserved(session) == 20)
            running.cancel()
            with pytest.raises(asyncio.CancelledError):
                await running
            assert worker.orchestrator.live_task_ids == []
            # CancelCall reached the executors: their terminal frames release every context.
            await eventually(lambda: _reserved(session) == 0, timeout=5)
            await eventually(
                lambda: all(s.inflight_count == 0 for s in worker.adapter.snapshots()), timeout=5
            )
            # The worker is still good for the next task.
            after = await worker.run_task(
                Task(functions={"sleeper": SLEEPER}, calls=[Call("sleeper", {"i": 1, "s": 0})])
            )
            assert after.outputs == [{"i": 1}]

        session.run(scenario())


def test_a_cancelled_handle_reports_cancelled() -> None:
    with WorkerSession(e2e_config(**{"pool.executor_count": 1})) as session:

        async def scenario() -> None:
            worker = session.worker
            calls = [Call("sleeper", {"i": i, "s": 0.02 if i < 3 else 30}) for i in range(200)]
            handle = worker.submit(Task(functions={"sleeper": SLEEPER}, calls=calls))
            await eventually(lambda: _reserved(session) >= 100)
            await asyncio.sleep(0.2)  # the three short calls finish
            handle.cancel("enough")
            result = await handle.result()
            assert not result.success
            assert result.failure is not None and result.failure.kind == "CANCELLED"
            assert "enough" in result.failure.message
            assert result.stats.succeeded == 3 and result.stats.cancelled == 197
            assert result.outputs == [{"i": 0}, {"i": 1}, {"i": 2}]
            await eventually(lambda: _reserved(session) == 0, timeout=5)

        session.run(scenario())


def test_closing_the_worker_with_calls_in_flight_leaves_no_process() -> None:
    session = WorkerSession(e2e_config()).start()
    handle = None

    async def scenario() -> None:
        nonlocal handle
        worker = session.worker
        calls = [Call("sleeper", {"i": i, "s": 60}) for i in range(50)]
        handle = worker.submit(Task(functions={"sleeper": SLEEPER}, calls=calls))
        await eventually(lambda: _reserved(session) == 50)

    session.run(scenario())
    session.close()  # asserts: no orphan executor, socket directory removed
    assert handle is not None and handle.done()


class _NeverAnswers:
    """An IO handler whose answers never come."""

    def handle_io(self, task_id: str, call_id: str, payload: Any, sidecar: Any) -> Any:
        return asyncio.get_running_loop().create_future()


@pytest.mark.slow
def test_the_task_deadline_ends_a_task_whose_calls_wait_forever() -> None:
    # budget 0 (unlimited) and an IO backend that never answers: only the task's
    # wall-clock deadline ends it; the worker carries on.
    waiter = "from blockx.sdk import db\n\ndef _(p):\n    return db.get('t', p)\n"
    with WorkerSession(e2e_config()) as session:
        task = Task(
            functions={"w": waiter},
            calls=[Call("w", i) for i in range(3)],
            policy=TaskPolicy(call_budget_ms=0, deadline_ms=300),
            io_handler=_NeverAnswers(),
        )
        started = time.monotonic()
        result = session.run(session.worker.run_task(task), timeout=30)
        assert time.monotonic() - started < 10
        assert not result.success
        assert result.failure is not None and result.failure.kind == "CANCELLED"
        assert "task deadline of 300 ms passed" in result.failure.message
        after = session.run(
            session.worker.run_task(
                Task(functions={"a": SLEEPER}, calls=[Call("a", {"s": 0, "i": 1})])
            )
        )
        assert after.success and after.outputs == [{"i": 1}]
