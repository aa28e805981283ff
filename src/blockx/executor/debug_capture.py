"""Debug capture: tee ``sys.stdout`` / ``sys.stderr`` into the running call's DebugCapture.

When an ``ExecuteCall`` has ``debug`` set, its context gets a
:class:`~blockx.executor.context.DebugCapture` and the runtime makes sure the
tee is installed (:func:`ensure_debug_tee`, idempotent, re-installed if
something replaced ``sys.stdout`` since). Every write still reaches the
original stream; a write made while a debug call's greenlet runs is also kept
for that call and returned as ``CallCompleted.debugOutput``. Writes from other
greenlets and threads (the scheduler, logging, the heartbeat) are not captured.
Non-debug calls pay one attribute check per write, and nothing until the first
debug call arrives.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from .context import current_context

__all__ = ["DebugTee", "ensure_debug_tee", "remove_debug_tee"]


class DebugTee:
    """A text stream proxy: writes go to ``stream`` and to the current debug call."""

    __slots__ = ("_stream",)

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    @property
    def wrapped(self) -> TextIO:
        return self._stream

    def write(self, text: str) -> int:
        ctx = current_context()
        if ctx is not None:
            capture = ctx.debug_capture
            if capture is not None and isinstance(text, str):
                capture.write(text)
        return self._stream.write(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    def __repr__(self) -> str:
        return f"DebugTee({self._stream!r})"


def ensure_debug_tee() -> None:
    """Wrap ``sys.stdout`` and ``sys.stderr`` unless they already are."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, DebugTee):
            setattr(sys, name, DebugTee(stream))


def remove_debug_tee() -> None:
    """Unwrap ``sys.stdout`` / ``sys.stderr`` (tests)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if isinstance(stream, DebugTee):
            setattr(sys, name, stream.wrapped)
