"""A test rig for the orchestrator: real adapter, real core, scripted executor peers.

:class:`OrchestratorRig` wires an :class:`ExecutorAdapter` (optionally a
subclass that fails on demand), a :class:`DispatcherCore` and an
:class:`Orchestrator` on the test's loop; :meth:`OrchestratorRig.peer`
attaches an :class:`~executor_peer.ExecutorPeer` that plays an executor frame
by frame; :meth:`OrchestratorRig.submit` registers a one-shot task the way
``Worker.submit`` does (``total_count``: only the first chunk of a longer list,
the rest following with :meth:`OrchestratorRig.post_chunk`).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping, Sequence
from typing import Any

from executor_peer import ExecutorPeer

from blockx.wire import keys
from blockx.worker.actor.events import CallChunkPrepared, TaskSubmitted
from blockx.worker.actor.orchestrator import Orchestrator
from blockx.worker.actor.task_run import TaskRun
from blockx.worker.api import Call, TaskPolicy
from blockx.worker.code import FunctionCodeView, build_task_code_view
from blockx.worker.core import CallSpec, DispatcherConfig, DispatcherCore, TaskMode
from blockx.worker.io import IOHandler, no_io_handler
from blockx.worker.json_values import encode_args
from blockx.worker.link.adapter import ExecutorAdapter

__all__ = ["FlakyAdapter", "OrchestratorRig", "frame_payload", "reply_completed", "reply_waiting"]


class FlakyAdapter(ExecutorAdapter):
    """An adapter whose bind / sends raise the given errors, once each, when armed."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fail_bind: list[Exception] = []
        self.fail_execute: list[Exception] = []
        self.fail_resume: list[Exception] = []

    def bind(self, call_id: str, executor_id: str) -> None:
        if self.fail_bind:
            raise self.fail_bind.pop(0)
        super().bind(call_id, executor_id)

    def send_execute_call(self, executor_id: str, call_id: str, payload: Any, **kw: Any) -> None:
        if self.fail_execute:
            raise self.fail_execute.pop(0)
        super().send_execute_call(executor_id, call_id, payload, **kw)

    def send_execute_call_encoded(
        self, executor_id: str, call_id: str, attempt_seq: int, body: bytes
    ) -> None:
        if self.fail_execute:
            raise self.fail_execute.pop(0)
        super().send_execute_call_encoded(executor_id, call_id, attempt_seq, body)

    def send_resume_call(self, *args: Any, **kwargs: Any) -> None:
        if self.fail_resume:
            raise self.fail_resume.pop(0)
        super().send_resume_call(*args, **kwargs)


def frame_payload(frame: Any) -> dict[str, Any]:
    return frame.envelope[keys.F_PAYLOAD]  # type: ignore[no-any-return]


