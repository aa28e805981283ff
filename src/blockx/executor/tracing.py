"""The executor's side of a trace: the ``execute`` span of a traced attempt, sent back.

Theory of operation
-------------------
The worker traces a sampled call's attempt as a ``call`` span and writes that
span's W3C ``traceparent`` in the ``ExecuteCall`` envelope's ``trace`` key
(docs/protocol.md, "Tracing"). It writes that key *first*, so the frame takes
this executor's generic decode path (the typed fast path,
:mod:`blockx.executor.execute_frames`, matches a body that opens with
``{"messageType":``): an untraced call pays nothing for tracing here, not even a
declared struct member. The generic path (``InboundFrames._handle_execute``)
hands the key to :func:`execute_span_from`, which parses it and, when the
context is sampled, starts an :class:`ExecuteSpan` (a new span id, the wall clock
in ns) kept on the call's context.

When the attempt ends (``CallRunner._finish_completed`` / ``_finish_failed``),
:func:`traced_envelope` closes the span and returns the terminal frame with two
additions: the payload's ``executeSpan`` (the finished span: ids, start and
end ns, attributes) and, again first in the envelope, ``trace`` with the
``execute`` span's own ``traceparent`` (so the frame takes the worker's generic
path, which keeps the payload's unknown keys). The worker re-emits the span to
its exporter and trace file, as a child of its ``call`` span: one trace shows
the call on both sides of the socket.

There is no OpenTelemetry import here (nor anywhere in the executor): a span is
five numbers and a few strings, and the worker owns exporting. A malformed
``trace`` value is ignored (the call runs untraced), never an error.
"""

from __future__ import annotations

import os
import time
from typing import Any, Final

from blockx.wire import keys

__all__ = ["ExecuteSpan", "execute_span_from", "traced_envelope"]

#: W3C trace context: ``00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>``.
_TRACEPARENT_LENGTH: Final = 55
_HEX: Final = frozenset("0123456789abcdef")
_SAMPLED: Final = 0x01


class ExecuteSpan:
    """One traced attempt's ``execute`` span, open until :func:`traced_envelope` ends it."""

    __slots__ = ("end_ns", "parent_span_id", "span_id", "start_ns", "trace_id")

    def __init__(self, trace_id: str, parent_span_id: str, span_id: str, start_ns: int) -> None:
        #: 32 lowercase hex digits (the worker's trace).
        self.trace_id = trace_id
        #: 16 hex digits: the worker's ``call`` span of this attempt.
        self.parent_span_id = parent_span_id
        #: 16 hex digits, new here.
        self.span_id = span_id
        #: Wall clock (``time.time_ns``) when the ExecuteCall was admitted.
        self.start_ns = start_ns
        #: Wall clock when the terminal frame was built (0 while open).
        self.end_ns = 0

    def __repr__(self) -> str:
        return (
            f"ExecuteSpan(trace={self.trace_id}, span={self.span_id}, "
            f"parent={self.parent_span_id}, {'open' if not self.end_ns else 'ended'})"
        )

    def traceparent(self) -> str:
        """This span's own W3C ``traceparent`` (sampled)."""
        return f"00-{self.trace_id}-{self.span_id}-01"


def _is_hex(text: str) -> bool:
    return all(c in _HEX for c in text)


def execute_span_from(trace: Any) -> ExecuteSpan | None:
    """Start the ``execute`` span of an ExecuteCall whose envelope ``trace`` is ``trace``
    (``{"traceparent": "00-..."}``); None when it is absent, malformed or not sampled."""
    if type(trace) is not dict:
        return None
    value = trace.get("traceparent")
    if type(value) is not str or len(value) != _TRACEPARENT_LENGTH:
        return None
    version, trace_id, parent_id, flags = value[:2], value[3:35], value[36:52], value[53:]
    if (
        value[2] != "-"
        or value[35] != "-"
        or value[52] != "-"
        or version == "ff"
        or not _is_hex(version + trace_id + parent_id + flags)
        or trace_id == "0" * 32
        or parent_id == "0" * 16
        or not int(flags, 16) & _SAMPLED
    ):
        return None
    return ExecuteSpan(trace_id, parent_id, os.urandom(8).hex(), time.time_ns())


def traced_envelope(
    envelope: dict[str, Any], span: ExecuteSpan, ctx_attributes: dict[str, Any]
) -> dict[str, Any]:
    """End ``span`` and return the terminal frame ``envelope`` carrying it: the payload
    (the same dict, updated) gains ``executeSpan``; the new envelope opens with ``trace``."""
    span.end_ns = time.time_ns()
    payload = envelope[keys.F_PAYLOAD]
    payload[keys.FP_EXECUTE_SPAN] = {
        "traceId": span.trace_id,
        "spanId": span.span_id,
        "parentSpanId": span.parent_span_id,
        "startNs": span.start_ns,
        "endNs": span.end_ns,
        "attributes": ctx_attributes,
    }
    traced: dict[str, Any] = {keys.F_TRACE: {"traceparent": span.traceparent()}}
    traced.update(envelope)
    return traced
