"""Orchestrator: io and subcall waits, ResumeCall delivery, resume_send_failed.

A real adapter and core; the executor is a scripted peer. Both event loops.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from orchestrator_rig import OrchestratorRig, frame_payload, reply_completed, reply_waiting
from tests.helpers.compiled import skip_if_compiled

from blockx.wire import keys
from blockx.worker.actor.events import TaskCancelRequested
from blockx.worker.actor.orchestrator import Orchestrator
from blockx.worker.actor.task_run import TaskRun
from blockx.worker.api import Call, TaskPolicy
from blockx.worker.code import source_digest
from blockx.worker.core import CallState, DispatcherConfig, call_key
from blockx.worker.errors import OutboxFullError
from blockx.worker.io import IOHandler, IOResult
from blockx.worker.io.backend import PreparedRequest, Reply
from blockx.worker.io.read_answer import ReadAnswer
from blockx.worker.io.registry import BackendRegistry, IOSubsystem
from blockx.worker.io.scope import TaskIOScope

pytestmark = pytest.mark.timeout(30)

PARENT = "def _(p):\n    return function.call('child', p)\n"
CHILD = "def _(p):\n    return {'child': p}\n"


class Backend:
    """Records requests; answers each through a future the test resolves."""

    def __init__(self, immediate: bool = False) -> None:
        self.requests: list[tuple[str, str, dict[str, Any], bytes | None]] = []
        self.pending: list[asyncio.Future[IOResult]] = []
        self.immediate = immediate

    def handle_io(
        self, task_id: str, call_id: str, payload: dict[str, Any], sidecar: bytes | None
    ) -> Any:
        self.requests.append((task_id, call_id, payload, sidecar))
        if self.immediate:
            return IOResult(result={"n": len(self.requests)}, sidecar=b"raw", budget_used_ms=3)
        future: asyncio.Future[IOResult] = asyncio.get_running_loop().create_future()
        self.pending.append(future)
        return future


def _io(peer: Any, frame: Any, request_id: str) -> None:
    reply_waiting(
        peer,
        frame,
        request_id,
        waitKind="io",
        ioKind="read",
        backend="blockdb",
        operation="get_row",
        params={"k": 1},
    )


async def _waiting_on_io(
    rig: OrchestratorRig, backend: IOHandler, policy: TaskPolicy | None = None
) -> tuple[Any, TaskRun, Any]:
    """A peer, a one-call task of CHILD served by ``backend``, and that call's ExecuteCall,
    answered with a read (``req-1``): the peer, the task and the frame."""
    peer = await rig.peer()
    task = rig.submit({"child": CHILD}, [Call("child", 1)], io_handler=backend, policy=policy)
    [frame] = await peer.wait_frames(keys.MT_EXECUTE_CALL)
    _io(peer, frame, "req-1")
    return peer, task, frame


def test_io_wait_goes_to_the_tasks_handler_and_resumes_the_call(run) -> None:
    async def scenario() -> None:
        async with OrchestratorRig() as rig:
            backend = Backend()
            peer, task, frame = await _waiting_on_io(rig, backend)
            await rig.until(lambda: backend.pending)
            ctx = rig.core.call_context("t1/c0")
            assert ctx is not None and ctx.state is CallState.WAITING
            task_id, call_id, payload, _ = backend.requests[0]
            assert (task_id, call_id, payload["operation"]) == ("user-t1", "t1/c0", "get_row")
            backend.pending[0].set_result(IOResult(result={"row": 7}, budget_used_ms=12))
            [resume] = await peer.wait_frames(keys.MT_RESUME_CALL)
            assert resume.envelope[keys.F_REQUEST_ID] == "req-1"
            assert frame_payload(resume) == {
                "resumeKind": "io",
                "result": {"row": 7},
                "budgetUsedMs": 12,
            }
            await rig.until(lambda: ctx.state is CallState.RUNNING)  # flushed -> resumed
            assert ctx.wait_handle is None  # answered: nothing left to release
            reply_completed(peer, frame, {"ok": 1})
            assert (await task.done).success and task.io_calls == 1
            assert rig.orchestrator.stats.io_waits_released == 0

    run(scenario())


def test_an_immediate_io_answer_carries_its_sidecar(run) -> None:
    async def scenario() -> None:
        async with OrchestratorRig() as rig:
            peer, _task, _frame = await _waiting_on_io(rig, Backend(immediate=True))
            [resume] = await peer.wait_frames(keys.MT_RESUME_CALL)
            assert resume.sidecar == b"raw"
            assert frame_payload(resume)["result"] == {"n": 1}

    run(scenario())


def test_a_failing_io_handler_fails_the_wait_as_io_error(run) -> None:
    async def scenario() -> None:
        async with OrchestratorRig() as rig:
            backend = Backend()
            peer, _task, _frame = await _waiting_on_io(rig, backend)
            await rig.until(lambda: backend.pending)
            backend.pending[0].set_exception(ConnectionError("backend down"))
            [resume] = await peer.wait_frames(keys.MT_RESUME_CALL)
            error = frame_payload(resume)["error"]
            assert error["kind"] == "io_error" and "backend down" in error["message"]
            assert error["retryable"] is False

    run(scenario())


def test_a_resume_that_cannot_be_sent_fails_the_call_as_resume_send_failed(run) -> None:
    async def scenario() -> None:
        async with OrchestratorRig(config=DispatcherConfig(base_backoff_ms=1)) as rig:
            rig.adapter.fail_resume.append(OutboxFullError("exec-0", call_id="t1/c0", depth=256))
            peer, task, _frame = await _waiting_on_io(
                rig, Backend(immediate=True), TaskPolicy(max_attempts=1)
            )
            converged = await task.done
            [failed] = converged.failed_calls
            assert failed.error.kind == "resume_send_failed" and failed.error.retryable
            assert "attempt 1" in failed.error.message and failed.attempts == 1
            assert rig.orchestrator.stats.resume_send_failures == 1
            # The executor still holds the suspended attempt: it is cancelled there.
            [cancel] = await peer.wait_frames(keys.MT_CANCEL_CALL)
            assert cancel.envelope[keys.F_CALL_ID] == "t1/c0"
            assert frame_payload(cancel)[keys.FP_ATTEMPT_SEQ] == 1
            assert frame_payload(cancel)[keys.FP_REASON] == "resume_send_failed"

    run(scenario())


def test_a_resume_send_failure_is_retried_like_any_retryable_failure(run) -> None:
    async def scenario() -> None:
        async with OrchestratorRig(config=DispatcherConfig(base_backoff_ms=1)) as rig:
            peer = await rig.peer()
            rig.adapter.fail_resume.append(OutboxFullError("exec-0", call_id="t1/c0", depth=256))
            task = rig.submit(
                {"child": CHILD}, [Call("child", 1)], io_handler=Backend(immediate=True)
            )
            first = (await peer.wait_frames(keys.MT_EXECUTE_CALL))[0]
            _io(peer, first, "req-1")
            second = (await peer.wait_frames(keys.MT_EXECUTE_CALL, 2))[1]
            assert frame_payload(second)["attemptSeq"] == 2
            reply_completed(peer, second, {"ok": True})
            assert (await task.done).retry_count == 1

    run(scenario())


def test_the_io_request_of_a_call_that_failed_while_waiting_is_cancelled_quietly(
    run, caplog: pytest.LogCaptureFixture
) -> None:
    # The executor ends a call whose IO wait outlasted its budget while the worker still
    # waits for the backend: the call fails with that error, not retried (like any
    # deadline_exceeded); nobody waits for the answer any more, so the handler's future is
    # cancelled at once (IOHandler's contract) — no ResumeCall, no resume failure.
    async def scenario() -> None:
        async with OrchestratorRig(config=DispatcherConfig(base_backoff_ms=1)) as rig:
            backend = Backend()
            peer, task, _frame = await _waiting_on_io(
                rig, backend, TaskPolicy(call_budget_ms=300, max_attempts=3)
            )
            await rig.until(lambda: backend.pending)
            ctx = rig.core.call_context("t1/c0")
            assert ctx is not None and ctx.state is CallState.WAITING
            peer.failed("t1/c0", keys.ERR_DEADLINE_EXCEEDED)
            converged = await task.done
            [failed] = converged.failed_calls
            assert failed.error.kind == keys.ERR_DEADLINE_EXCEEDED
            assert failed.attempts == 1 and not failed.error.retryable
            assert backend.pending[0].cancelled()
            stats = rig.orchestrator.stats
            assert stats.io_waits_released == 1
            assert ctx.wait_handle is None
            await asyncio.sleep(0.02)  # its done callback runs: it knows nobody waits
            assert stats.stale_waits == 0
            assert stats.resume_send_failures == 0
            assert peer.of_type(keys.MT_RESUME_CALL) == []
            assert peer.of_type(keys.MT_CANCEL_CALL) == []  # nothing left to cancel
            assert len(peer.of_type(keys.MT_EXECUTE_CALL)) == 1  # not retried

    with caplog.at_level(logging.WARNING, logger="blockx"):
        run(scenario())
    noise = [  # a loaded machine's stalled loop is reported whatever runs: not the subject
        r
        for r in caplog.records
        if r.levelno >= logging.WARNING and "event loop stalled" not in r.getMessage()
    ]
    assert noise == [], [r.getMessage() for r in noise]


@pytest.mark.parametrize("how", ["executor_lost", "task_cancelled"])
def test_a_wait_left_unanswered_cancels_the_handlers_future(run, how: str) -> None:
    # Whatever ends the waiting attempt, the handler's future is cancelled at once:
    # nobody waits for it any more (IOHandler's contract).
    async def scenario() -> None:
        async with OrchestratorRig(config=DispatcherConfig(base_backoff_ms=1)) as rig:
            backend = Backend()
            peer, task, _frame = await _waiting_on_io(rig, backend, TaskPolicy(max_attempts=1))
            await rig.until(lambda: backend.pending)
            ctx = rig.core.call_context("t1/c0")
            assert ctx is not None and ctx.wait_handle is backend.pending[0]
            if how == "executor_lost":
                peer.close()
                # The call had started: a suspect, it waits for an executor of its own.
                await rig.until(lambda: backend.pending[0].cancelled())
                assert ctx.suspect and ctx.attempt_count == 0
            rig.orchestrator.post(TaskCancelRequested(task_id=task.task_id, reason="user"))
            converged = await task.done
            assert converged.failed_count + converged.cancelled_count == 1
            assert backend.pending[0].cancelled()
            assert rig.orchestrator.stats.io_waits_released == 1
            assert ctx.wait_handle is None
            await asyncio.sleep(0.02)  # the cancelled future's callback answers nobody
            assert not peer.of_type(keys.MT_RESUME_CALL)
            assert rig.orchestrator.stats.stale_waits == 0

    run(scenario())


class GateBackend:
    """An IOBackend (``blockdb``) for a real task scope: every read waits until released."""

    name = "blockdb"

    def __init__(self) -> None:
        self.open: list[asyncio.Future[Reply]] = []

    def prepare(self, io_kind: str, operation: str, params: Any, sidecar: Any) -> PreparedRequest:
        return PreparedRequest(operation, params, domain="t")

    def execute(self, request: PreparedRequest) -> asyncio.Future[Reply]:
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self.open.append(future)
        return future

    async def close(self) -> None:
        pass


def _scope(backend: GateBackend) -> TaskIOScope:
    registry = BackendRegistry()
    registry.register("blockdb", backend)
    return IOSubsystem(registry=registry).task_scope("user-t1")


def test_a_task_scopes_read_resumes_the_call(run) -> None:
    # The product's IO path: the task's TaskIOScope answers through a ReadAnswer, which
    # hands the answer to the worker as its flight ends (deliver_to).
    async def scenario() -> None:
        async with OrchestratorRig() as rig:
            backend = GateBackend()
            scope = _scope(backend)
            peer, task, frame = await _waiting_on_io(rig, scope)
            await rig.until(lambda: backend.open)
            ctx = rig.core.call_context("t1/c0")
            assert ctx is not None and type(ctx.wait_handle) is ReadAnswer
            backend.open[0].set_result(Reply({"row": 7}))
            [resume] = await peer.wait_frames(keys.MT_RESUME_CALL)
            payload = frame_payload(resume)
            assert resume.envelope[keys.F_REQUEST_ID] == "req-1"
            assert payload["result"] == {"row": 7} and payload["resumeKind"] == "io"
            assert type(payload["budgetUsedMs"]) is int
            await rig.until(lambda: ctx.state is CallState.RUNNING)
            assert ctx.wait_handle is None
            reply_completed(peer, frame, {"ok": 1})
            assert (await task.done).success and task.io_calls == 1
            assert scope.stats.operation("blockdb", "get_row").backend_calls == 1

    run(scenario())


def test_a_task_scopes_read_left_unanswered_is_abandoned_quietly(
    run, caplog: pytest.LogCaptureFixture
) -> None:
    # The call fails while its read runs: the worker cancels the ReadAnswer, the scope
    # stops the backend call (nobody else waits), and the callback the worker gave runs
    # once, answering nobody.
    async def scenario() -> None:
        async with OrchestratorRig(config=DispatcherConfig(base_backoff_ms=1)) as rig:
            backend = GateBackend()
            scope = _scope(backend)
            peer, task, _frame = await _waiting_on_io(rig, scope, TaskPolicy(max_attempts=1))
            await rig.until(lambda: backend.open)
            peer.failed("t1/c0", keys.ERR_DEADLINE_EXCEEDED)
            assert (await task.done).failed_count == 1
            assert backend.open[0].cancelled()
            stats = rig.orchestrator.stats
            assert stats.io_waits_released == 1
            await asyncio.sleep(0.02)  # the cancelled answer's callback: it answers nobody
            assert not rig.orchestrator.waits.released_waits
            assert stats.stale_waits == 0 and stats.resume_send_failures == 0
            assert peer.of_type(keys.MT_RESUME_CALL) == []
            assert scope.stats.operation("blockdb", "get_row").abandoned == 1

    with caplog.at_level(logging.WARNING, logger="blockx"):
        run(scenario())
    noise = [  # a loaded machine's stalled loop is reported whatever runs: not the subject
        r
        for r in caplog.records
        if r.levelno >= logging.WARNING and "event loop stalled" not in r.getMessage()
    ]
    assert noise == [], [r.getMessage() for r in noise]


class SharingBackend(Backend):
    """Breaks IOHandler's contract: every wait gets the same future."""

    def handle_io(
        self, task_id: str, call_id: str, payload: dict[str, Any], sidecar: bytes | None
    ) -> Any:
        self.requests.append((task_id, call_id, payload, sidecar))
        if not self.pending:
            self.pending.append(asyncio.get_running_loop().create_future())
        return self.pending[0]


