"""ExecuteCall and ResumeCall frames decoded and validated in one C pass (the reader thread).

Theory of operation
-------------------
Every call starts with an ``ExecuteCall``: decoding its envelope into dicts and
then checking twelve payload members in Python is the largest per-call cost of
the executor's reader thread. :data:`decode_inbound` is the reader's
:class:`~blockx.wire.FrameDecoder` ``typed`` hook: a body that starts the way
the worker writes an ExecuteCall (``{"messageType":"ExecuteCall",``) is decoded
straight into :class:`ExecuteCallFrame` by msgspec, which checks every type
docs/protocol.md gives (``callBudgetMs`` an int, ``ancestry`` a list of strings,
...); the range checks msgspec cannot express follow (a budget past
``MAX_BUDGET_MS`` takes the generic path, which clamps it). The runtime then
builds the call's context from the struct's attributes
(:meth:`~blockx.executor.inbound_frames.InboundFrames._handle_execute_frame`).

Anything else — another message type, another key order, a missing required
member, a value of the wrong type or range — returns None, and the frame takes
the generic path (a dict envelope and ``ExecContext.from_execute_call``), which
accepts exactly the same payloads and refuses the rest with its own messages.
So this module only makes the common case cheaper; it decides nothing.
(bench/executor_throughput.py; the typed decode and attribute reads cost about
60% of the dict decode and subscripts on the worker's ExecuteCall.)

A ``ResumeCall`` (one per IO wait answered) is taken the same way when it is
the common kind: a ``result`` and a ``budgetUsedMs`` >= 0, no ``error``, no
sidecar. :class:`ResumeCallFrame` carries it to
``ExecutorRuntime.resume_call`` without the generic validation
(``ResumePayload.from_wire``); an error answer, a sidecar frame or anything
unusual takes the generic path. (bench/opcodes.py: ~130 fewer bytecodes per
IO wait.)
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from blockx.wire import keys
from blockx.wire.frames import TypedHook

from .context import MAX_BUDGET_MS

__all__ = [
    "ExecuteCallFrame",
    "ExecutePayload",
    "ResumeCallFrame",
    "ResumeCallResult",
    "decode_inbound",
]


class ExecutePayload(msgspec.Struct):
    """An ExecuteCall payload; field names are docs/protocol.md's keys, defaults its defaults."""

    taskId: str
    functionId: str
    functionCodeDigest: str
    entrySelector: str = ""
    args: Any = None
    parentCallId: str | None = None
    callKey: str = ""
    ancestry: list[str] = []
    callBudgetMs: int = 0
    attemptSeq: int = 1
    audit: dict[str, Any] | None = None
    debug: bool = False


class ExecuteCallFrame(msgspec.Struct, tag=keys.MT_EXECUTE_CALL, tag_field=keys.F_MESSAGE_TYPE):
    """A whole ExecuteCall envelope (unknown members are ignored, as docs/protocol.md says)."""

    callId: str
    payload: ExecutePayload


class ResumeCallResult(msgspec.Struct):
    """A ResumeCall payload of the common kind (see the module docstring)."""

    resumeKind: str
    result: Any = None
    budgetUsedMs: int = 0
    error: Any = None  # must be absent or null here: an error takes the generic path


class ResumeCallFrame(msgspec.Struct, tag=keys.MT_RESUME_CALL, tag_field=keys.F_MESSAGE_TYPE):
    """A whole ResumeCall envelope carrying a result (unknown members ignored)."""

    callId: str
    requestId: str
    payload: ResumeCallResult


def _acceptable(frame: ExecuteCallFrame | ResumeCallFrame) -> bool:
    if type(frame) is ResumeCallFrame:
        resume = frame.payload
        return resume.error is None and 0 <= resume.budgetUsedMs <= MAX_BUDGET_MS
    payload = frame.payload  # an ExecuteCallFrame
    return (
        bool(frame.callId)
        and 0 <= payload.callBudgetMs <= MAX_BUDGET_MS  # type: ignore[union-attr]
        and payload.attemptSeq >= 1  # type: ignore[union-attr]
    )


#: The reader's hook: an :class:`ExecuteCallFrame` or a :class:`ResumeCallFrame`, or
#: None to decode the frame the generic way.
decode_inbound: Final = TypedHook(
    {keys.MT_EXECUTE_CALL: ExecuteCallFrame, keys.MT_RESUME_CALL: ResumeCallFrame}, _acceptable
)
