"""The http backend's request-rate bucket on a virtual clock (no IO, no waiting)."""

from __future__ import annotations

import pytest

from blockx.worker.io.http_limits import RequestRateLimiter

START = 1_000.123  # an odd start: nothing may assume the clock starts at 0


def _schedule(limiter: RequestRateLimiter, arrivals: list[float]) -> list[float]:
    """When each request starts: it arrives at ``arrivals[i]`` and waits what it is told."""
    return [now + limiter.reserve(now) for now in arrivals]


def test_50_per_second_holds_over_2000_requests_arriving_at_once() -> None:
    starts = _schedule(RequestRateLimiter(50), [START] * 2000)
    assert starts == sorted(starts)
    assert starts[0] == START
    elapsed = starts[-1] - starts[0]
    assert 1999 / 50 * 0.999 <= elapsed <= 1999 / 50 * 1.001
    # no window of one second holds more than 50 starts (+1 for the boundary)
    j = 0
    for i, t in enumerate(starts):
        while starts[j] <= t - 1.0:
            j += 1
        assert i - j + 1 <= 51


def test_requests_spaced_wider_than_the_rate_never_wait() -> None:
    limiter = RequestRateLimiter(10)
    assert [limiter.reserve(START + i * 0.2) for i in range(20)] == [0.0] * 20


def test_a_burst_lets_that_many_through_at_once_then_paces() -> None:
    limiter = RequestRateLimiter(10, burst=5)
    waits = [limiter.reserve(START) for _ in range(7)]
    assert waits[:5] == [0.0] * 5
    assert waits[5] == pytest.approx(0.1) and waits[6] == pytest.approx(0.2)


def test_bad_rates_are_refused() -> None:
    with pytest.raises(ValueError):
        RequestRateLimiter(0)
    with pytest.raises(ValueError):
        RequestRateLimiter(5, burst=0)