def test_a_wait_sharing_a_released_future_gets_an_error_not_silence(run) -> None:
    # One call's wait is released (its attempt failed while it waited): the shared
    # future is cancelled. The released wait is answered by nobody; the other call still
    # waits, so it must get an answer -- an error -- or it would wait forever (no budget).
    async def scenario() -> None:
        async with OrchestratorRig(config=DispatcherConfig(base_backoff_ms=1)) as rig:
            backend = SharingBackend()
            peer = await rig.peer()
            task = rig.submit(
                {"child": CHILD},
                [Call("child", 1), Call("child", 2)],
                io_handler=backend,
                policy=TaskPolicy(max_attempts=1),
            )
            first, second = await peer.wait_frames(keys.MT_EXECUTE_CALL, 2)
            _io(peer, first, "req-1")
            _io(peer, second, "req-2")
            await rig.until(lambda: len(backend.requests) == 2)
            failing = first.envelope[keys.F_CALL_ID]
            waiting = second.envelope[keys.F_CALL_ID]
            peer.failed(failing, keys.ERR_DEADLINE_EXCEEDED)
            [resume] = await peer.wait_frames(keys.MT_RESUME_CALL)
            payload = frame_payload(resume)
            assert resume.envelope[keys.F_CALL_ID] == waiting
            assert "cancelled" in payload[keys.FP_ERROR][keys.FP_ERROR_MESSAGE_FIELD]
            peer.failed(waiting, keys.ERR_IO_ERROR)
            converged = await task.done
            assert converged.failed_count == 2
            assert rig.orchestrator.stats.io_waits_released == 1
            assert not rig.orchestrator.waits.released_waits  # the released wait's key is used up

    run(scenario())


