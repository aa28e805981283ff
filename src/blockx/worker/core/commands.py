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
``StopCallProduction``    tell the stream producer to stop committing batches
``BatchSettled``          hand the batch's outputs on; return one credit to the
                          stream producer
``ConvergeTaskCalls``     the task's call phase is over: hand its result to the
                          task (the core has forgotten the task)
========================  =====================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

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
    "ResumeParentCall",
    "StopCallProduction",
    "UnbindCall",
]

#: Why the core cancels a bound call.
CancelReason = Literal["parent_ended", "parent_retrying", "task_cancelled"]


@dataclass(frozen=True, slots=True, kw_only=True)
class BindCall:
    """Reserve a context for ``call_id`` on ``executor_id``, synchronously."""

    call_id: str
    task_id: str
    executor_id: str
    attempt_seq: int
    #: Set for a sub-call: bind it next to its parent (``BindSubcall``).
    parent_call_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class UnbindCall:
    """Release the reservation of a call that ended normally."""

    call_id: str
    task_id: str
    executor_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class CancelCallCmd:
    """Cancel a bound call's attempt: drain its reservation, send ``CancelCall``."""

    call_id: str
    task_id: str
    executor_id: str
    attempt_seq: int
    reason: CancelReason


@dataclass(frozen=True, slots=True, kw_only=True)
class DispatchCallCmd:
    """Send ``ExecuteCall`` for a bound attempt.

    ``call`` holds the per-call values shared by every attempt (function,
    digest, args, call key); they are also readable as attributes.
    """

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


@dataclass(frozen=True, slots=True, kw_only=True)
class ArmCallRetry:
    """Call ``handle_retry_ready(call_id)`` at ``due_at_ms``."""

    call_id: str
    task_id: str
    due_at_ms: int
    delay_ms: int
    #: Attempts spent so far (the next attempt is ``attempt_count + 1``).
    attempt_count: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CompleteCallFromCache:
    """A call completed without running: from the call cache or a leader."""

    call_id: str
    task_id: str
    source: CompletionSource
    #: The output (success) or ...
    output_json: bytes | None
    #: ... the error (a singleflight leader's final failure).
    error: CallError | None
    #: Set for a sub-call; a ``ResumeParentCall`` follows.
    parent_call_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ResumeParentCall:
    """Answer a parent's pending sub-call request with ``ResumeCall``.

    Emitted once per accepted or refused ``SubcallRequest`` whose parent is
    still live: with the child's output, its error, or the refusal
    (``call_id`` is ``None`` then: no child was created).
    """

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
    | StopCallProduction
    | BatchSettled
    | ConvergeTaskCalls
)
