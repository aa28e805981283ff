"""Orchestrator: DispatchCallCmd -> ExecuteCall, terminal frames, send/bind failures, loss.

A real adapter and core; the executor is a scripted peer. Both event loops.
"""

from __future__ import annotations

import asyncio

import pytest
from orchestrator_rig import OrchestratorRig, frame_payload, reply_completed

from blockx.wire import keys
from blockx.worker.actor.events import TaskCancelRequested
from blockx.worker.api import Call, TaskPolicy
from blockx.worker.code import source_digest
from blockx.worker.core import CallState, DispatcherConfig, call_key
from blockx.worker.errors import ExecutorCapacityError, OutboxFullError

pytestmark = pytest.mark.timeout(30)

ADDER = "def helper(x):\n    return x\n\ndef _(p):\n    return {'y': p['x'] + 1}\n"
NAMED = "def _private():\n    pass\n\ndef adder(p):\n    return p\n"
BROKEN = "def _(p):\n    return (\n"


def test_execute_call_carries_the_seeds_fields_and_the_output_converges(run) -> None:
    async def scenario() -> None:
        async with OrchestratorRig() as rig:
            peer = await rig.peer()
            task = rig.submit(
                {"adder": ADDER},
                [Call("adder", {"x": 41})],
                policy=TaskPolicy(call_budget_ms=1234, debug=True),
            )
            [frame] = await peer.wait_frames(keys.MT_EXECUTE_CALL)
            assert frame.envelope[keys.F_CALL_ID] == "t1/c0"
            payload = frame_payload(frame)
            digest = source_digest(ADDER)
            assert payload == {
                "taskId": "t1",
                "functionId": "adder",
                "functionCodeDigest": digest,
                "entrySelector": "_",
                "args": {"x": 41},
                "parentCallId": None,
                "callKey": call_key("adder", digest, b'{"x":41}'),
                "ancestry": [],
                "callBudgetMs": 1234,
                "attemptSeq": 1,
                "audit": None,
                "debug": True,
            }
            reply_completed(peer, frame, {"y": 42})
            converged = await task.done
            assert converged.success and converged.outputs == (b'{"y":42}',)
            assert rig.adapter.reserved_calls("exec-0") == ()
            assert rig.orchestrator.live_task_ids == []
            assert rig.code_view.view("t1") is None  # the pinned view is released

    run(scenario())


def test_the_entry_selector_follows_the_function_id_when_there_is_no_underscore(run) -> None:
    async def scenario() -> None:
        async with OrchestratorRig() as rig:
            peer = await rig.peer()
            rig.submit({"pkg/adder": NAMED}, [Call("pkg/adder", 1)])
            [frame] = await peer.wait_frames(keys.MT_EXECUTE_CALL)
            assert frame_payload(frame)["entrySelector"] == "adder"

    run(scenario())


def test_function_code_waits_are_answered_from_the_pinned_view(run) -> None:
    async def scenario() -> None:
        async with OrchestratorRig() as rig:
            peer = await rig.peer()
            rig.submit({"adder": ADDER}, [Call("adder", {"x": 1})])
            [frame] = await peer.wait_frames(keys.MT_EXECUTE_CALL)
            payload = frame_payload(frame)
            peer.send(
                {
                    keys.F_MESSAGE_TYPE: keys.MT_CALL_WAITING,
                    keys.F_CALL_ID: "t1/c0",
                    keys.F_REQUEST_ID: "req-1",
                    keys.F_PAYLOAD: {
                        keys.FP_TASK_ID: "t1",
                        keys.FP_ATTEMPT_SEQ: 1,
                        keys.FP_WAIT_KIND: "function_code",
                        keys.FP_FUNCTION_ID: "adder",
                        keys.FP_FUNCTION_CODE_DIGEST: payload["functionCodeDigest"],
                    },
                }
            )
            [resume] = await peer.wait_frames(keys.MT_RESUME_CALL)
            result = frame_payload(resume)[keys.FP_RESULT]
            assert result == {"source": ADDER, "functionCodeDigest": source_digest(ADDER)}
            # The dispatcher never saw the wait: the call is still RUNNING.
            ctx = rig.core.call_context("t1/c0")
            assert ctx is not None and ctx.state is CallState.RUNNING

    run(scenario())


