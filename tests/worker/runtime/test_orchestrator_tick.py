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
from blockx.worker.actor.events import TaskCancelRequested, TickElapsed
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


def _past_budget(peer: object, call_id: str, *seqs: int, running_for_ms: int = 60_000) -> None:
    for seq in seqs:
        peer.heartbeat(  # type: ignore[attr-defined]
            seq=seq,
            runningCallId=call_id,
            runningForMs=running_for_ms,
            runningCallBudgetMs=1_000,
            # The old activity stamp says nothing any more: only runningForMs counts.
            lastSchedulerActiveAtMs=int(time.time() * 1000),
        )


def _completed(peer: object, call_id: str, attempt: int) -> None:
    peer.send(  # type: ignore[attr-defined]
        {
            keys.F_MESSAGE_TYPE: keys.MT_CALL_COMPLETED,
            keys.F_CALL_ID: call_id,
            keys.F_PAYLOAD: {
                keys.FP_TASK_ID: "t1",
                keys.FP_ATTEMPT_SEQ: attempt,
                keys.FP_OUTPUT: 1,
            },
        }
    )


def test_a_call_past_its_own_budget_is_a_suspect_then_fails_alone_as_wedged(run) -> None:
    """Two heartbeats show t1/c0 running 60 s on a 1 s budget: the executor is killed,
    c0 runs again alone (its neighbour elsewhere, unblamed); wedging again alone, it
    fails at once as executor_wedged."""

    async def scenario() -> None:
        async with OrchestratorRig(
            tick_interval_ms=20, config=DispatcherConfig(base_backoff_ms=1)
        ) as rig:
            peer = await rig.peer()
            task = rig.submit(
                {"slow": SLOW},
                [Call("slow", i) for i in range(2)],
                policy=TaskPolicy(failure="continue", max_attempts=3),
            )
            await peer.wait_frames(keys.MT_EXECUTE_CALL, 2)
            _past_budget(peer, "t1/c0", 2)
            await asyncio.sleep(0.1)  # one sighting is not enough: the executor may cut it
            assert rig.adapter.is_attached("exec-0")
            _past_budget(peer, "t1/c0", 3)
            await peer.wait_closed()
            await rig.until(lambda: rig.orchestrator.stats.wedged_calls == 1)
            ctx = rig.core.call_context("t1/c0")
            assert ctx is not None and ctx.suspect and ctx.attempt_count <= 1
            alone = await rig.peer("exec-1")
            [first] = await alone.wait_frames(keys.MT_EXECUTE_CALL)
            assert first.envelope[keys.F_CALL_ID] == "t1/c0"  # alone: c1 is not sent there
            await asyncio.sleep(0.05)
            assert len(alone.of_type(keys.MT_EXECUTE_CALL)) == 1
            _past_budget(alone, "t1/c0", 2)
            await asyncio.sleep(0.1)  # a tick sees it: the first sighting
            _past_budget(alone, "t1/c0", 3)
            await alone.wait_closed()
            healthy = await rig.peer("exec-2")
            [retried] = await healthy.wait_frames(keys.MT_EXECUTE_CALL)
            assert retried.envelope[keys.F_CALL_ID] == "t1/c1"
            _completed(healthy, "t1/c1", frame_attempt(retried))
            converged = await task.done
            [failed] = converged.failed_calls
            assert failed.index == 0 and failed.error.kind == "executor_wedged"
            assert not failed.error.retryable and failed.attempts == 1
            assert converged.succeeded_count == 1

    run(scenario())


def frame_attempt(frame: object) -> int:
    return int(frame.envelope[keys.F_PAYLOAD][keys.FP_ATTEMPT_SEQ])  # type: ignore[attr-defined]


def test_a_call_within_its_budget_or_unlimited_is_never_judged(run) -> None:
    async def scenario() -> None:
        async with OrchestratorRig(tick_interval_ms=10) as rig:
            peer = await rig.peer()
            task = rig.submit({"slow": SLOW}, [Call("slow", 1)])
            await peer.wait_frames(keys.MT_EXECUTE_CALL)
            for seq in range(2, 8):  # 5.9 s of a 1 s budget: within budget + 5 s
                _past_budget(peer, "t1/c0", seq, running_for_ms=5_900)
                await asyncio.sleep(0.02)
            for seq in range(8, 14):  # an unlimited budget, however long
                peer.heartbeat(
                    seq=seq, runningCallId="t1/c0", runningForMs=10**9, runningCallBudgetMs=0
                )
                await asyncio.sleep(0.02)
            assert rig.adapter.is_attached("exec-0")
            assert rig.orchestrator.stats.wedged_calls == 0
            _completed(peer, "t1/c0", 1)
            assert (await task.done).success

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


def test_silence_with_no_call_past_its_budget_is_a_transport_loss(run) -> None:
    """The executor fell silent (heartbeat timeout): nothing says a call caused it,
    so its call runs again elsewhere without spending its one attempt."""

    async def scenario() -> None:
        async with OrchestratorRig(tick_interval_ms=20, heartbeat_timeout_ms=150) as rig:
            peer = await rig.peer()
            task = rig.submit({"slow": SLOW}, [Call("slow", 1)], policy=TaskPolicy(max_attempts=1))
            await peer.wait_frames(keys.MT_EXECUTE_CALL)
            await peer.wait_closed(timeout=5)
            assert rig.orchestrator.stats.wedged_calls == 0
            other = await rig.peer("exec-1")
            [again] = await other.wait_frames(keys.MT_EXECUTE_CALL)
            _completed(other, "t1/c0", frame_attempt(again))
            converged = await task.done
            assert converged.success and converged.failed_count == 0

    run(scenario())


def test_silence_while_a_call_runs_past_its_budget_is_a_wedge_by_that_call(run) -> None:
    """The C-code case: the last heartbeat named t1/c0 at 5.95 s of a 1 s budget (not
    yet past budget + 5 s); the silence that follows takes it past: a wedge by c0."""

    async def scenario() -> None:
        async with OrchestratorRig(tick_interval_ms=20, heartbeat_timeout_ms=150) as rig:
            peer = await rig.peer()
            task = rig.submit({"slow": SLOW}, [Call("slow", 1)], policy=TaskPolicy(max_attempts=1))
            await peer.wait_frames(keys.MT_EXECUTE_CALL)
            _past_budget(peer, "t1/c0", 2, running_for_ms=5_950)
            await peer.wait_closed(timeout=5)
            await rig.until(lambda: rig.core.stats.executor_losses == 1)
            assert rig.orchestrator.stats.wedged_calls == 1
            ctx = rig.core.call_context("t1/c0")
            assert ctx is not None and ctx.suspect and ctx.attempt_count == 0
            rig.orchestrator.post(TaskCancelRequested(task_id=task.task_id, reason="user"))
            await task.done

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


def test_the_adapter_snapshot_carries_every_field_of_the_cores() -> None:
    """snapshot.py's promise: the core's ExecutorSnapshot is a subset, same names. The
    wedge backstop reads running_for_ms and running_call_budget_ms from it."""
    from dataclasses import fields

    from blockx.worker.core import ExecutorSnapshot as CoreSnapshot
    from blockx.worker.link.snapshot import ExecutorSnapshot as AdapterSnapshot

    adapter_fields = {f.name for f in fields(AdapterSnapshot)}
    missing = {f.name for f in fields(CoreSnapshot)} - adapter_fields - {"usable_contexts"}
    assert not missing, missing
