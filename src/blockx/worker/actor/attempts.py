"""Attempt outcomes: the executors' terminal frames applied to the core, in batches.

:class:`AttemptEnds` is a part of the
:class:`~blockx.worker.actor.orchestrator.Orchestrator` (the dispatch actor),
built by it with the core, the live tasks table, the counters, the
:class:`~blockx.worker.actor.waits.Waits` part (a read's ``CallWaiting`` frames
are handed to it), the :class:`~blockx.worker.actor.snapshot_sync.SnapshotSync`
(an executor with draining reservations is synced again first), and the
orchestrator's ``run`` and ``fail_attempt``. It owns no state of its own. The
orchestrator calls its ``apply_*`` methods for :class:`CallFramesReceived`,
:class:`AttemptCompleted`, :class:`AttemptFailed` and :class:`RetryDue`; it runs
on the actor only.

One read of an executor's connection arrives as one :class:`CallFramesReceived`
event: its ``CallCompleted`` / ``CallWaiting`` / ``CallFailed`` frames in frame
order. Runs of completions go to the core as one ``handle_calls_completed``,
runs of waits as one ``handle_calls_waiting`` (:mod:`.waits`);
a failure is applied on its own, between them, so the core sees every frame
in order -- batching only saves per-event overhead. A completion's output is
re-encoded right-sized (kept-alive ``orjson.dumps`` results fragment the heap;
see :mod:`blockx.worker.json_values`). Completions of a task with an output
limit or with debug output take the one-at-a-time path, which counts the
task's output bytes and stops the task when they pass its limit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from blockx.wire import keys
from blockx.worker.actor.events import AttemptCompleted, AttemptFailed, CallFramesReceived, RetryDue
from blockx.worker.core import CallError, CompletedCall, DispatchCommand, DispatcherCore
from blockx.worker.json_values import encode_output, encode_output_fast
from blockx.worker.link.callbacks import CallFrame
from blockx.worker.link.completed_frames import CompletedPayload

if TYPE_CHECKING:
    from blockx.observability.tracing import CallTracer
    from blockx.worker.actor.runs import TaskRuns
    from blockx.worker.actor.snapshot_sync import SnapshotSync
    from blockx.worker.actor.stats import OrchestratorStats
    from blockx.worker.actor.waits import Waits

__all__ = ["AttemptEnds"]

_log = logging.getLogger("blockx.worker.orchestrator")

_FP_ATTEMPT_SEQ: Final = keys.FP_ATTEMPT_SEQ
_FP_OUTPUT: Final = keys.FP_OUTPUT
_FP_BUDGET_USED_MS: Final = keys.FP_BUDGET_USED_MS
_FP_TASK_ID: Final = keys.FP_TASK_ID
_FP_DEBUG_OUTPUT: Final = keys.FP_DEBUG_OUTPUT
_FP_LOCAL_READ_HITS: Final = keys.FP_LOCAL_READ_HITS
_FP_EXECUTE_SPAN: Final = keys.FP_EXECUTE_SPAN
_MT_CALL_COMPLETED: Final = keys.MT_CALL_COMPLETED
_MT_CALL_WAITING: Final = keys.MT_CALL_WAITING
_encode_output: Final = encode_output_fast


class AttemptEnds:
    """Attempt ends (see the module docstring); a part of the
    :class:`~blockx.worker.actor.orchestrator.Orchestrator`, which builds it.

    ``run`` executes the commands the core answers with and ``fail_attempt(call_id,
    attempt_seq, error, budget_used_ms)`` fails an attempt at the actor run's time:
    the orchestrator's bound methods.
    """

    def __init__(
        self,
        core: DispatcherCore,
        runs: TaskRuns,
        stats: OrchestratorStats,
        waits: Waits,
        snapshots: SnapshotSync,
        *,
        run: Callable[[list[DispatchCommand]], None],
        fail_attempt: Callable[[str, int, CallError, int], None],
    ) -> None:
        self._core = core
        self._runs = runs
        self._stats = stats
        self._waits = waits
        self._snapshots = snapshots
        self._run = run
        self._fail_attempt = fail_attempt
        #: The span recorder (None: tracing off; set by ``Orchestrator.set_tracer``).
        self.tracer: CallTracer | None = None

    def __repr__(self) -> str:
        return f"AttemptEnds({self._runs!r})"

    def apply_call_frames(self, event: CallFramesReceived) -> None:
        """One read's call frames, in order: runs of completions go to the core as one
        ``handle_calls_completed``, runs of waits as one ``handle_calls_waiting``.

        Each frame is applied as its own event would be (an error is logged and
        the rest still applied); only the core calls are batched.
        """
        executor_id = event.executor_id
        self._snapshots.resync_if_drained(executor_id)  # a cancelled call's context may be free
        completions: list[CompletedCall] = []
        waits: list[CallFrame] = []
        for frame in event.frames:
            message_type = frame[0]
            try:
                if message_type == _MT_CALL_COMPLETED:
                    if waits:
                        self._waits.apply_waits(executor_id, waits)
                        waits = []
                    payload = frame[2]
                    if isinstance(payload, CompletedPayload):  # typed: the output stays JSON
                        if payload.localReadHits is not None:
                            self._note_local_hits(payload.taskId, payload.localReadHits)
                        if self._runs.output_limited or payload.debugOutput is not None:
                            if completions:
                                self._complete_calls(completions)
                                completions = []
                            self._complete_one(
                                AttemptCompleted(executor_id, frame[1], payload.to_wire()),
                                bytes(payload.output),  # a right-sized copy
                            )
                            continue
                        completions.append(
                            (
                                frame[1],
                                payload.attemptSeq,
                                bytes(payload.output),  # a right-sized copy
                                payload.budgetUsedMs,
                            )
                        )
                        continue
                    attempt = payload.get(_FP_ATTEMPT_SEQ)
                    budget = payload.get(_FP_BUDGET_USED_MS, 0)
                    hits = payload.get(_FP_LOCAL_READ_HITS)
                    if hits is not None:
                        self._note_local_hits(payload.get(_FP_TASK_ID), hits)
                    tracer = self.tracer  # a traced attempt's frame takes this path
                    if tracer is not None:
                        tracer.call_ended(
                            frame[1],
                            attempt if type(attempt) is int else -1,
                            "succeeded",
                            None,
                            payload.get(_FP_EXECUTE_SPAN),
                        )
                    try:  # right-sized, big ints exact: see json_values
                        output_json = _encode_output(payload.get(_FP_OUTPUT))
                    except (TypeError, ValueError, OverflowError):
                        output_json = encode_output(payload.get(_FP_OUTPUT))
                    if self._runs.output_limited or payload.get(_FP_DEBUG_OUTPUT) is not None:
                        if completions:
                            self._complete_calls(completions)
                            completions = []
                        self._complete_one(
                            AttemptCompleted(executor_id, frame[1], payload), output_json
                        )
                        continue
                    completions.append(
                        (
                            frame[1],
                            attempt if type(attempt) is int else -1,
                            output_json,
                            budget if type(budget) is int else 0,
                        )
                    )
                elif message_type == _MT_CALL_WAITING:
                    if completions:
                        self._complete_calls(completions)
                        completions = []
                    waits.append(frame)
                else:  # CallFailed
                    if completions:
                        self._complete_calls(completions)
                        completions = []
                    if waits:
                        self._waits.apply_waits(executor_id, waits)
                        waits = []
                    self.apply_attempt_failed(AttemptFailed(executor_id, frame[1], frame[2]))
            except Exception:
                self._stats.handler_errors += 1
                _log.exception("dispatch actor: applying %s for %s failed", message_type, frame[1])
        try:
            if completions:
                self._complete_calls(completions)
            if waits:
                self._waits.apply_waits(executor_id, waits)
        except Exception:
            self._stats.handler_errors += 1
            _log.exception("dispatch actor: applying call frames of %s failed", executor_id)

    def _complete_calls(self, completions: list[CompletedCall]) -> None:
        tracer = self.tracer
        if tracer is not None:
            tracer.calls_completed(completions)
        self._run(self._core.handle_calls_completed(completions))

    def _note_local_hits(self, task_id: Any, hits: Any) -> None:
        """Reads the executor answered from its own cache during an attempt (CallCompleted
        or CallFailed ``localReadHits``): counted in the task's IO statistics when its IO
        handler keeps them (a ``TaskIOScope``: ``note_local_hits``)."""
        run = self._runs.by_id.get(task_id) if type(task_id) is str else None
        if run is None:
            return
        note = getattr(run.io_handler, "note_local_hits", None)
        if note is not None:
            note(hits)

    def apply_attempt_completed(self, event: AttemptCompleted) -> None:
        payload = event.payload
        hits = payload.get(_FP_LOCAL_READ_HITS)
        if hits is not None:
            self._note_local_hits(payload.get(_FP_TASK_ID), hits)
        output_json = encode_output(payload.get(_FP_OUTPUT))
        self._complete_one(event, output_json)

    def _complete_one(self, event: AttemptCompleted, output_json: bytes) -> None:
        payload = event.payload
        attempt = payload.get(_FP_ATTEMPT_SEQ)
        budget = payload.get(_FP_BUDGET_USED_MS, 0)
        tracer = self.tracer
        if tracer is not None:
            tracer.call_ended(
                event.call_id,
                attempt if type(attempt) is int else -1,
                "succeeded",
                None,
                payload.get(_FP_EXECUTE_SPAN),
            )
        if self._runs.output_limited or payload.get(_FP_DEBUG_OUTPUT) is not None:
            if self._note_completion(event, output_json):
                return
        self._run(
            self._core.handle_call_completed(
                event.call_id,
                attempt if type(attempt) is int else -1,
                output_json,
                budget_used_ms=budget if type(budget) is int else 0,
            )
        )

    def _note_completion(self, event: AttemptCompleted, output_json: bytes) -> bool:
        """Debug output and per-task output limits; True if the task was just stopped."""
        payload = event.payload
        run = self._runs.by_id.get(payload.get(_FP_TASK_ID))  # type: ignore[arg-type]
        if run is None:
            return False
        debug_output = payload.get(_FP_DEBUG_OUTPUT)
        if isinstance(debug_output, str) and debug_output:
            run.note_debug_output(event.call_id, debug_output)
        limit = run.max_output_bytes
        if limit is None or "/sub-" in event.call_id:
            return False
        run.output_bytes += len(output_json)
        if run.output_bytes <= limit or run.output_limit_hit:
            return False
        run.output_limit_hit = True
        _log.warning(
            "task %s: outputs passed max_output_bytes=%d; stopping it", run.user_task_id, limit
        )
        self._run(
            self._core.handle_task_cancelled(
                run.task_id, f"outputs exceed max_output_bytes={limit}"
            )
        )
        return True

    def apply_attempt_failed(self, event: AttemptFailed) -> None:
        payload = event.payload
        hits = payload.get(_FP_LOCAL_READ_HITS)
        if hits is not None:
            self._note_local_hits(payload.get(_FP_TASK_ID), hits)
        attempt = payload.get(_FP_ATTEMPT_SEQ)
        budget = payload.get(_FP_BUDGET_USED_MS, 0)
        kind = payload.get(keys.FP_ERROR_KIND)
        message = payload.get(keys.FP_ERROR_MESSAGE)
        stack = payload.get(keys.FP_ERROR_STACK)
        debug_output = payload.get(_FP_DEBUG_OUTPUT)
        if isinstance(debug_output, str) and debug_output:  # policy.debug: the failure report's
            run = self._runs.by_id.get(payload.get(_FP_TASK_ID))  # type: ignore[arg-type]
            if run is not None:
                run.note_debug_output(event.call_id, debug_output)
        error = CallError(
            kind=kind if isinstance(kind, str) and kind else keys.ERR_INTERNAL_ERROR,
            message=message if isinstance(message, str) else "",
            retryable=payload.get(keys.FP_RETRYABLE) is True,
            stack=stack if isinstance(stack, str) else None,
        )
        tracer = self.tracer
        if tracer is not None:  # first: with the executor's execute span, if it sent one
            tracer.call_ended(
                event.call_id,
                attempt if type(attempt) is int else -1,
                "failed",
                error.kind,
                payload.get(_FP_EXECUTE_SPAN),
            )
        self._fail_attempt(
            event.call_id,
            attempt if type(attempt) is int else -1,
            error,
            budget if type(budget) is int else 0,
        )

    def apply_retry_due(self, event: RetryDue) -> None:
        self._run(self._core.handle_retry_ready(event.call_id))
