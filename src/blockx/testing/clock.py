"""The virtual clock of :mod:`blockx.testing`: ``time.sleep`` without waiting.

Theory of operation
-------------------
Inside the engine ``time.sleep`` suspends only the calling call (the
executor's sleep patch). In a unit test nothing else runs meanwhile, so the
useful behaviour is to *not wait at all* and record the time instead:
:meth:`VirtualClock.sleep` adds the seconds to :attr:`VirtualClock.now` and
appends them to :attr:`VirtualClock.sleeps`.

:func:`install_sleep_patch` replaces ``time.sleep`` once per process with a
wrapper that asks a ContextVar for the clock of the function running here:
set (inside a :class:`~blockx.testing.LoadedFunction` call) the clock
advances; unset (everywhere else, other threads included) it is the original
blocking sleep. The patch is installed when a function is loaded, before its
module body runs, so ``from time import sleep`` in user code binds the
wrapper too.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from contextvars import ContextVar, Token
from typing import Any

__all__ = [
    "VirtualClock",
    "active_clock",
    "install_sleep_patch",
    "is_sleep_patch_installed",
    "reset_active_clock",
    "set_active_clock",
]


class VirtualClock:
    """Seconds slept by the calls of one test environment; nobody waits.

    ``now`` starts at ``start`` (0.0) and grows by every sleep; ``sleeps``
    lists each sleep's seconds in order.
    """

    __slots__ = ("now", "sleeps", "start")

    def __init__(self, start: float = 0.0) -> None:
        self.start = float(start)
        self.now = float(start)
        self.sleeps: list[float] = []

    def __repr__(self) -> str:
        return f"VirtualClock(now={self.now:g}, sleeps={len(self.sleeps)})"

    @property
    def elapsed(self) -> float:
        """Seconds slept since the clock was made."""
        return self.now - self.start

    def sleep(self, seconds: Any) -> None:
        """Advance by ``seconds`` (what ``time.sleep`` checks is checked here too)."""
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
            raise TypeError(f"sleep() needs a number of seconds, not {type(seconds).__name__}")
        if math.isnan(seconds) or seconds < 0:
            raise ValueError("sleep length must be non-negative")
        self.sleeps.append(float(seconds))
        self.now += float(seconds)

    def advance(self, seconds: float) -> None:
        """Move the clock on without a sleep being recorded (a test's own passage of time)."""
        if seconds < 0:
            raise ValueError("a clock does not go back")
        self.now += float(seconds)


_active: ContextVar[VirtualClock | None] = ContextVar("blockx_testing_clock", default=None)
_original_sleep: Callable[[Any], None] = time.sleep
_installed = False


def active_clock() -> VirtualClock | None:
    """The clock of the function running in this context (None outside one)."""
    return _active.get()


def set_active_clock(clock: VirtualClock | None) -> Token[VirtualClock | None]:
    return _active.set(clock)


def reset_active_clock(token: Token[VirtualClock | None]) -> None:
    _active.reset(token)


@functools.wraps(_original_sleep)
def _virtual_sleep(seconds: Any) -> None:
    clock = _active.get()
    if clock is None:
        _original_sleep(seconds)
        return
    clock.sleep(seconds)


def install_sleep_patch() -> None:
    """Make ``time.sleep`` virtual inside test calls (idempotent; real elsewhere).

    Installed once per process. Another patch installed over it later (the
    executor's, in-process tests) keeps calling it, so it is not wrapped again
    (that would loop); only when ``time.sleep`` is back to the very function it
    replaced (a test's monkeypatch undone) is it put back.
    """
    global _original_sleep, _installed
    current: Any = time.sleep
    if current is _virtual_sleep:
        return
    if _installed and current is not _original_sleep:
        return  # another wrapper sits above ours and calls it
    _original_sleep = current
    _installed = True
    time.sleep = _virtual_sleep


def is_sleep_patch_installed() -> bool:
    """Whether ``time.sleep`` is the wrapper itself."""
    sleep: Any = time.sleep
    return sleep is _virtual_sleep
