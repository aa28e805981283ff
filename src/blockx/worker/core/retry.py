"""Retry decisions and backoff: pure functions of their arguments.

Theory of operation
-------------------
A failed attempt of a root call is retried when the error is retryable, the
call has attempts left and its task is still dispatching
(:func:`should_retry`). The retry waits :func:`compute_backoff` ms:
``base * 2^(attempt-1)``, capped at ``max_backoff_ms``, plus up to 5% jitter
drawn from the injected random source -- the only randomness in the core, so a
seeded ``random.Random`` makes a whole run reproducible. ``base`` is the task
policy's ``base_backoff_ms`` when it sets one, else the config's.

A bind failure is not an attempt: the core gives the attempt back and re-arms
the call at once (delay 0), without calling into this module.
"""

from __future__ import annotations

from .config import RETRY_JITTER_FRACTION
from .types import CallError, JitterSource

__all__ = ["compute_backoff", "should_retry"]

#: 2**30 ms is 12 days: far past any cap; keeps the shift bounded.
_MAX_SHIFT = 30


def should_retry(error: CallError, attempt_count: int, max_attempts: int, stopping: bool) -> bool:
    """Whether an attempt that failed with ``error`` is retried."""
    return error.retryable and attempt_count < max_attempts and not stopping


def compute_backoff(base_ms: int, attempt: int, jitter: JitterSource, max_backoff_ms: int) -> int:
    """Delay in ms before the retry that follows failed attempt number ``attempt``."""
    shift = min(max(attempt, 1) - 1, _MAX_SHIFT)
    delay = min(base_ms << shift, max_backoff_ms)
    return delay + int(delay * RETRY_JITTER_FRACTION * jitter.random())