async def _parent_asks_for_child(peer: Any) -> tuple[Any, Any]:
    """The parent's ExecuteCall arrives; it asks for ``child({"v": 2})`` (request
    ``req-1``, 4000 ms granted); returns the parent's and the child's ExecuteCall."""
    [parent] = await peer.wait_frames(keys.MT_EXECUTE_CALL)
    reply_waiting(
        peer,
        parent,
        "req-1",
        waitKind="subcall",
        functionId="child",
        args={"v": 2},
        ancestry=[],
        grantedBudgetMs=4000,
    )
    [_, child] = await peer.wait_frames(keys.MT_EXECUTE_CALL, 2)
    return parent, child


def test_a_subcall_runs_next_to_its_parent_and_resumes_it(run) -> None:
    async def scenario() -> None:
        async with OrchestratorRig() as rig:
            peer = await rig.peer()
            task = rig.submit(
                {"parent": PARENT, "child": CHILD},
                [Call("parent", {"v": 1})],
                policy=TaskPolicy(call_budget_ms=5000),
            )
            parent, child = await _parent_asks_for_child(peer)
            payload = frame_payload(child)
            digest = source_digest(CHILD)
            assert child.envelope[keys.F_CALL_ID].startswith("t1/c0/sub-")
            assert payload["parentCallId"] == "t1/c0"
            assert payload["functionCodeDigest"] == digest
            assert payload["ancestry"] == [frame_payload(parent)["callKey"]]
            assert payload["callKey"] == call_key("child", digest, b'{"v":2}')
            assert payload["callBudgetMs"] == 4000 and payload["attemptSeq"] == 1
            reply_completed(peer, child, {"child": {"v": 2}}, budget_used_ms=9)
            [resume] = await peer.wait_frames(keys.MT_RESUME_CALL)
            assert resume.envelope[keys.F_CALL_ID] == "t1/c0"
            assert resume.envelope[keys.F_REQUEST_ID] == "req-1"
            assert frame_payload(resume) == {
                "resumeKind": "subcall",
                "result": {"child": {"v": 2}},
                "budgetUsedMs": 9,
            }
            reply_completed(peer, parent, {"done": True})
            converged = await task.done
            assert converged.outputs == (b'{"done":true}',) and task.subcalls == 1

    run(scenario())


