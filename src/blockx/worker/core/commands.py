"""Commands: the orders the dispatcher core gives the worker runtime.

Theory of operation
-------------------
Every entry point of :class:`~blockx.worker.core.dispatcher.DispatcherCore`
returns a ``list[DispatchCommand]``; the runtime (the dispatch actor) executes
them in list order. A command is imperative and complete: it carries every
value its executor needs, so the runtime never reads core state to act on one.
The core has already applied the state change a command describes -- e.g. a
call named by ``CancelCallCmd`` is ``DONE`` in the core when the command is
returned -- so executing a command late or failing to execute it never puts the
core in an undefined state; failures come back as events
(``handle_bind_failed``, ``handle_attempt_failure``).

How the runtime executes each command:

========================  =====================================================
``BindCall``              synchronously reserve a context (``Adapter.Bind``, or
                          ``BindSubcall`` when ``parent_call_id`` is set), then
                          call ``handle_executor_bound`` or ``handle_bind_failed``
``DispatchCallCmd``       build and send ``ExecuteCall`` (off the actor)
``UnbindCall``            release the reservation (idempotent with the release
                          on the executor's terminal frame)
``CancelCallCmd``         mark the reservation draining, best-effort
                          ``CancelCall``; the executor's terminal frame frees it
``ArmCallRetry``          arm a timer; at ``due_at_ms`` call ``handle_retry_ready``
``ResumeParentCall``      send ``ResumeCall`` to the parent's executor; once
                          flushed call ``handle_call_resumed`` (on a send
                          failure: ``handle_attempt_failure`` for the parent with
                          ``resume_send_failed``)
``CompleteCallFromCache`` nothing is required (metrics, traces): the core has
                          recorded the result; for a sub-call a
                          ``ResumeParentCall`` follows
``ReleaseWait``           nobody waits for the answer of the call's IO wait any
                          more (its attempt failed, was cancelled, its executor
                          was lost): release ``handle``, the call's
                          ``wait_handle`` (cancel the IO handler's future)
``StopCallProduction``    tell the stream producer to stop committing batches
``BatchSettled``          hand the batch's outputs on; return one credit to the
                          stream producer
``ConvergeTaskCalls``     the task's call phase is over: hand its result to the
                          task (the core has forgotten the task)
========================  =====================================================

Two shapes, for one measured reason (see :mod:`.records`): the commands issued
per call (``BindCall``, ``DispatchCallCmd``, ``UnbindCall``, ``CancelCallCmd``,
``ArmCallRetry``, ``CompleteCallFromCache``, ``ResumeParentCall``,
``ReleaseWait``) are slotted
:class:`~.records.Record` classes -- immutable by convention, built
positionally on the core's hot paths (~0.2 µs each instead of 0.75-1.8 µs as
frozen keyword-only dataclasses); the per-task ones (``StopCallProduction``,
``BatchSettled``, ``ConvergeTaskCalls``) stay frozen dataclasses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .records import Record
from .types import CallError, CompletionSource, FailedCall, PreparedCall, TaskFailure, TaskMode

__all__ = [
    "ArmCallRetry",
    "BatchSettled",
    "BindCall",
    "CancelCallCmd",
    "CancelReason",
    "CompleteCallFromCache",
    "ConvergeTaskCalls",
    "DispatchCallCmd",
    "DispatchCommand",
    "ReleaseWait",
    "ResumeParentCall",
    "StopCallProduction",
    "UnbindCall",
]

#: Why the core cancels a bound call.
CancelReason = Literal["parent_ended", "parent_retrying", "task_cancelled"]


class BindCall(Record):
    """Reserve a context for ``call_id`` on ``executor_id``, synchronously."""

    __slots__ = ("attempt_seq", "call_id", "executor_id", "parent_call_id", "task_id")
    _fields = ("call_id", "task_id", "executor_id", "attempt_seq", "parent_call_id")
    call_id: str
    task_id: str
    executor_id: str
    attempt_seq: int
    #: Set for a sub-call: bind it next to its parent (``BindSubcall``).
    parent_call_id: str | None

    def __init__(
        self,
        call_id: str,
        task_id: str,
        executor_id: str,
        attempt_seq: int,
        parent_call_id: str | None = None,
    ) -> None:
        self.call_id = call_id
        self.task_id = task_id
        self.executor_id = executor_id
        self.attempt_seq = attempt_seq
        self.parent_call_id = parent_call_id


class UnbindCall(Record):
    """Release the reservation of a call that ended normally."""

    __slots__ = ("call_id", "executor_id", "task_id")
    _fields = ("call_id", "task_id", "executor_id")
    call_id: str
    task_id: str
    executor_id: str

    def __init__(self, call_id: str, task_id: str, executor_id: str) -> None:
        self.call_id = call_id
        self.task_id = task_id
        self.executor_id = executor_id


class CancelCallCmd(Record):
    """Cancel a bound call's attempt: drain its reservation, send ``CancelCall``."""

    __slots__ = ("attempt_seq", "call_id", "executor_id", "reason", "task_id")
    _fields = ("call_id", "task_id", "executor_id", "attempt_seq", "reason")
    call_id: str
    task_id: str
    executor_id: str
    attempt_seq: int
    reason: CancelReason

    def __init__(
        self,
        call_id: str,
        task_id: str,
        executor_id: str,
        attempt_seq: int,
        reason: CancelReason,
    ) -> None:
        self.call_id = call_id
        self.task_id = task_id
        self.executor_id = executor_id
        self.attempt_seq = attempt_seq
        self.reason = reason


