"""Per-host limits of the ``http`` backend: the host gate.

Theory of operation
-------------------
:class:`HostGate` holds one host's two limits: a semaphore of ``max_concurrency``
requests in flight and a request rate, the rpc backend's token bucket
(:class:`~blockx.worker.io.rate_limit.TokenBucket`, one request one token: at most
``rate * T + burst`` requests in any ``T`` seconds, the burst a tenth of a second's
worth) or none when the rate is 0. The backend takes a slot first, then waits for its
tokens, then sends; the slot is released when the response has been read. A
reservation is never taken back (a request whose caller went away still used its
tokens: the server may have seen it).
"""

from __future__ import annotations

import asyncio

from .rate_limit import TokenBucket

__all__ = ["HostGate"]


class HostGate:
    """One host's concurrency slots and request rate (module docstring)."""

    __slots__ = ("host", "limiter", "slots")

    def __init__(
        self, host: str, max_concurrency: int, max_requests_per_s: float, *, now: float = 0.0
    ) -> None:
        self.host = host
        self.slots = asyncio.Semaphore(max_concurrency)
        self.limiter = TokenBucket(max_requests_per_s, now=now) if max_requests_per_s > 0 else None

    def __repr__(self) -> str:
        return f"HostGate({self.host!r}, free={self.slots._value}, {self.limiter!r})"
