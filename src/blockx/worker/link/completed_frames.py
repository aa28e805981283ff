"""CallCompleted and CallWaiting frames decoded typed: a CallCompleted's output kept as the
executor's JSON bytes, a CallWaiting's payload the dict its handlers take.

Theory of operation
-------------------
A call's output reaches the worker inside its ``CallCompleted`` and leaves it
as JSON again (a row, a call-cache entry, a sub-call's result). Decoding it
into Python objects only to encode it back costs more than the rest of the
frame: ~10 µs for a 1.4 KB output, ~1 µs for ``{"y": 1}``.
:data:`decode_call_frames` is the connection's :class:`~blockx.wire.FrameDecoder`
``typed`` hook: a body that starts the way the executor writes one
(``{"messageType":"CallCompleted",``) is decoded by msgspec into the wire
schema's :class:`~blockx.wire.schema.CallCompleted`, whose ``output`` stays a
``msgspec.Raw`` slice of the frame (valid JSON: msgspec parsed through it). The
orchestrator copies it out right-sized (``bytes(raw)``) as the call's output.

Anything else — another message type or key order, an ``attemptSeq`` that is
not an int (or below 1), a payload of the wrong shape, a ``CallCompleted``
without ``output`` — returns None and takes the generic path (a dict envelope),
which validates it and reports what is wrong as a protocol error. Code that
wants the dict form of a typed payload (the per-frame callbacks, output limits,
debug output) gets it from :meth:`CompletedPayload.to_wire`.

The same hook takes ``CallWaiting`` too (the schema's
:class:`~blockx.wire.schema.CallWaiting`: ``callId`` and ``requestId`` strings,
the payload an object, kept as a dict); the adapter judges the rest of it
(taskId, waitKind) and turns a frame it refuses back into the dict form
(:meth:`WaitingFrame.to_dict`) for the generic path's error.

The Structs are the wire schema's (``blockx/wire/schema.py``); the names below
are the worker's historical names for them.
"""

from __future__ import annotations

from typing import Final

from blockx.wire import keys
from blockx.wire.frames import TypedHook
from blockx.wire.schema import CallCompleted, CallCompletedPayload, CallWaiting
from blockx.worker.link.frame_checks import acceptable_call_frame

__all__ = [
    "CompletedFrame",
    "CompletedPayload",
    "WaitingFrame",
    "decode_call_frames",
]

#: The schema's envelopes and payload, by the names the worker has used for them.
CompletedFrame = CallCompleted
CompletedPayload = CallCompletedPayload
WaitingFrame = CallWaiting


#: The connection's hook: a :class:`CompletedFrame` or a :class:`WaitingFrame`, or None
#: to decode the frame the generic way. Their common prefix is ``{"messageType":"Call``,
#: so a CallFailed costs one failed typed decode first (rare by nature).
decode_call_frames: Final[TypedHook[CallCompleted | CallWaiting]] = TypedHook(
    {keys.MT_CALL_COMPLETED: CallCompleted, keys.MT_CALL_WAITING: CallWaiting},
    acceptable_call_frame,
)