class OrchestratorRig:
    def __init__(
        self,
        *,
        config: DispatcherConfig | None = None,
        tick_interval_ms: int = 500,
        heartbeat_timeout_ms: int = 10_000,
        clock_ms: Any = None,
    ) -> None:
        self.adapter = FlakyAdapter(
            heartbeat_timeout_ms=heartbeat_timeout_ms, heartbeat_check_interval_ms=None
        )
        self.core = DispatcherCore(config or DispatcherConfig(), rng=random.Random(7))
        self.code_view = FunctionCodeView()
        kwargs: dict[str, Any] = {"tick_interval_ms": tick_interval_ms}
        if clock_ms is not None:
            kwargs["clock_ms"] = clock_ms
        self.orchestrator = Orchestrator(self.core, self.adapter, self.code_view, **kwargs)
        self.peers: list[ExecutorPeer] = []
        self._seq = 0

    async def __aenter__(self) -> OrchestratorRig:
        await self.adapter.start()
        self.adapter.set_callbacks(self.orchestrator.callbacks())
        self.adapter.set_function_code_resolver(self.orchestrator.resolve_code)
        self.orchestrator.start()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        for peer in self.peers:
            peer.close()
        self.orchestrator.close()
        await self.adapter.close()

    async def peer(self, executor_id: str = "exec-0", **heartbeat: Any) -> ExecutorPeer:
        peer = await ExecutorPeer.connect(self.adapter.socket_path)
        peer.heartbeat(executor_id, **heartbeat)
        self.peers.append(peer)
        await self.until(lambda: self.adapter.is_attached(executor_id))
        await self.until(lambda: self.core.executor_state(executor_id) is not None)
        return peer

    def submit(
        self,
        functions: Mapping[str, str],
        calls: Sequence[Call],
        *,
        policy: TaskPolicy | None = None,
        io_handler: IOHandler = no_io_handler,
        total_count: int | None = None,
    ) -> TaskRun:
        policy = policy or TaskPolicy()
        self._seq += 1
        task_id = f"t{self._seq}"
        code = build_task_code_view(functions)
        specs = [CallSpec(function_id=c.function_id, args_json=encode_args(c.args)) for c in calls]
        prepared = self.core.prepare_call_phase_with_digests(
            task_id, specs, code.digests(), policy=policy.core_policy(), total_count=total_count
        )
        run = TaskRun(
            task_id=task_id,
            user_task_id=f"user-{task_id}",
            code=code,
            io_handler=io_handler,
            policy=policy.core_policy(),
            instance=None,
            mode=TaskMode.ONE_SHOT,
            calls=list(calls),
            debug=policy.debug,
            max_output_bytes=policy.max_output_bytes,
            collect=True,
            window=2,
            started_at=asyncio.get_running_loop().time(),
        )
        self.orchestrator.post(TaskSubmitted(run=run, prepared=prepared))
        return run

    def post_chunk(self, run: TaskRun, calls: Sequence[Call]) -> None:
        """Post the next chunk of a one-shot list submitted with ``total_count``."""
        specs = [CallSpec(function_id=c.function_id, args_json=encode_args(c.args)) for c in calls]
        prepared = self.core.prepare_call_batch_with_digests(run.task_id, specs, run.code.digests())
        assert run.calls is not None
        run.calls.extend(calls)
        self.orchestrator.post(CallChunkPrepared(run=run, prepared=prepared))

    @staticmethod
    async def until(predicate: Any, timeout: float = 5.0) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not predicate():
            if loop.time() > deadline:
                raise TimeoutError("condition not met")
            await asyncio.sleep(0.002)


def reply_completed(
    peer: ExecutorPeer, frame: Any, output: Any, *, budget_used_ms: int = 1
) -> None:
    """Answer an ExecuteCall frame with CallCompleted (echoing its task and attempt)."""
    payload = frame_payload(frame)
    peer.send(
        {
            keys.F_MESSAGE_TYPE: keys.MT_CALL_COMPLETED,
            keys.F_CALL_ID: frame.envelope[keys.F_CALL_ID],
            keys.F_PAYLOAD: {
                keys.FP_TASK_ID: payload[keys.FP_TASK_ID],
                keys.FP_ATTEMPT_SEQ: payload[keys.FP_ATTEMPT_SEQ],
                keys.FP_OUTPUT: output,
                keys.FP_BUDGET_USED_MS: budget_used_ms,
            },
        }
    )


def reply_waiting(peer: ExecutorPeer, frame: Any, request_id: str, **fields: Any) -> None:
    """Suspend the call of an ExecuteCall frame with CallWaiting."""
    payload = frame_payload(frame)
    peer.send(
        {
            keys.F_MESSAGE_TYPE: keys.MT_CALL_WAITING,
            keys.F_CALL_ID: frame.envelope[keys.F_CALL_ID],
            keys.F_REQUEST_ID: request_id,
            keys.F_PAYLOAD: {
                keys.FP_TASK_ID: payload[keys.FP_TASK_ID],
                keys.FP_ATTEMPT_SEQ: payload[keys.FP_ATTEMPT_SEQ],
                **fields,
            },
        }
    )