class DispatchCallCmd(Record):
    """Send ``ExecuteCall`` for a bound attempt.

    ``call`` holds the per-call values shared by every attempt (function,
    digest, args, call key); they are also readable as attributes.
    """

    __slots__ = (
        "ancestry",
        "attempt_seq",
        "batch_idx",
        "budget_ms",
        "call",
        "call_id",
        "executor_id",
        "parent_call_id",
        "task_id",
    )
    _fields = (
        "call_id",
        "task_id",
        "executor_id",
        "call",
        "parent_call_id",
        "ancestry",
        "budget_ms",
        "attempt_seq",
        "batch_idx",
    )
    call_id: str
    task_id: str
    executor_id: str
    call: PreparedCall
    parent_call_id: str | None
    #: Call keys from the root down to the parent; empty for a root call.
    ancestry: tuple[str, ...]
    #: Execution budget of this attempt (0 = unlimited).
    budget_ms: int
    #: 1-based, increases with every bind of the call.
    attempt_seq: int
    batch_idx: int

    def __init__(
        self,
        call_id: str,
        task_id: str,
        executor_id: str,
        call: PreparedCall,
        parent_call_id: str | None,
        ancestry: tuple[str, ...],
        budget_ms: int,
        attempt_seq: int,
        batch_idx: int,
    ) -> None:
        self.call_id = call_id
        self.task_id = task_id
        self.executor_id = executor_id
        self.call = call
        self.parent_call_id = parent_call_id
        self.ancestry = ancestry
        self.budget_ms = budget_ms
        self.attempt_seq = attempt_seq
        self.batch_idx = batch_idx

    @property
    def function_id(self) -> str:
        return self.call.function_id

    @property
    def function_code_digest(self) -> str:
        return self.call.function_code_digest

    @property
    def args_json(self) -> bytes:
        return self.call.args_json

    @property
    def call_key(self) -> str:
        return self.call.call_key


class ArmCallRetry(Record):
    """Call ``handle_retry_ready(call_id)`` at ``due_at_ms``."""

    __slots__ = ("attempt_count", "call_id", "delay_ms", "due_at_ms", "task_id")
    _fields = ("call_id", "task_id", "due_at_ms", "delay_ms", "attempt_count")
    call_id: str
    task_id: str
    due_at_ms: int
    delay_ms: int
    #: Attempts spent so far (the next attempt is ``attempt_count + 1``).
    attempt_count: int

    def __init__(
        self, call_id: str, task_id: str, due_at_ms: int, delay_ms: int, attempt_count: int
    ) -> None:
        self.call_id = call_id
        self.task_id = task_id
        self.due_at_ms = due_at_ms
        self.delay_ms = delay_ms
        self.attempt_count = attempt_count


