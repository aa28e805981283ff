"""ExecuteCall frames decoded and validated in one C pass (the executor's reader thread).

Theory of operation
-------------------
Every call starts with an ``ExecuteCall``: decoding its envelope into dicts and
then checking twelve payload members in Python is the largest per-call cost of
the executor's reader thread. :func:`decode_execute_call` is the reader's
:class:`~blockx.wire.FrameDecoder` ``typed`` hook: a body that starts the way
the worker writes an ExecuteCall (``{"messageType":"ExecuteCall",``) is decoded
straight into :class:`ExecuteCallFrame` by msgspec, which checks every type
PROTOCOL.md gives (``callBudgetMs`` an int, ``ancestry`` a list of strings,
...); the two range checks msgspec cannot express follow. The runtime then
builds the call's context from the struct's attributes
(:meth:`~blockx.executor.runtime.ExecutorRuntime.handle_inbound_message`).

Anything else — another message type, another key order, a missing required
member, a value of the wrong type or range — returns None, and the frame takes
the generic path (a dict envelope and ``ExecContext.from_execute_call``), which
accepts exactly the same payloads and refuses the rest with its own messages.
So this module only makes the common case cheaper; it decides nothing.
(bench/executor_throughput.py; the typed decode and attribute reads cost about
60% of the dict decode and subscripts on the worker's ExecuteCall.)
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from blockx.wire import keys

__all__ = ["ExecuteCallFrame", "ExecutePayload", "decode_execute_call"]


class ExecutePayload(msgspec.Struct):
    """An ExecuteCall payload; field names are PROTOCOL.md's keys, defaults its defaults."""

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
    """A whole ExecuteCall envelope (unknown members are ignored, as PROTOCOL.md says)."""

    callId: str
    payload: ExecutePayload


#: How the worker's ExecuteCall bodies begin (orchestrator_execute.py writes them).
_PREFIX: Final = (
    b'{"' + keys.F_MESSAGE_TYPE.encode() + b'":"' + keys.MT_EXECUTE_CALL.encode() + b'",'
)
_PREFIX_LEN: Final = len(_PREFIX)
_decode = msgspec.json.Decoder(ExecuteCallFrame).decode


def decode_execute_call(body: memoryview) -> ExecuteCallFrame | None:
    """The frame as an :class:`ExecuteCallFrame`, or None to decode it the generic way."""
    if body[:_PREFIX_LEN] != _PREFIX:
        return None
    try:
        frame = _decode(body)
    except msgspec.DecodeError:  # also msgspec.ValidationError
        return None
    payload = frame.payload
    if not frame.callId or payload.callBudgetMs < 0 or payload.attemptSeq < 1:
        return None
    return frame
