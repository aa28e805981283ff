"""Orchestrator: the tick — snapshot sync, the wedge backstop, heartbeat timeouts.

Scripted peers report what a wedged or silent executor would; the rig has no
pool, so the backstop drops the connection instead of killing a process.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from orchestrator_rig import OrchestratorRig

from blockx.wire import keys
from blockx.worker.adapters.orchestrator_events import TickElapsed
from blockx.worker.api import Call, TaskPolicy
from blockx.worker.core import DispatcherConfig

pytestmark = pytest.mark.timeout(30)

SLOW = "def _(p):\n    return p\n"


def test_the_tick_syncs_snapshots_into_the_core(run) -> None:
    async def scenario() -> None:
        async with OrchestratorRig(tick_interval_ms=20) as rig:
            peer = await rig.peer("exec-0", availableContexts=8)
            assert rig.core.executor_state("exec-0").usable_contexts == 8  # type: ignore[union-attr]
            peer.heartbeat(seq=2, availableContexts=3)
            await rig.until(
                lambda: rig.core.executor_state("exec-0").usable_contexts == 3  # type: ignore[union-attr]
            )

    run(scenario())


def test_a_wedged_executor_loses_its_connection_and_its_call_fails_as_wedged(run) -> None:
    async def scenario() -> None:
        async with OrchestratorRig(
            tick_interval_ms=20, config=DispatcherConfig(base_backoff_ms=1)
        ) as rig:
            peer = await rig.peer()
            task = rig.submit(
                {"slow": SLOW},
                [Call("slow", i) for i in range(2)],
                policy=TaskPolicy(failure="continue"),
            )
            await peer.wait_frames(keys.MT_EXECUTE_CALL, 2)
            now_ms = int(time.time() * 1000)
            peer.heartbeat(seq=2, runningCallId="t1/c0", lastSchedulerActiveAtMs=now_ms - 60_000)
            await peer.wait_closed()
            await rig.until(lambda: rig.orchestrator.stats.wedged_calls == 1)
            # The wedged call failed for good; the other was lost with the executor and
            # waits to be retried on a healthy executor.
            healthy = await rig.peer("exec-1")
            [retried] = await healthy.wait_frames(keys.MT_EXECUTE_CALL)
            assert retried.envelope[keys.F_CALL_ID] == "t1/c1"
            healthy.send(
                {
                    keys.F_MESSAGE_TYPE: keys.MT_CALL_COMPLETED,
                    keys.F_CALL_ID: "t1/c1",
                    keys.F_PAYLOAD: {
                        keys.FP_TASK_ID: "t1",
                        keys.FP_ATTEMPT_SEQ: 2,
                        keys.FP_OUTPUT: 1,
                    },
                }
            )
            converged = await task.done
            [failed] = converged.failed_calls
            assert failed.index == 0 and failed.error.kind == "executor_wedged"
            assert not failed.error.retryable
            assert converged.succeeded_count == 1

    run(scenario())


def test_an_idle_executor_is_never_wedged(run) -> None:
    async def scenario() -> None:
        async with OrchestratorRig(tick_interval_ms=10) as rig:
            peer = await rig.peer()
            peer.heartbeat(seq=2, runningCallId=None, lastSchedulerActiveAtMs=0)
            await asyncio.sleep(0.1)
            assert rig.adapter.is_attached("exec-0")
            assert rig.orchestrator.stats.wedged_calls == 0

    run(scenario())


def test_a_silent_executor_is_lost_at_the_heartbeat_timeout(run) -> None:
    async def scenario() -> None:
        async with OrchestratorRig(tick_interval_ms=20, heartbeat_timeout_ms=150) as rig:
            peer = await rig.peer()
            task = rig.submit({"slow": SLOW}, [Call("slow", 1)], policy=TaskPolicy(max_attempts=1))
            await peer.wait_frames(keys.MT_EXECUTE_CALL)
            await peer.wait_closed(timeout=5)
            converged = await task.done
            [failed] = converged.failed_calls
            assert failed.error.kind == "transport_lost" and failed.error.retryable

    run(scenario())


def test_late_ticks_defer_the_heartbeat_check_only_once_in_a_row(run) -> None:
    # Under sustained overload every tick is late: a silent executor must still be lost.
    async def scenario() -> None:
        async with OrchestratorRig(tick_interval_ms=10_000, heartbeat_timeout_ms=150) as rig:
            peer = await rig.peer()
            await asyncio.sleep(0.3)  # its heartbeat is now older than the timeout
            rig.orchestrator.post(TickElapsed(late_ms=50_000))
            await asyncio.sleep(0.05)
            assert rig.adapter.is_attached("exec-0")  # deferred once
            rig.orchestrator.post(TickElapsed(late_ms=50_000))
            await peer.wait_closed(timeout=5)
            assert not rig.adapter.is_attached("exec-0")

    run(scenario())