class CompleteCallFromCache(Record):
    """A call completed without running: from the call cache or a leader."""

    __slots__ = ("call_id", "error", "output_json", "parent_call_id", "source", "task_id")
    _fields = ("call_id", "task_id", "source", "output_json", "error", "parent_call_id")
    call_id: str
    task_id: str
    source: CompletionSource
    #: The output (success) or ...
    output_json: bytes | None
    #: ... the error (a singleflight leader's final failure).
    error: CallError | None
    #: Set for a sub-call; a ``ResumeParentCall`` follows.
    parent_call_id: str | None

    def __init__(
        self,
        call_id: str,
        task_id: str,
        source: CompletionSource,
        output_json: bytes | None,
        error: CallError | None,
        parent_call_id: str | None = None,
    ) -> None:
        self.call_id = call_id
        self.task_id = task_id
        self.source = source
        self.output_json = output_json
        self.error = error
        self.parent_call_id = parent_call_id


class ResumeParentCall(Record):
    """Answer a parent's pending sub-call request with ``ResumeCall``.

    Emitted once per accepted or refused ``SubcallRequest`` whose parent is
    still live: with the child's output, its error, or the refusal
    (``call_id`` is ``None`` then: no child was created).
    """

    __slots__ = (
        "budget_used_ms",
        "call_id",
        "error",
        "executor_id",
        "output_json",
        "parent_call_id",
        "request_id",
        "task_id",
    )
    _fields = (
        "task_id",
        "parent_call_id",
        "executor_id",
        "request_id",
        "call_id",
        "output_json",
        "error",
        "budget_used_ms",
    )
    task_id: str
    parent_call_id: str
    #: The parent's executor (where the child ran).
    executor_id: str
    request_id: str
    call_id: str | None
    output_json: bytes | None
    error: CallError | None
    #: Time the child spent, charged to the parent's budget.
    budget_used_ms: int

    def __init__(
        self,
        task_id: str,
        parent_call_id: str,
        executor_id: str,
        request_id: str,
        call_id: str | None,
        output_json: bytes | None,
        error: CallError | None,
        budget_used_ms: int,
    ) -> None:
        self.task_id = task_id
        self.parent_call_id = parent_call_id
        self.executor_id = executor_id
        self.request_id = request_id
        self.call_id = call_id
        self.output_json = output_json
        self.error = error
        self.budget_used_ms = budget_used_ms


class ReleaseWait(Record):
    """Nobody waits for the answer of ``call_id``'s IO wait any more: release ``handle``.

    Emitted when an attempt that is WAITING with a ``wait_handle`` leaves the wait
    other than by its answer (it failed -- a cut-off at its budget included --, was
    cancelled, or its executor was lost). ``handle`` is what the runtime put in the
    call's ``wait_handle``; the core has cleared the slot.
    """

    __slots__ = ("call_id", "handle", "task_id")
    _fields = ("call_id", "task_id", "handle")
    call_id: str
    task_id: str
    handle: object

    def __init__(self, call_id: str, task_id: str, handle: object) -> None:
        self.call_id = call_id
        self.task_id = task_id
        self.handle = handle


@dataclass(frozen=True, slots=True, kw_only=True)
class StopCallProduction:
    """Tell a stream's producer to stop: the task stopped dispatching."""

    task_id: str
    failure: TaskFailure


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchSettled:
    """Every root call of a stream batch is ``DONE``; one credit comes back.

    Batches settle in ``batch_idx`` order; ``outputs`` are the successful
    calls' outputs in call order (empty once the task dropped its outputs).
    """

    task_id: str
    batch_idx: int
    outputs: tuple[bytes, ...]
    failed_calls: tuple[FailedCall, ...]
    call_count: int
    succeeded_count: int
    cancelled_count: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ConvergeTaskCalls:
    """The task's call phase is over; emitted exactly once per phase."""

    task_id: str
    mode: TaskMode
    success: bool
    failure: TaskFailure | None
    #: One-shot: the successful root calls' outputs in call order. Stream:
    #: empty (every batch's outputs went out with its ``BatchSettled``).
    #: Empty when the task dropped its outputs (``OUTPUT_BYTES_EXCEEDED``).
    outputs: tuple[bytes, ...]
    #: One-shot: every failed root call. Stream: empty (see ``BatchSettled``).
    failed_calls: tuple[FailedCall, ...]
    total_count: int
    succeeded_count: int
    failed_count: int
    cancelled_count: int
    retry_count: int
    cache_hit_count: int
    singleflight_hit_count: int


DispatchCommand = (
    BindCall
    | UnbindCall
    | CancelCallCmd
    | DispatchCallCmd
    | ArmCallRetry
    | CompleteCallFromCache
    | ResumeParentCall
    | ReleaseWait
    | StopCallProduction
    | BatchSettled
    | ConvergeTaskCalls
)
