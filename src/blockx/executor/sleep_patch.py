"""The process-wide ``time.sleep`` patch: cooperative inside a call, real outside.

``install_global_sleep_patch()`` (called by ``ExecutorRuntime.__init__``;
idempotent) replaces ``time.sleep`` with a wrapper. On a call's greenlet the
wrapper suspends that call on a local timer (``SdkBridge.do_sleep``: no frame
goes to the worker, other calls run meanwhile, the time is charged to the
call's budget). Anywhere else — the scheduler, the session and heartbeat
threads, threads user code starts — it is the original blocking sleep.

User modules are executed after the patch, so ``from time import sleep`` in
user code binds the wrapper too.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from .context import current_context

__all__ = [
    "install_global_sleep_patch",
    "is_sleep_patch_installed",
    "original_sleep",
    "uninstall_global_sleep_patch",
]

_original_sleep: Callable[[Any], None] = time.sleep


def original_sleep(seconds: float) -> None:
    """The blocking sleep that was in place before the patch."""
    _original_sleep(seconds)


@functools.wraps(_original_sleep)
def _cooperative_sleep(seconds: Any) -> None:
    ctx = current_context()
    if ctx is None or ctx.bridge is None:
        _original_sleep(seconds)
        return
    ctx.bridge.do_sleep(seconds)


def install_global_sleep_patch() -> None:
    """Replace ``time.sleep`` with the call-aware wrapper (no-op if already installed)."""
    global _original_sleep
    if time.sleep is _cooperative_sleep:
        return
    _original_sleep = time.sleep
    time.sleep = _cooperative_sleep


def uninstall_global_sleep_patch() -> None:
    """Put the original ``time.sleep`` back (tests)."""
    if time.sleep is _cooperative_sleep:
        time.sleep = _original_sleep


def is_sleep_patch_installed() -> bool:
    return time.sleep is _cooperative_sleep