def test_a_function_that_does_not_compile_fails_without_reaching_the_executor(run) -> None:
    async def scenario() -> None:
        async with OrchestratorRig() as rig:
            peer = await rig.peer()
            task = rig.submit(
                {"adder": ADDER, "broken": BROKEN},
                [Call("broken", 1), Call("adder", {"x": 1})],
                policy=TaskPolicy(failure="continue"),
            )
            [frame] = await peer.wait_frames(keys.MT_EXECUTE_CALL)
            assert frame.envelope[keys.F_CALL_ID] == "t1/c1"
            reply_completed(peer, frame, {"y": 2})
            converged = await task.done
            [failed] = converged.failed_calls
            assert failed.index == 0 and failed.error.kind == "user_error"
            assert "SyntaxError" in failed.error.message and "line 2" in failed.error.message
            assert failed.error.stack is not None and "<blockx:broken>" in failed.error.stack
            assert len(peer.of_type(keys.MT_EXECUTE_CALL)) == 1

    run(scenario())


def test_a_refused_execute_call_is_a_retryable_attempt_failure(run) -> None:
    async def scenario() -> None:
        async with OrchestratorRig(config=DispatcherConfig(base_backoff_ms=1)) as rig:
            peer = await rig.peer()
            rig.adapter.fail_execute.append(OutboxFullError("exec-0", call_id="t1/c0", depth=256))
            task = rig.submit({"adder": ADDER}, [Call("adder", {"x": 1})])
            [frame] = await peer.wait_frames(keys.MT_EXECUTE_CALL)
            assert frame_payload(frame)["attemptSeq"] == 2  # attempt 1 was never sent
            reply_completed(peer, frame, {"y": 2})
            converged = await task.done
            assert converged.success and converged.retry_count == 1
            assert rig.orchestrator.stats.send_failures == 1

    run(scenario())


def test_a_refused_bind_gives_the_attempt_back_and_binds_again(run) -> None:
    async def scenario() -> None:
        async with OrchestratorRig() as rig:
            peer = await rig.peer()
            rig.adapter.fail_bind.append(
                ExecutorCapacityError("exec-0", call_id="t1/c0", reserved=1, usable=1)
            )
            task = rig.submit(
                {"adder": ADDER}, [Call("adder", {"x": 1})], policy=TaskPolicy(max_attempts=1)
            )
            [frame] = await peer.wait_frames(keys.MT_EXECUTE_CALL)
            reply_completed(peer, frame, {"y": 2})
            converged = await task.done
            assert converged.success  # one attempt allowed, and the refused bind did not spend it
            assert rig.orchestrator.stats.bind_failures == 1

    run(scenario())


def test_a_lost_executors_calls_run_elsewhere_without_spending_an_attempt(run) -> None:
    async def scenario() -> None:
        async with OrchestratorRig(config=DispatcherConfig(base_backoff_ms=1)) as rig:
            first = await rig.peer("exec-0", availableContexts=1)
            task = rig.submit({"adder": ADDER}, [Call("adder", {"x": 1})])
            await first.wait_frames(keys.MT_EXECUTE_CALL)
            second = await rig.peer("exec-1")
            first.close()
            [frame] = await second.wait_frames(keys.MT_EXECUTE_CALL)
            assert frame_payload(frame)["attemptSeq"] == 2
            reply_completed(second, frame, {"y": 2})
            converged = await task.done
            # Nothing blames the call (it never started): its attempt was given back.
            assert converged.success and converged.retry_count == 0

    run(scenario())


def test_a_terminal_frame_for_an_attempt_never_sent_is_a_protocol_error(run) -> None:
    """The link drops the connection (docs/protocol.md); the call had sent nothing
    before, so it runs again elsewhere without spending an attempt."""

    async def scenario() -> None:
        async with OrchestratorRig() as rig:
            peer = await rig.peer()
            task = rig.submit({"adder": ADDER}, [Call("adder", {"x": 1})])
            [frame] = await peer.wait_frames(keys.MT_EXECUTE_CALL)
            frame.envelope[keys.F_PAYLOAD] = dict(frame_payload(frame), attemptSeq=7)
            reply_completed(peer, frame, {"y": 999})
            await rig.until(lambda: rig.core.stats.executor_losses == 1)
            assert not task.done.done()
            second = await rig.peer("exec-1")
            [again] = await second.wait_frames(keys.MT_EXECUTE_CALL)
            reply_completed(second, again, {"y": 2})
            converged = await task.done
            assert converged.outputs == (b'{"y":2}',) and converged.retry_count == 0

    run(scenario())


def test_a_task_output_limit_stops_the_task(run) -> None:
    async def scenario() -> None:
        async with OrchestratorRig() as rig:
            peer = await rig.peer()
            task = rig.submit(
                {"adder": ADDER},
                [Call("adder", {"x": i}) for i in range(3)],
                policy=TaskPolicy(max_output_bytes=20),
            )
            frames = await peer.wait_frames(keys.MT_EXECUTE_CALL, 3)
            reply_completed(peer, frames[0], {"y": "x" * 10})
            reply_completed(peer, frames[1], {"y": "x" * 10})
            converged = await task.done
            assert not converged.success and task.output_limit_hit
            await peer.wait_frames(keys.MT_CANCEL_CALL)

    run(scenario())


