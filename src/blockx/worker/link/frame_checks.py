"""The worker's last check of a typed ``CallCompleted`` / ``CallWaiting`` frame.

:data:`blockx.worker.link.completed_frames.decode_call_frames` (the connection's typed
hook) calls :func:`acceptable_call_frame` once per decoded frame; a frame it refuses
takes the generic path, which names what is wrong. It lives here, compiled with the
per-call modules (``setup.py``'s ``NATIVE_MODULES``), because ``completed_frames``
cannot be (its names are msgspec Structs): interpreted, the call cost the worker
~0.2 µs per frame.
"""

from __future__ import annotations

from blockx.wire.schema import MISSING_OUTPUT, CallCompleted, CallWaiting

__all__ = ["acceptable_call_frame"]


def acceptable_call_frame(frame: CallCompleted | CallWaiting) -> bool:
    """A call id, and for a ``CallCompleted`` an attempt ≥ 1, a budget used ≥ 0 and an
    output."""
    if not frame.callId:
        return False
    if type(frame) is CallCompleted:
        payload = frame.payload
        return (
            payload.attemptSeq >= 1
            and payload.budgetUsedMs >= 0
            and payload.output is not MISSING_OUTPUT
        )
    return True
