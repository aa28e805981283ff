"""Rate limits of the ``rpc`` backend: a token bucket per chain, ``Retry-After``, and the
node's "slow down" errors. Pure: no clock, no IO; times come in as arguments.

Theory of operation
-------------------
:class:`TokenBucket` holds ``max_requests_per_s`` for one chain, shared by every
batch the chain's client sends (``rpc.py``). A batch of ``n`` JSON-RPC requests
*reserves* ``n`` tokens before each HTTP try (:meth:`TokenBucket.reserve`) and
is told how long to wait before sending. Reservations are taken in the order
they are asked for and never refused: the balance may go negative, and a
reservation waits until the refill has paid its debt back. The bucket holds at
most :attr:`TokenBucket.burst` tokens — a tenth of a second's worth, at least
one — and a batch is never larger than that (the client splits them), so in
any window of ``T`` seconds at most ``rate * T + burst`` requests leave: a
limit of 50/s sends at most 55 in any second. A reservation whose batch is
cancelled while waiting keeps its tokens spent (the error is on the safe side).

:meth:`TokenBucket.hold_until` is the node's ``Retry-After``: nothing leaves
before that time, and the bucket restarts empty then (no burst right after a
429). A batch that reserved its tokens before the hold and is still waiting
asks :meth:`TokenBucket.held_for` before it sends, waits out the rest and then
reserves again (its first tokens are lost: batches held together must not leave
together). A bucket without a rate (``rate=None``) only does that.

:func:`retry_after_s` reads a ``Retry-After`` value (seconds, or an HTTP date
against the wall clock the caller passes). :func:`is_rate_limit_error` tells a
JSON-RPC error object that means "too many requests" (codes ``-32005``,
``-32029``, ``-32007``, ``-32090``, ``429``; or its message says "rate limit",
"limit exceeded", "too many requests", "request limit", "exceeded ...
capacity"). ``-32005`` also means "query returned more than 10000 results" on
some providers: that one (a message about results or a block range) is not a
rate limit.
"""

from __future__ import annotations

import math
import re
from email.utils import parsedate_to_datetime
from typing import Any, Final

__all__ = [
    "RATE_LIMIT_CODES",
    "TokenBucket",
    "is_rate_limit_error",
    "retry_after_s",
]

#: JSON-RPC error codes providers use for "too many requests".
RATE_LIMIT_CODES: Final = frozenset({-32005, -32029, -32007, -32090, 429})
_RATE_LIMIT_TEXT: Final = re.compile(
    r"rate.?limit|limit exceeded|too many requests|request limit|exceeded .*capacity"
    r"|requests? per second|throttl",
    re.IGNORECASE,
)
#: ``-32005`` messages that are about the answer's size, not the request rate.
_NOT_A_RATE_LIMIT: Final = re.compile(r"more than \d+ results|block range|response size", re.I)
#: How much of a second's worth of tokens the bucket holds at most.
BURST_S: Final = 0.1


class TokenBucket:
    """Requests per second for one chain (see the module docstring).

    ``rate``: tokens per second, or None for no limit (``hold_until`` still applies).
    """

    __slots__ = ("_held_until", "_tokens", "_updated", "burst", "rate")

    def __init__(self, rate: float | None, *, now: float = 0.0) -> None:
        if rate is not None and not rate > 0:
            raise ValueError(f"rate must be positive or None, got {rate!r}")
        self.rate = rate
        #: The most tokens held, and so the largest batch (requests) sent at once.
        self.burst = max(1, math.ceil(rate * BURST_S)) if rate is not None else 0
        self._tokens = float(self.burst)
        #: When ``_tokens`` was right (may lie in the future, after ``hold_until``).
        self._updated = now
        #: Nothing is sent before this (the node's latest ``Retry-After``).
        self._held_until = now

    def __repr__(self) -> str:
        if self.rate is None:
            return f"TokenBucket(unlimited, held_until={self._updated:.3f})"
        return (
            f"TokenBucket({self.rate:g}/s, burst={self.burst}, tokens={self._tokens:.2f} "
            f"at {self._updated:.3f})"
        )

    def max_batch(self, wanted: int) -> int:
        """The largest batch to send: ``wanted``, at most :attr:`burst` when limited."""
        return wanted if self.rate is None else max(1, min(wanted, self.burst))

    def reserve(self, count: int, now: float) -> float:
        """Take ``count`` tokens; answer how many seconds to wait before sending (≥ 0)."""
        rate = self.rate
        if rate is None:
            return max(0.0, self._updated - now)
        if now > self._updated:
            self._tokens = min(float(self.burst), self._tokens + (now - self._updated) * rate)
            self._updated = now
        self._tokens -= count
        ready = self._updated + (-self._tokens / rate if self._tokens < 0 else 0.0)
        return max(0.0, ready - now)

    def hold_until(self, until: float, now: float) -> None:
        """Send nothing before ``until`` (the node's ``Retry-After``); restart empty then."""
        self._held_until = max(self._held_until, until)
        if self.rate is not None and now > self._updated:
            self._tokens = min(float(self.burst), self._tokens + (now - self._updated) * self.rate)
            self._updated = now
        if until > self._updated:
            self._tokens = min(self._tokens, 0.0)
            self._updated = until

    def held_for(self, now: float) -> float:
        """Seconds left of the latest :meth:`hold_until` (0: none)."""
        return max(0.0, self._held_until - now)


def retry_after_s(value: str | None, wall_now: float) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (``"1"``, ``"1.5"`` or an HTTP date,
    against ``wall_now`` in seconds since the epoch); None when absent or unreadable."""
    if not value:
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        return max(0.0, when.timestamp() - wall_now)
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


def is_rate_limit_error(error: Any) -> bool:
    """Whether a JSON-RPC error object means "too many requests" (module docstring)."""
    if type(error) is not dict:
        return bool(_RATE_LIMIT_TEXT.search(str(error)))
    code = error.get("code")
    message = str(error.get("message") or "")
    if code in RATE_LIMIT_CODES and type(code) is int:
        return not (code == -32005 and _NOT_A_RATE_LIMIT.search(message))
    return bool(_RATE_LIMIT_TEXT.search(message))
