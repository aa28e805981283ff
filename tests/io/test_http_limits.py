"""The http backend's per-host gate on a virtual clock (no IO, no waiting): its request
rate is the rpc backend's token bucket, one token a request."""

from __future__ import annotations

import asyncio

from blockx.worker.io.http_limits import HostGate

START = 1_000.123  # an odd start: nothing may assume the clock starts at 0


def _gate(rate: float, concurrency: int = 16) -> HostGate:
    async def make() -> HostGate:  # the semaphore wants a running loop on 3.11
        return HostGate("api.example:443", concurrency, rate, now=START)

    return asyncio.run(make())


def _schedule(gate: HostGate, arrivals: list[float]) -> list[float]:
    """When each request starts: it arrives at ``arrivals[i]`` and waits what it is told."""
    assert gate.limiter is not None
    return [now + gate.limiter.reserve(1, now) for now in arrivals]


def test_50_per_second_holds_over_2000_requests_arriving_at_once() -> None:
    gate = _gate(50)
    starts = _schedule(gate, [START] * 2000)
    assert starts == sorted(starts)
    burst = gate.limiter.burst if gate.limiter else 0
    elapsed = starts[-1] - starts[0]
    assert (2000 - burst) / 50 * 0.9 <= elapsed <= 2000 / 50 * 1.1
    # no window of one second holds more than rate + burst starts
    j = 0
    for i, t in enumerate(starts):
        while starts[j] <= t - 1.0:
            j += 1
        assert i - j + 1 <= 50 + burst


def test_requests_spaced_wider_than_the_rate_never_wait() -> None:
    gate = _gate(10)
    assert gate.limiter is not None
    assert [gate.limiter.reserve(1, START + i * 0.2) for i in range(20)] == [0.0] * 20


def test_no_rate_means_no_limiter_and_concurrency_is_a_semaphore() -> None:
    gate = _gate(0, concurrency=3)
    assert gate.limiter is None
    assert gate.slots._value == 3
    assert "api.example:443" in repr(gate)
