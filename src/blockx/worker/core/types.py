"""Value types of the dispatcher core: states, inputs and result records.

Theory of operation
-------------------
Everything here is an immutable value or an ``Enum`` (the per-call ones,
:class:`CallSpec` and :class:`PreparedCall`, are slotted records, immutable by
convention: see :mod:`.records`); the mutable per-call and
per-task records live in :mod:`.state`. The runtime builds the inputs
(:class:`CallSpec`, :class:`ExecutorSnapshot`, :class:`SubcallRequest`,
:class:`CallError`; the task's :class:`~.config.CallRetryPolicy` lives in
:mod:`.config`) and reads the records the core
hands back inside commands (:class:`FailedCall`, :class:`TaskFailure`).

Call arguments and outputs travel as encoded JSON ``bytes``. The core never
parses them: it hashes argument bytes into a call key (so the runtime should
encode them canonically, e.g. ``orjson`` with sorted keys, for the call cache
and singleflight to find equal calls) and counts output bytes for output
retention.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final, Literal, Protocol

from .records import Record

__all__ = [
    "ERR_CANCELLED",
    "ERR_EXECUTOR_CRASHED",
    "ERR_EXECUTOR_WEDGED",
    "ERR_MEMORY_EXCEEDED",
    "ERR_PROTOCOL_ERROR",
    "ERR_RESUME_SEND_FAILED",
    "ERR_SUBCALL_CYCLE_DETECTED",
    "ERR_SUBCALL_DEPTH_EXCEEDED",
    "ERR_TRANSPORT_LOST",
    "LOSS_CAUSES_BLAMING",
    "LOSS_SHUTDOWN",
    "CallError",
    "CallOutcome",
    "CallSpec",
    "CallState",
    "CompletionSource",
    "ExecutorLossReport",
    "ExecutorSnapshot",
    "FailedCall",
    "FailurePolicy",
    "JitterSource",
    "PreparedCall",
    "SubcallRequest",
    "TaskFailure",
    "TaskFailureKind",
    "TaskMode",
]

# Error kinds the core itself produces. Same strings as ``blockx.wire.keys``
# (a test holds them equal); the core does not import the wire package.
ERR_TRANSPORT_LOST: Final = "transport_lost"
ERR_CANCELLED: Final = "cancelled"
ERR_RESUME_SEND_FAILED: Final = "resume_send_failed"
ERR_SUBCALL_DEPTH_EXCEEDED: Final = "subcall_depth_exceeded"
ERR_SUBCALL_CYCLE_DETECTED: Final = "subcall_cycle_detected"
# The causes of an executor loss that name a guilty call (docs/security.md, "Blame").
ERR_EXECUTOR_CRASHED: Final = "executor_crashed"
ERR_EXECUTOR_WEDGED: Final = "executor_wedged"
ERR_MEMORY_EXCEEDED: Final = "memory_exceeded"
ERR_PROTOCOL_ERROR: Final = "protocol_error"
#: The cause of a loss the worker caused on purpose: nobody is blamed.
LOSS_SHUTDOWN: Final = "shutdown"
#: Loss causes that make suspects of the calls that ran (all but ``shutdown``).
LOSS_CAUSES_BLAMING: Final = frozenset(
    {
        ERR_TRANSPORT_LOST,
        ERR_EXECUTOR_CRASHED,
        ERR_EXECUTOR_WEDGED,
        ERR_MEMORY_EXCEEDED,
        ERR_PROTOCOL_ERROR,
    }
)


class CallState(enum.Enum):
    """The four states of a call context (the seed's ``CallReady`` ...).

    ``READY`` covers queued, backing off before a retry, parked (a sub-call
    waiting for its parent's executor) and waiting on a singleflight leader.
    ``DONE`` is the only terminal state.
    """

    READY = "READY"
    RUNNING = "RUNNING"
    WAITING = "WAITING"
    DONE = "DONE"

    # Members are singletons compared by identity; the C-level identity hash
    # keeps the state-table lookup in ``state.move`` off Enum's Python __hash__.
    __hash__ = object.__hash__


class CallOutcome(enum.Enum):
    """How a ``DONE`` call ended."""

    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


class FailurePolicy(enum.Enum):
    """What a root call's final failure does to its task."""

    #: Stop dispatching, let in-flight calls finish, cancel the rest, and
    #: converge the task as failed (``CALL_FAILED``).
    FAST_FAIL = "fast_fail"
    #: Record the failure and carry on; the task converges successfully with
    #: the outputs of the calls that succeeded and the failures listed.
    CONTINUE = "continue"


class TaskMode(enum.Enum):
    """How a task's calls were registered."""

    ONE_SHOT = "one_shot"
    STREAM = "stream"


#: Where a call completed without running.
CompletionSource = Literal["cache", "singleflight"]

#: Why a task converged unsuccessfully.
TaskFailureKind = Literal["CALL_FAILED", "OUTPUT_BYTES_EXCEEDED", "CANCELLED"]


class JitterSource(Protocol):
    """What the core needs of a random source: ``random.Random`` fits."""

    def random(self) -> float:
        """A float in [0.0, 1.0)."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class CallError:
    """Why an attempt failed, as the executor (or the core) reports it."""

    kind: str
    message: str
    retryable: bool
    stack: str | None = None


class CallSpec(Record):
    """One call of a task, as the call builder produces it (a :class:`~.records.Record`:
    one is built per call)."""

    __slots__ = ("args_json", "function_id")
    _fields = ("function_id", "args_json")
    function_id: str
    #: The argument value, JSON-encoded. A JSON array is spread as positional
    #: arguments by the executor; anything else is one argument.
    args_json: bytes

    def __init__(self, function_id: str, args_json: bytes) -> None:
        self.function_id = function_id
        self.args_json = args_json


class PreparedCall(Record):
    """A call with its code digest resolved and its call key computed.

    Built by the ``prepare_*`` entry points (off the actor); shared, unchanged,
    by every attempt of the call and by the ``DispatchCallCmd`` that runs it.
    A :class:`~.records.Record`: one is built per call.
    """

    __slots__ = ("args_json", "call_key", "function_code_digest", "function_id")
    _fields = ("function_id", "function_code_digest", "args_json", "call_key")
    function_id: str
    function_code_digest: str
    args_json: bytes
    #: Stable hash of (function_id, digest, args_json); see :mod:`.keys`.
    call_key: str

    def __init__(
        self, function_id: str, function_code_digest: str, args_json: bytes, call_key: str
    ) -> None:
        self.function_id = function_id
        self.function_code_digest = function_code_digest
        self.args_json = args_json
        self.call_key = call_key


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutorSnapshot:
    """The adapter's view of one executor's capacity (from its heartbeats)."""

    executor_id: str
    #: Contexts the executor offers to worker-dispatched calls in total
    #: (its max inflight; ``1 << 30`` when unlimited). The core subtracts the
    #: calls it has bound there itself to get the headroom.
    usable_contexts: int
    healthy: bool = True
    #: Runnable calls at the last heartbeat.
    runnable_count: int = 0
    #: Calls in flight at the last heartbeat (informational).
    inflight_count: int = 0
    #: Increases with every heartbeat; a new value resets the completion
    #: compensation of ``runnable_count``.
    heartbeat_seq: int = 0
    #: The call the executor's scheduler is running, if any.
    running_call_id: str | None = None
    #: Executor wall clock (ms) when its scheduler loop last made progress
    #: (informational: the wedge judgement uses ``running_for_ms``).
    last_scheduler_active_at_ms: int = 0
    memory_bytes: int = 0
    #: How long ``running_call_id`` had been running without yielding at the
    #: heartbeat (``Heartbeat.runningForMs``; 0 without a running call).
    running_for_ms: int = 0
    #: The budget the running call was granted (``Heartbeat.runningCallBudgetMs``;
    #: 0 = unlimited: the wedge backstop never judges it).
    running_call_budget_ms: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutorLossReport:
    """What the runtime knows of why an executor's calls were lost (the core's view
    of the adapter's ``ExecutorLoss``; see :mod:`.blame` for the rules it feeds).

    ``cause`` is ``transport_lost``, ``executor_crashed``, ``memory_exceeded``,
    ``executor_wedged``, ``protocol_error`` or ``shutdown``; a guilty call fails
    with it as its error kind and ``message`` in its error.
    """

    cause: str = ERR_TRANSPORT_LOST
    #: For people: "exited with status 1", "killed by SIGSEGV", ...
    message: str = ""
    #: The call that held the executor's thread when it died; None: none or unknown.
    running_call_id: str | None = None
    #: Whether ``running_call_id`` is certain (None and known: no call was running).
    running_call_known: bool = False
    #: Calls that had run user code on the executor; None: unknown (every bound call).
    started_call_ids: frozenset[str] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SubcallRequest:
    """A running call asked for a sub-call (``CallWaiting(waitKind=subcall)``)."""

    parent_call_id: str
    #: The attempt of the parent that asked (``CallWaiting.attemptSeq``).
    parent_attempt_seq: int
    #: The executor the request came from; must be the parent's.
    executor_id: str
    #: The pending ``requestId`` to answer with ``ResumeCall``; opaque to the core.
    request_id: str
    function_id: str
    function_code_digest: str
    args_json: bytes
    #: Budget carved out of the parent's remaining budget (0 = unlimited).
    granted_budget_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class FailedCall:
    """A root call that ended ``FAILED``: what the runtime reports for it."""

    call_id: str
    #: Position of the call in its task's call list (or stream).
    index: int
    error: CallError
    attempts: int


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskFailure:
    """Why a task's call phase failed."""

    kind: TaskFailureKind
    message: str
    #: The root call whose failure stopped the task (``CALL_FAILED``).
    call_id: str | None = None
    error: CallError | None = None
