"""ExecuteCall and ResumeCall frames decoded and validated in one C pass (the reader thread).

Theory of operation
-------------------
Every call starts with an ``ExecuteCall``: decoding its envelope into dicts and
then checking twelve payload members in Python is the largest per-call cost of
the executor's reader thread. :data:`decode_inbound` is the reader's
:class:`~blockx.wire.FrameDecoder` ``typed`` hook: a body that starts the way
the worker writes an ExecuteCall (``{"messageType":"ExecuteCall",``) is decoded
straight into the wire schema's :class:`~blockx.wire.schema.ExecuteCall` by
msgspec, which checks every type docs/protocol.md gives (``callBudgetMs`` an
int, ``ancestry`` a list of strings, ...); the range checks msgspec cannot
express follow here (a budget past ``MAX_BUDGET_MS`` takes the generic path,
which clamps it). The runtime then builds the call's context from the struct's
attributes (:meth:`~blockx.executor.inbound_frames.InboundFrames._handle_execute_frame`).

Anything else — another message type, another key order, a missing required
member, a value of the wrong type or range — returns None, and the frame takes
the generic path (a dict envelope and ``ExecContext.from_execute_call``), which
accepts exactly the same payloads and refuses the rest with its own messages.
So this module only makes the common case cheaper; it decides nothing.
(bench/executor_throughput.py; the typed decode and attribute reads cost about
60% of the dict decode and subscripts on the worker's ExecuteCall.)

A ``ResumeCall`` (one per IO wait answered) is taken the same way when it is
the common kind: a ``result`` and a ``budgetUsedMs`` >= 0, no ``error``, no
sidecar. The schema's :class:`~blockx.wire.schema.ResumeCall` carries it to
``ExecutorRuntime.resume_call`` without the generic validation
(``ResumePayload.from_wire``); an error answer, a sidecar frame or anything
unusual takes the generic path. (bench/opcodes.py: ~130 fewer bytecodes per
IO wait.)

The Structs themselves are the wire schema's (``blockx/wire/schema.py``, the one
definition of every message); the names below are this module's historical
names for them. This module is compiled (setup.py): ``_acceptable`` runs once per
``ExecuteCall`` and per ``ResumeCall``, and an interpreted frame there cost the
reader thread more than the checks themselves. The Structs stay interpreted in
the schema (mypyc would drop msgspec's ``tag=`` class arguments).
"""

from __future__ import annotations

from typing import Final

from blockx.wire import keys
from blockx.wire.frames import TypedHook
from blockx.wire.schema import ExecuteCall, ExecuteCallPayload, ResumeCall, ResumeCallPayload

from .context import MAX_BUDGET_MS

__all__ = [
    "ExecuteCallFrame",
    "ExecutePayload",
    "ResumeCallFrame",
    "ResumeCallResult",
    "decode_inbound",
]

#: The schema's envelopes and payloads, by the names the executor has used for them.
ExecuteCallFrame = ExecuteCall
ExecutePayload = ExecuteCallPayload
ResumeCallFrame = ResumeCall
ResumeCallResult = ResumeCallPayload


def _acceptable(frame: ExecuteCall | ResumeCall) -> bool:
    if type(frame) is ResumeCall:
        resume = frame.payload
        return resume.error is None and 0 <= resume.budgetUsedMs <= MAX_BUDGET_MS
    payload = frame.payload  # an ExecuteCall
    return (
        bool(frame.callId)
        and 0 <= payload.callBudgetMs <= MAX_BUDGET_MS  # type: ignore[union-attr]
        and payload.attemptSeq >= 1  # type: ignore[union-attr]
    )


#: The reader's hook: a schema :class:`~blockx.wire.schema.ExecuteCall` or
#: :class:`~blockx.wire.schema.ResumeCall`, or None to decode the frame the generic way.
decode_inbound: Final[TypedHook[ExecuteCall | ResumeCall]] = TypedHook(
    {keys.MT_EXECUTE_CALL: ExecuteCall, keys.MT_RESUME_CALL: ResumeCall}, _acceptable
)
