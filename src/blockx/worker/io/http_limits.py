"""Per-host limits of the ``http`` backend: a pure request-rate bucket and the host gate.

Theory of operation
-------------------
:class:`RequestRateLimiter` is a token bucket in its GCRA form (one number, the
*theoretical arrival time*): ``reserve(now)`` books the next request slot and
returns how long the caller must wait before starting it. It reads no clock —
``now`` comes in as an argument — so tests drive it with a virtual clock. With
``rate`` requests per second and a burst of ``burst``, any window of ``t``
seconds admits at most ``burst + rate * t`` requests; slots are handed out in
call order (FIFO), and a reservation is never taken back (a request whose caller
went away still used its slot: the server may have seen it).

:class:`HostGate` holds one host's two limits: a semaphore of
``max_concurrency`` requests in flight and the rate limiter (none when the rate
is 0). The backend takes the slot first, then waits for its rate slot, then
sends; the slot is released when the response has been read.
"""

from __future__ import annotations

import asyncio
from typing import Final

__all__ = ["HostGate", "RequestRateLimiter"]

#: Waits shorter than this are rounding residue (a nanosecond): no wait.
_EPSILON_S: Final = 1e-9


class RequestRateLimiter:
    """``rate`` requests per second with bursts of at most ``burst`` (module docstring)."""

    __slots__ = ("_arrival", "burst", "interval", "rate")

    def __init__(self, rate: float, burst: int = 1) -> None:
        if not rate > 0:
            raise ValueError(f"rate must be positive, got {rate!r}")
        if burst < 1:
            raise ValueError(f"burst must be at least 1, got {burst!r}")
        self.rate = rate
        self.burst = burst
        #: Seconds between two requests at the sustained rate.
        self.interval = 1.0 / rate
        # The theoretical arrival time of the next request; invariant: never decreases.
        self._arrival = float("-inf")

    def __repr__(self) -> str:
        return f"RequestRateLimiter(rate={self.rate:g}/s, burst={self.burst})"

    def reserve(self, now: float) -> float:
        """Book the next request: seconds to wait from ``now`` before sending it (≥ 0)."""
        arrival = self._arrival if self._arrival > now else now
        allowed_at = arrival - (self.burst - 1) * self.interval
        self._arrival = arrival + self.interval
        wait = allowed_at - now
        return wait if wait > _EPSILON_S else 0.0  # float residue of the sums is no wait


class HostGate:
    """One host's concurrency slots and request rate (module docstring)."""

    __slots__ = ("host", "limiter", "slots")

    def __init__(self, host: str, max_concurrency: int, max_requests_per_s: float) -> None:
        self.host = host
        self.slots = asyncio.Semaphore(max_concurrency)
        self.limiter = RequestRateLimiter(max_requests_per_s) if max_requests_per_s > 0 else None

    def __repr__(self) -> str:
        return f"HostGate({self.host!r}, free={self.slots._value}, {self.limiter!r})"
