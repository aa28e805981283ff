"""CallCompleted frames decoded typed, the output kept as the executor's JSON bytes.

Theory of operation
-------------------
A call's output reaches the worker inside its ``CallCompleted`` and leaves it
as JSON again (a row, a call-cache entry, a sub-call's result). Decoding it
into Python objects only to encode it back costs more than the rest of the
frame: ~10 µs for a 1.4 KB output, ~1 µs for ``{"y": 1}``.
:func:`decode_call_completed` is the connection's
:class:`~blockx.wire.FrameDecoder` ``typed`` hook: a body that starts the way the
executor writes one (``{"messageType":"CallCompleted",``) is decoded by msgspec
into :class:`CompletedFrame`, whose ``output`` stays a ``msgspec.Raw`` slice of
the frame (valid JSON: msgspec parsed through it). The orchestrator copies it
out right-sized (``bytes(raw)``) as the call's output.

Anything else — another message type or key order, an ``attemptSeq`` that is
not an int, a payload of the wrong shape — returns None and takes the generic
path (a dict envelope), which handles every such case as before. Code that
wants the dict form of a typed payload (the per-frame callbacks, output limits,
debug output) gets it from :meth:`CompletedPayload.to_wire`.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from blockx.wire import keys, loads_wire
from blockx.wire.frames import typed_hook

__all__ = ["CompletedFrame", "CompletedPayload", "decode_call_completed"]

_NULL: Final = msgspec.Raw(b"null")


class CompletedPayload(msgspec.Struct):
    """The members of a CallCompleted payload the worker reads (PROTOCOL.md's names)."""

    attemptSeq: int
    taskId: str | None = None
    output: msgspec.Raw = _NULL
    budgetUsedMs: int = 0
    debugOutput: str | None = None

    def to_wire(self) -> dict[str, Any]:
        """The payload as the generic path would have decoded it (output decoded)."""
        return {
            keys.FP_TASK_ID: self.taskId,
            keys.FP_ATTEMPT_SEQ: self.attemptSeq,
            keys.FP_OUTPUT: loads_wire(self.output),
            keys.FP_BUDGET_USED_MS: self.budgetUsedMs,
            keys.FP_DEBUG_OUTPUT: self.debugOutput,
        }


class CompletedFrame(msgspec.Struct, tag=keys.MT_CALL_COMPLETED, tag_field=keys.F_MESSAGE_TYPE):
    """A whole CallCompleted envelope (unknown members ignored, as PROTOCOL.md says)."""

    callId: str
    payload: CompletedPayload


def _acceptable(frame: CompletedFrame) -> bool:
    return bool(frame.callId)


#: The frame as a :class:`CompletedFrame`, or None to decode it the generic way.
decode_call_completed: Final = typed_hook(keys.MT_CALL_COMPLETED, CompletedFrame, _acceptable)