def test_a_subcall_of_an_unknown_function_resumes_the_parent_with_an_error(run) -> None:
    async def scenario() -> None:
        async with OrchestratorRig() as rig:
            peer = await rig.peer()
            rig.submit({"parent": PARENT}, [Call("parent", 1)])
            [parent] = await peer.wait_frames(keys.MT_EXECUTE_CALL)
            reply_waiting(
                peer,
                parent,
                "req-1",
                waitKind="subcall",
                functionId="nowhere",
                args=1,
                ancestry=[],
                grantedBudgetMs=0,
            )
            [resume] = await peer.wait_frames(keys.MT_RESUME_CALL)
            error = frame_payload(resume)["error"]
            assert error["kind"] == "user_error" and "not defined in this task" in error["message"]
            assert len(peer.of_type(keys.MT_EXECUTE_CALL)) == 1  # the child never ran

    run(scenario())


def test_a_subcall_request_from_a_replaced_attempt_is_dropped(run) -> None:
    async def scenario() -> None:
        async with OrchestratorRig() as rig:
            peer = await rig.peer()
            rig.submit({"parent": PARENT, "child": CHILD}, [Call("parent", 1)])
            [parent] = await peer.wait_frames(keys.MT_EXECUTE_CALL)
            frame_payload(parent)["attemptSeq"] = 5
            reply_waiting(
                peer,
                parent,
                "req-1",
                waitKind="subcall",
                functionId="child",
                args=1,
                ancestry=[],
                grantedBudgetMs=0,
            )
            await rig.until(lambda: rig.orchestrator.stats.stale_waits == 1)
            await asyncio.sleep(0.02)
            assert len(peer.of_type(keys.MT_EXECUTE_CALL)) == 1

    run(scenario())