def test_a_full_executor_whose_cancelled_call_drains_is_not_bound_in_a_loop(run) -> None:
    """A cancelled call frees its slot in the core at once, but its context on the
    executor only with its terminal frame. Until then a full executor must not be
    picked again and again (each bind refused for capacity, each retry 1 ms later):
    the refusal catches the core's view up, and the terminal frame frees the context."""

    async def scenario() -> None:
        async with OrchestratorRig() as rig:
            peer = await rig.peer(availableContexts=1)
            first_task = rig.submit({"adder": ADDER}, [Call("adder", {"x": 1})])
            [first] = await peer.wait_frames(keys.MT_EXECUTE_CALL)
            rig.orchestrator.post(TaskCancelRequested(task_id=first_task.task_id, reason="user"))
            await peer.wait_frames(keys.MT_CANCEL_CALL)
            # The executor has not ended the cancelled attempt yet; a second task arrives.
            second_task = rig.submit({"adder": ADDER}, [Call("adder", {"x": 2})])
            await asyncio.sleep(0.3)
            assert rig.orchestrator.stats.bind_failures <= 1
            assert len(peer.of_type(keys.MT_EXECUTE_CALL)) == 1
            # The cancelled attempt ends: its context is free, the waiting call goes out.
            payload = frame_payload(first)
            peer.send(
                {
                    keys.F_MESSAGE_TYPE: keys.MT_CALL_FAILED,
                    keys.F_CALL_ID: first.envelope[keys.F_CALL_ID],
                    keys.F_PAYLOAD: {
                        keys.FP_TASK_ID: payload[keys.FP_TASK_ID],
                        keys.FP_ATTEMPT_SEQ: payload[keys.FP_ATTEMPT_SEQ],
                        keys.FP_ERROR_KIND: keys.ERR_CANCELLED,
                        keys.FP_ERROR_MESSAGE: "cancelled",
                        keys.FP_RETRYABLE: False,
                    },
                }
            )
            frames = await peer.wait_frames(keys.MT_EXECUTE_CALL, 2, timeout=2.0)
            assert frame_payload(frames[1])[keys.FP_TASK_ID] == second_task.task_id
            reply_completed(peer, frames[1], {"y": 3})
            converged = await second_task.done
            await second_task.decode_outputs()  # rows are decoded off the actor
            assert converged.success and second_task.rows == [{"y": 3}]

    run(scenario())


def test_a_one_shot_list_in_chunks_runs_as_one_phase_in_call_order(run) -> None:
    async def scenario() -> None:
        async with OrchestratorRig() as rig:
            peer = await rig.peer()
            calls = [Call("adder", {"x": i}) for i in range(3)]
            task = rig.submit({"adder": ADDER}, calls[:1], total_count=3)
            [first] = await peer.wait_frames(keys.MT_EXECUTE_CALL)
            reply_completed(peer, first, {"y": 1})
            await rig.until(lambda: rig.core.task_state("t1").terminal_roots == 1)  # type: ignore[union-attr]
            assert not task.done.done()  # the phase waits for its other chunks
            rig.post_chunk(task, calls[1:])
            frames = await peer.wait_frames(keys.MT_EXECUTE_CALL, count=3)
            assert [f.envelope[keys.F_CALL_ID] for f in frames] == ["t1/c0", "t1/c1", "t1/c2"]
            for frame, y in reversed(list(zip(frames[1:], (2, 3), strict=True))):
                reply_completed(peer, frame, {"y": y})
            converged = await task.done
            assert converged.success and converged.total_count == 3
            assert converged.outputs == (b'{"y":1}', b'{"y":2}', b'{"y":3}')

    run(scenario())


def test_a_refused_chunk_cancels_the_task_and_later_chunks_are_dropped(run) -> None:
    async def scenario() -> None:
        async with OrchestratorRig() as rig:
            await rig.peer()
            calls = [Call("adder", {"x": i}) for i in range(4)]
            task = rig.submit({"adder": ADDER}, calls[:1], total_count=2)
            rig.post_chunk(task, calls[1:3])  # two calls where one is left: refused
            converged = await task.done
            assert converged.failure is not None and converged.failure.kind == "CANCELLED"
            assert "call chunk refused" in converged.failure.message
            assert converged.total_count == 2 and converged.cancelled_count == 2
            errors = rig.orchestrator.stats.handler_errors
            rig.post_chunk(task, calls[3:])  # after convergence: dropped, nothing raised
            await asyncio.sleep(0.01)
            assert rig.orchestrator.stats.handler_errors == errors
            assert rig.orchestrator.live_task_ids == [] and rig.core.task_ids() == []

    run(scenario())
