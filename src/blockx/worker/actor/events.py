"""Events: the facts the dispatch actor applies to the dispatcher core (seed: ``dispatchEvent``).

Theory of operation
-------------------
Everything that happens outside the actor — an executor's frame, a timer, a
task starting or being cancelled, the 500 ms tick — becomes one event, posted
to the actor's queue (:meth:`Orchestrator.post
<blockx.worker.actor.orchestrator.Orchestrator.post>`). The actor applies
queued events in order, one ``apply_*`` method per event type, and is the only
code that calls the core.

Events are immutable, past-tense facts. Two shapes, for one measured reason:

* **Per-call events** (one or more per call: an attempt ended, a call
  suspended, a control frame flushed, an IO wait failed to resume) and the
  batches of them (every call frame of one read, :class:`CallFramesReceived`;
  every control frame of one flush, :class:`ControlsDelivered`) are
  ``NamedTuple`` classes. A frozen keyword-only dataclass costs 1.9 µs to build
  against 0.65 µs for a NamedTuple (Python 3.11, measured with ``timeit``);
  at a few events per call and 8–15 µs of worker CPU per trivial call compiled
  (docs/operations.md, "Compiled modules"), that difference is a tenth of the
  throughput.
* **Everything else** (executors attaching and being lost, timers, tasks) is
  a frozen, slotted, keyword-only dataclass, as BlockX writes events.

:data:`ActorEvent` is the union of all of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from blockx.worker.core import PreparedCallBatch, PreparedCallPhase
from blockx.worker.errors import AdapterError
from blockx.worker.link.callbacks import CallFrame
from blockx.worker.link.connection import ControlSend
from blockx.worker.link.loss import ExecutorLoss

if TYPE_CHECKING:
    from blockx.worker.actor.task_run import TaskRun

__all__ = [
    "ActorEvent",
    "AttemptCompleted",
    "AttemptFailed",
    "CallChunkPrepared",
    "CallFramesReceived",
    "CallSuspended",
    "ControlDelivered",
    "ControlUndelivered",
    "ControlsDelivered",
    "ExecutorAttached",
    "ExecutorLost",
    "ResumeNotQueued",
    "RetryDue",
    "StreamBatchProduced",
    "StreamFinished",
    "StreamOpened",
    "TaskCancelRequested",
    "TaskSubmitted",
    "TickElapsed",
]


# --- per-call events (NamedTuple: see the module docstring) --------------------------------


class AttemptCompleted(NamedTuple):
    """An executor sent ``CallCompleted`` (its reservation is already released)."""

    executor_id: str
    call_id: str
    payload: dict[str, Any]


class AttemptFailed(NamedTuple):
    """An executor sent ``CallFailed``."""

    executor_id: str
    call_id: str
    payload: dict[str, Any]


class CallSuspended(NamedTuple):
    """An executor sent ``CallWaiting`` with ``waitKind`` ``io`` or ``subcall``."""

    executor_id: str
    call_id: str
    request_id: str
    payload: dict[str, Any]
    sidecar: bytes | None


class CallFramesReceived(NamedTuple):
    """One read of an executor connection: its ``CallCompleted``, ``CallFailed`` and
    ``CallWaiting`` (io / subcall) frames, in order (the adapter's ``on_call_frames``).

    Applying it is applying :class:`AttemptCompleted`, :class:`AttemptFailed` and
    :class:`CallSuspended` for each frame in turn; runs of completions and of
    waits go to the core as one batch each.
    """

    executor_id: str
    frames: list[CallFrame]


class ControlsDelivered(NamedTuple):
    """One flush handed these ``ResumeCall`` / ``CancelCall`` frames to the transport
    (the adapter's ``on_controls_sent``): :data:`ControlDelivered` for each, in order."""

    notes: list[ControlSend]


#: A ``ResumeCall`` / ``CancelCall`` was handed to the transport. The adapter's flush
#: note is posted as it is (``note.token`` is the attempt the frame belongs to): it is
#: already an immutable record of exactly this fact, one per resumed wait.
ControlDelivered = ControlSend


class ControlUndelivered(NamedTuple):
    """The connection ended before a queued ``ResumeCall`` / ``CancelCall`` went out."""

    note: ControlSend
    reason: str


class ResumeNotQueued(NamedTuple):
    """A ``ResumeCall`` answering an IO wait could not even be queued."""

    call_id: str
    attempt_seq: int
    error: AdapterError | Exception
    #: Where the waiting attempt runs (its context is cancelled there, best effort).
    executor_id: str | None = None


# --- everything else (frozen dataclasses) -------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutorAttached:
    """An executor's first valid heartbeat attached its connection (a new era)."""

    executor_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutorLost:
    """An executor's connection era ended; its calls are lost (the adapter already took
    their reservations)."""

    executor_id: str
    reason: str
    lost_calls: int
    #: What the link knows of why (None: an adapter that does not say).
    loss: ExecutorLoss | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryDue:
    """An ``ArmCallRetry`` timer fired."""

    call_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class TickElapsed:
    """The 500 ms tick: snapshot sync, wedge check, heartbeat timeouts."""

    #: How late the tick fired, in ms (a stalled event loop delays it).
    late_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskSubmitted:
    """A one-shot task's calls (or the first chunk of a long list) were prepared (off
    the actor) and await commit."""

    run: TaskRun
    prepared: PreparedCallPhase


@dataclass(frozen=True, slots=True, kw_only=True)
class CallChunkPrepared:
    """The next chunk of a one-shot task's calls was prepared and awaits commit."""

    run: TaskRun
    prepared: PreparedCallBatch


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamOpened:
    """A streamed task started producing batches."""

    run: TaskRun


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamBatchProduced:
    """The producer prepared one batch (it holds a credit for it)."""

    run: TaskRun
    prepared: PreparedCallBatch


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamFinished:
    """The producer committed its last batch."""

    run: TaskRun


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskCancelRequested:
    """The task's caller cancelled it (or the worker is shutting down)."""

    task_id: str
    reason: str


ActorEvent = (
    AttemptCompleted
    | AttemptFailed
    | CallSuspended
    | CallFramesReceived
    | ControlDelivered
    | ControlsDelivered
    | ControlUndelivered
    | ResumeNotQueued
    | ExecutorAttached
    | ExecutorLost
    | RetryDue
    | TickElapsed
    | TaskSubmitted
    | CallChunkPrepared
    | StreamOpened
    | StreamBatchProduced
    | StreamFinished
    | TaskCancelRequested
)