def test_a_subcall_result_that_cannot_be_sent_fails_the_parent_as_resume_send_failed(
    run,
) -> None:
    async def scenario() -> None:
        async with OrchestratorRig() as rig:
            peer = await rig.peer()
            task = rig.submit(
                {"parent": PARENT, "child": CHILD},
                [Call("parent", {"v": 1})],
                policy=TaskPolicy(call_budget_ms=5000, max_attempts=1),
            )
            _parent, child = await _parent_asks_for_child(peer)
            rig.adapter.fail_resume.append(OutboxFullError("exec-0", call_id="t1/c0", depth=256))
            reply_completed(peer, child, {"child": {"v": 2}})
            converged = await task.done
            [failed] = converged.failed_calls
            assert failed.call_id == "t1/c0"
            assert failed.error.kind == "resume_send_failed" and failed.error.retryable
            assert "attempt 1" in failed.error.message
            [cancel] = await peer.wait_frames(keys.MT_CANCEL_CALL)  # the suspended parent
            assert cancel.envelope[keys.F_CALL_ID] == "t1/c0"

    run(scenario())


@skip_if_compiled(
    "blockx.worker.actor.orchestrator",
    "it keeps a DispatcherCore and refuses the recording proxy",
)
def test_the_snapshot_is_refreshed_before_a_lost_executors_calls_fail(run) -> None:
    # Seed: on executor loss, refresh the snapshot first, then fail its calls (retryable).
    async def scenario() -> None:
        rig = OrchestratorRig()
        order: list[str] = []
        core = rig.core

        class Recording:
            def __getattr__(self, name: str) -> Any:
                attr = getattr(core, name)
                if name not in ("handle_executor_snapshot_updated", "handle_executor_lost"):
                    return attr

                def recording(*args: Any) -> Any:
                    order.append(name)
                    return attr(*args)

                return recording

        # Built again around the recording core: each part holds the core it is given.
        rig.orchestrator = Orchestrator(Recording(), rig.adapter, rig.code_view)  # type: ignore[arg-type]
        async with rig:
            peer = await rig.peer()
            rig.submit({"child": CHILD}, [Call("child", 1)], policy=TaskPolicy(max_attempts=1))
            await peer.wait_frames(keys.MT_EXECUTE_CALL)
            order.clear()
            peer.close()
            await rig.until(lambda: "handle_executor_lost" in order)
            lost_at = order.index("handle_executor_lost")
            assert "handle_executor_snapshot_updated" in order[:lost_at]

    run(scenario())


def test_a_resume_queued_when_the_connection_dies_fails_the_call_as_transport_lost(run) -> None:
    """The ResumeCall was queued (writing paused) and never flushed: the executor is gone,
    so the call fails as its other calls do, ``transport_lost`` (retryable), not as a
    send failure of the worker's."""

    async def scenario() -> None:
        async with OrchestratorRig(config=DispatcherConfig(base_backoff_ms=1)) as rig:
            backend = Backend()
            peer, task, _frame = await _waiting_on_io(rig, backend, TaskPolicy(max_attempts=1))
            await rig.until(lambda: backend.pending)
            conn = rig.adapter.connection("exec-0")
            assert conn is not None
            conn.pause_writing()  # the kernel buffer is "full": the resume stays queued
            backend.pending[0].set_result(IOResult(result={"row": 7}))
            await rig.until(lambda: conn.outbox_size == 1)
            peer.close()
            converged = await task.done
            [failed] = converged.failed_calls
            assert failed.error.kind == "transport_lost" and failed.error.retryable
            assert "attempt 1" in failed.error.message
            assert rig.orchestrator.stats.resume_send_failures == 0
            assert not peer.of_type(keys.MT_RESUME_CALL)

    run(scenario())
