"""The wire schema: every message of docs/protocol.md as a ``msgspec.Struct``, defined once.

Theory of operation
-------------------
Each message is two Structs: its payload (``ExecuteCallPayload``, ...) and its
envelope (``ExecuteCall``, ...), a tagged Struct whose tag is the
``messageType`` (written first when encoded, checked when decoded). Member
names are docs/protocol.md's keys exactly as written (``callBudgetMs``, not
``call_budget_ms``): a Struct's attribute is the key on the wire, with no
renaming table between them, and ``tests/wire/test_schema.py`` checks every
one against :mod:`blockx.wire.keys` (still the one place key strings are
spelled for code that builds dicts) and docs/protocol.md. A member's type,
default and required-ness are written here and nowhere else: the typed decoders,
the slow paths' validation (:func:`blockx.wire.messages.validate`) and the
executor's defaults for an ``ExecuteCall`` key left out
(``blockx/executor/context.py``) all read them from these classes.

Required-ness follows the receivers. ``attemptSeq`` is required in
``CallCompleted`` and ``CallFailed`` (the worker refuses a terminal frame
without one: ``blockx/worker/link/handlers.py``, ``call_frame_error``) and
defaults to 1 in ``ExecuteCall`` and ``CallWaiting``, where the receivers have
always accepted it left out. ``taskId`` may be left out of ``CallCompleted`` and
``CallFailed`` (the worker does not need it there; the executor always writes
it). docs/protocol.md, "Required payload keys", says the same.

Who uses them:

* the executor's reader decodes ``ExecuteCall`` and result ``ResumeCall`` bodies
  straight into these Structs (``blockx/executor/execute_frames.py``: the hook
  and its range checks);
* the worker's connection decodes ``CallCompleted`` (the output kept as the
  executor's JSON bytes, a ``msgspec.Raw``) and ``CallWaiting`` (the payload
  kept as the dict the wait's handlers take) the same way
  (``blockx/worker/link/completed_frames.py``);
* the worker validates each ``Heartbeat`` into :class:`HeartbeatPayload` and keeps
  it as the executor's latest report (``blockx/worker/link/state.py``);
* the worker's pre-encoded ``ExecuteCall`` (``blockx/worker/actor/execute.py``)
  takes its literal bytes from encoding :class:`ExecuteCall`, so its frames are
  byte for byte ``msgspec.json.encode(ExecuteCall(...))``
  (tests/worker/runtime/test_orchestrator_execute.py);
* tests and ``bench/wire_codec.py`` build and decode messages with them.

Member order is the order bytes are written in. ``ExecuteCallPayload`` puts
the six members that are constant for every call of one function of one task
first (the worker encodes them once per function), then the six that vary per
call. Payloads write every member, as the senders always have.

What a receiver never reads is not declared where it would be decoded, because
every member declared costs every decode even when nobody reads it (callgrind:
decoding a ``CallCompleted`` into a Struct in a Python loop is ~6,100
instructions a frame; declaring the four optional envelope members adds ~540,
the two timings ~350):

* the optional envelope members of docs/protocol.md's "Envelope" table
  (``requestId`` where it is optional, ``executorId``, ``sentAtMs``, ``trace``)
  are not members of these Structs: msgspec skips them as unknown members, as
  the protocol says receivers do with keys they do not know. Senders that write
  them (the executor's ``executorId``) spell them with :mod:`blockx.wire.keys`;
* ``CallCompleted``'s timings, which the worker does not read, are declared on a
  subclass, :class:`TimedCallCompletedPayload`: each member is still declared
  once, and the worker decodes into the base.

:mod:`blockx.wire.messages` defines no message: it validates a received payload
dict into these Structs (:func:`~blockx.wire.messages.validate`, errors naming the
key), adds the checks a type cannot express (what each ``waitKind`` needs), and
assembles envelopes.

This module is not compiled by mypyc: mypyc drops the ``tag=`` class arguments
msgspec reads.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from . import keys
from .values import loads_wire

__all__ = [
    "ENVELOPES",
    "MISSING_OUTPUT",
    "PAYLOADS",
    "CallCompleted",
    "CallCompletedPayload",
    "CallFailed",
    "CallFailedPayload",
    "CallWaiting",
    "CallWaitingPayload",
    "CancelCall",
    "CancelCallPayload",
    "Envelope",
    "ExecuteCall",
    "ExecuteCallPayload",
    "Heartbeat",
    "HeartbeatAck",
    "HeartbeatAckPayload",
    "HeartbeatPayload",
    "ResumeCall",
    "ResumeCallPayload",
    "TimedCallCompletedPayload",
]

_TAG: Final = keys.F_MESSAGE_TYPE

#: ``CallCompletedPayload.output`` when a frame has none: msgspec keeps the default
#: object itself, so a frame without an output is told apart by identity.
MISSING_OUTPUT: Final = msgspec.Raw(b"null")


# --- worker → executor ----------------------------------------------------------------


class ExecuteCallPayload(msgspec.Struct, kw_only=True):
    """Run one attempt of a call; the source is not sent, only its digest."""

    # Constant for every call of one function of one task (encoded once per function).
    taskId: str
    functionId: str
    functionCodeDigest: str
    entrySelector: str = ""
    audit: dict[str, Any] | None = None
    debug: bool = False
    # Per call.
    args: Any = None
    callKey: str = ""
    parentCallId: str | None = None
    ancestry: list[str] = []
    callBudgetMs: int = 0
    attemptSeq: int = 1


class ExecuteCall(msgspec.Struct, tag=keys.MT_EXECUTE_CALL, tag_field=_TAG):
    """An ``ExecuteCall`` envelope."""

    callId: str
    payload: ExecuteCallPayload


class ResumeCallPayload(msgspec.Struct, kw_only=True):
    """The answer to a ``CallWaiting``: a ``result`` or an ``error``
    (``{"kind": str, "message": str, "retryable": bool}``)."""

    resumeKind: str
    result: Any = None
    error: dict[str, Any] | None = None
    budgetUsedMs: int = 0
    #: (addition) the answer never changes: the executor may keep it for identical reads.
    immutable: bool = False


class ResumeCall(msgspec.Struct, tag=keys.MT_RESUME_CALL, tag_field=_TAG):
    """A ``ResumeCall`` envelope (``requestId`` = the pending one)."""

    callId: str
    requestId: str
    payload: ResumeCallPayload


class CancelCallPayload(msgspec.Struct, kw_only=True):
    """Best-effort cancellation of one attempt."""

    reason: str = keys.DEFAULT_CANCEL_REASON
    attemptSeq: int = 0


class CancelCall(msgspec.Struct, tag=keys.MT_CANCEL_CALL, tag_field=_TAG):
    """A ``CancelCall`` envelope."""

    callId: str
    payload: CancelCallPayload


class HeartbeatAckPayload(msgspec.Struct):
    """Empty in v1; v1.1 adds ``features``: the worker's answer to the executor's
    (``["batch"]``: it sends batched frames, and takes them; docs/protocol.md "Batched frames")."""

    features: list[str] = []


class HeartbeatAck(msgspec.Struct, tag=keys.MT_HEARTBEAT_ACK, tag_field=_TAG):
    """A ``HeartbeatAck`` envelope; losing it is harmless."""

    payload: HeartbeatAckPayload


# --- executor → worker ----------------------------------------------------------------


class CallWaitingPayload(msgspec.Struct, kw_only=True):
    """A call suspended on IO, a sub-call or a code fetch; which members are set
    depends on ``waitKind`` (docs/protocol.md)."""

    taskId: str
    waitKind: str
    attemptSeq: int = 1
    # io
    ioKind: str | None = None
    backend: str | None = None
    operation: str | None = None
    params: Any = None
    cacheKey: str | None = None
    # subcall (functionId also names the function to fetch for function_code)
    functionId: str | None = None
    args: Any = None
    ancestry: list[str] = []
    grantedBudgetMs: int = 0
    # function_code
    functionCodeDigest: str | None = None


class CallWaiting(msgspec.Struct, tag=keys.MT_CALL_WAITING, tag_field=_TAG):
    """A ``CallWaiting`` envelope without a sidecar.

    Its payload stays the dict the wait's handlers take (its members are
    :class:`CallWaitingPayload`'s): the worker judges them per ``waitKind`` and an
    IO handler reads the dict as the frame's payload object. Decoding the envelope
    into this Struct instead of a dict costs ~30% less per wait (1.0 vs 1.4 µs for an
    IO wait's frame).
    """

    callId: str
    requestId: str
    payload: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """The envelope as the generic path decodes it (unknown members were dropped)."""
        return {
            keys.F_MESSAGE_TYPE: keys.MT_CALL_WAITING,
            keys.F_CALL_ID: self.callId,
            keys.F_REQUEST_ID: self.requestId,
            keys.F_PAYLOAD: self.payload,
        }


class CallCompletedPayload(msgspec.Struct, kw_only=True):
    """The attempt returned. ``output`` is its JSON value, kept as the sender's bytes.

    The members the worker reads; the executor's timings, which it does not, are
    :class:`TimedCallCompletedPayload`'s (see the module docstring).
    """

    taskId: str | None = None
    attemptSeq: int
    output: msgspec.Raw = MISSING_OUTPUT
    budgetUsedMs: int = 0
    debugOutput: str | None = None
    #: (addition) ``{backend: {operation: count}}`` of reads answered inside the executor.
    localReadHits: dict[str, dict[str, int]] | None = None

    def to_wire(self) -> dict[str, Any]:
        """The members the worker reads, as the generic path decodes them (output decoded)."""
        wire = {
            keys.FP_TASK_ID: self.taskId,
            keys.FP_ATTEMPT_SEQ: self.attemptSeq,
            keys.FP_OUTPUT: loads_wire(self.output),
            keys.FP_BUDGET_USED_MS: self.budgetUsedMs,
            keys.FP_DEBUG_OUTPUT: self.debugOutput,
        }
        if self.localReadHits is not None:
            wire[keys.FP_LOCAL_READ_HITS] = self.localReadHits
        return wire


class TimedCallCompletedPayload(CallCompletedPayload, kw_only=True):
    """A whole ``CallCompleted`` payload, as the executor writes it: with its timings."""

    effectiveExecutionDurationUs: int = 0
    queueWaitUs: int = 0


class CallCompleted(msgspec.Struct, tag=keys.MT_CALL_COMPLETED, tag_field=_TAG):
    """A ``CallCompleted`` envelope (its payload may be a :class:`TimedCallCompletedPayload`:
    encoded with its timings, decoded without)."""

    callId: str
    payload: CallCompletedPayload


class CallFailedPayload(msgspec.Struct, kw_only=True):
    """The attempt ended without an output. ``debugOutput`` only for a debug call."""

    taskId: str | None = None
    attemptSeq: int
    errorKind: str
    retryable: bool = False
    errorMessage: str = ""
    errorStack: str | None = None
    localVars: dict[str, Any] | None = None
    budgetUsedMs: int = 0
    debugOutput: str | None = None
    localReadHits: dict[str, dict[str, int]] | None = None


class CallFailed(msgspec.Struct, tag=keys.MT_CALL_FAILED, tag_field=_TAG):
    """A ``CallFailed`` envelope."""

    callId: str
    payload: CallFailedPayload


class HeartbeatPayload(msgspec.Struct, kw_only=True):
    """The executor's periodic report; the first valid one attaches a connection."""

    executorId: str
    heartbeatSeq: int
    runnableCount: int = 0
    inflightCount: int = 0
    availableContexts: int = 0
    memoryBytes: int = 0
    executorCpuUtilization: float = 0.0
    executorCpuSecondsTotal: float = 0.0
    executorProcessInstanceId: str = ""
    lastSchedulerActiveAtMs: int = 0
    runningCallId: str | None = None
    runningForMs: int = 0
    runningCallBudgetMs: int = 0
    callStateCounts: dict[str, int] = {}
    sentAtMs: int = 0
    features: list[str] = []


class Heartbeat(msgspec.Struct, tag=keys.MT_HEARTBEAT, tag_field=_TAG):
    """A ``Heartbeat`` envelope."""

    payload: HeartbeatPayload


#: Any envelope of the schema.
Envelope = (
    ExecuteCall
    | ResumeCall
    | CancelCall
    | HeartbeatAck
    | CallWaiting
    | CallCompleted
    | CallFailed
    | Heartbeat
)

#: ``messageType`` → its envelope Struct.
ENVELOPES: Final[dict[str, type[Any]]] = {
    keys.MT_EXECUTE_CALL: ExecuteCall,
    keys.MT_RESUME_CALL: ResumeCall,
    keys.MT_CANCEL_CALL: CancelCall,
    keys.MT_HEARTBEAT_ACK: HeartbeatAck,
    keys.MT_CALL_WAITING: CallWaiting,
    keys.MT_CALL_COMPLETED: CallCompleted,
    keys.MT_CALL_FAILED: CallFailed,
    keys.MT_HEARTBEAT: Heartbeat,
}

#: ``messageType`` → its payload Struct (``CallWaiting``'s envelope keeps a dict of these
#: members).
PAYLOADS: Final[dict[str, type[Any]]] = {
    keys.MT_EXECUTE_CALL: ExecuteCallPayload,
    keys.MT_RESUME_CALL: ResumeCallPayload,
    keys.MT_CANCEL_CALL: CancelCallPayload,
    keys.MT_HEARTBEAT_ACK: HeartbeatAckPayload,
    keys.MT_CALL_WAITING: CallWaitingPayload,
    keys.MT_CALL_COMPLETED: TimedCallCompletedPayload,
    keys.MT_CALL_FAILED: CallFailedPayload,
    keys.MT_HEARTBEAT: HeartbeatPayload,
}
