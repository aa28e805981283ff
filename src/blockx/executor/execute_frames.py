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
from blockx.wire.frames import typed_hook

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


def _acceptable(frame: ExecuteCallFrame) -> bool:
    payload = frame.payload
    return bool(frame.callId) and payload.callBudgetMs >= 0 and payload.attemptSeq >= 1


#: The frame as an :class:`ExecuteCallFrame`, or None to decode it the generic way.
decode_execute_call: Final = typed_hook(keys.MT_EXECUTE_CALL, ExecuteCallFrame, _acceptable)
