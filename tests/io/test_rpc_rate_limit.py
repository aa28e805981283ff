"""Rate limits of the ``rpc`` backend: the pure token bucket on a virtual clock, the
``Retry-After`` and error readers, and the backend against the real local JSON-RPC node
(``jsonrpc_node.FakeNode``): ``Retry-After`` honoured, providers' "too many requests"
errors retried, ``max_requests_per_s`` held (an upper bound on the rate the node saw:
a slow machine only lowers it), throttled requests counted."""

from __future__ import annotations

import asyncio
import heapq
import random
import time
from email.utils import formatdate
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from io_support import answer, call_backend, payload, run
from jsonrpc_node import ALICE, BOB, FakeNode, balance

from blockx.wire import keys
from blockx.worker.io.config import RpcConfig, load_io_config
from blockx.worker.io.rate_limit import TokenBucket, is_rate_limit_error, retry_after_s
from blockx.worker.io.registry import IOSubsystem
from blockx.worker.io.rpc import RpcBackend

R = keys.IO_READ
T0 = 1_000.37  # virtual clocks start at an odd value


def backend_for(url: str, **knobs: Any) -> RpcBackend:
    knobs.setdefault("backoff_base_ms", 1)
    return RpcBackend(RpcConfig(endpoints={"eth": [url]}, **knobs), rng=random.Random(7))


def params(*method_params: Any) -> dict[str, Any]:
    return {"chain": "eth", "params": list(method_params)}


def max_in_window(times: list[tuple[float, int]], window_s: float) -> int:
    """The most requests seen within any ``window_s`` (weighted by requests per send)."""
    times = sorted(times)
    best = 0
    for i, (start, _) in enumerate(times):
        best = max(best, sum(n for t, n in times[i:] if t < start + window_s))
    return best


# --- the token bucket, on a virtual clock ----------------------------------------------------


def test_50_per_s_over_2000_reads_within_10_percent_when_all_ask_at_once() -> None:
    bucket = TokenBucket(50.0, now=T0)
    sends = [(T0 + bucket.reserve(1, T0), 1) for _ in range(2000)]
    elapsed = sends[-1][0] - sends[0][0]
    rate = (len(sends) - 1) / elapsed
    assert 50 * 0.9 <= rate <= 50 * 1.1, rate
    assert max_in_window(sends, 1.0) <= 55  # rate * 1 s + the burst (a tenth of a second's)


def test_50_per_s_over_2000_reads_in_batches_sent_as_soon_as_allowed() -> None:
    bucket = TokenBucket(50.0, now=T0)
    rng = random.Random(3)
    now = T0
    sends: list[tuple[float, int]] = []
    left = 2000
    while left:
        size = min(left, bucket.max_batch(rng.randint(1, 100)))
        now += bucket.reserve(size, now)
        sends.append((now, size))
        left -= size
        now += rng.random() * 0.01  # the next batch asks a little later
    assert max(n for _, n in sends) <= bucket.burst == 5
    rate = 2000 / (sends[-1][0] - T0)
    assert 50 * 0.9 <= rate <= 50 * 1.1, rate
    assert max_in_window(sends, 1.0) <= 55


def test_an_idle_bucket_saves_at_most_its_burst() -> None:
    bucket = TokenBucket(50.0, now=T0)
    assert [bucket.reserve(1, T0 + 3600) for _ in range(5)] == [0.0] * 5
    assert bucket.reserve(1, T0 + 3600) == pytest.approx(1 / 50)


def test_hold_until_delays_everything_and_restarts_empty() -> None:
    bucket = TokenBucket(50.0, now=T0)
    bucket.hold_until(T0 + 1.0, T0)
    assert bucket.reserve(1, T0) == pytest.approx(1.0 + 1 / 50)
    unlimited = TokenBucket(None, now=T0)
    assert unlimited.reserve(100, T0) == 0.0
    unlimited.hold_until(T0 + 2.5, T0)
    assert unlimited.reserve(100, T0 + 1.0) == pytest.approx(1.5)
    assert unlimited.reserve(100, T0 + 3.0) == 0.0
    assert unlimited.max_batch(100) == 100 and TokenBucket(1000.0).max_batch(500) == 100


def test_retry_after_values() -> None:
    wall = 1_700_000_000.0
    assert retry_after_s("1", wall) == 1.0
    assert retry_after_s(" 2.5 ", wall) == 2.5
    assert retry_after_s("-3", wall) == 0.0
    assert retry_after_s(formatdate(wall + 30, usegmt=True), wall) == pytest.approx(30.0)
    assert retry_after_s(formatdate(wall - 30, usegmt=True), wall) == 0.0
    assert retry_after_s("soon", wall) is None
    assert retry_after_s("", wall) is None
    assert retry_after_s("nan", wall) is None


@pytest.mark.parametrize(
    ("error", "limited"),
    [
        ({"code": -32005, "message": "daily request count limit exceeded"}, True),
        ({"code": -32005, "message": "query returned more than 10000 results"}, False),
        ({"code": -32029, "message": "requests limited"}, True),
        ({"code": 429, "message": "Too Many Requests"}, True),
        ({"code": -32007, "message": "100/second request limit reached"}, True),
        (
            {
                "code": -32000,
                "message": "Your app has exceeded its compute units per second capacity",
            },
            True,
        ),
        ({"code": -32603, "message": "rate limit reached, retry later"}, True),
        ({"code": 3, "message": "execution reverted"}, False),
        ({"code": -32601, "message": "the method does not exist"}, False),
        ("too many requests", True),
    ],
)
def test_rate_limit_errors_are_recognised(error: Any, limited: bool) -> None:
    assert is_rate_limit_error(error) is limited


def test_max_requests_per_s_config_forms() -> None:
    every = load_io_config({"rpc": {"max_requests_per_s": 50}}, env={}).rpc
    assert every.rate_of("eth") == every.rate_of("base") == 50.0
    per_chain = load_io_config({}, env={"RPC_MAX_REQUESTS_PER_S": "eth=25;base=0"}).rpc
    assert per_chain.rate_of("eth") == 25.0 and per_chain.rate_of("base") is None
    assert load_io_config({}, env={}).rpc.rate_of("eth") is None
    with pytest.raises(ValueError, match="max_requests_per_s"):
        load_io_config({"rpc": {"max_requests_per_s": {"eth": -1}}}, env={})


# --- against the node ------------------------------------------------------------------------


def test_a_429_with_retry_after_1_is_retried_no_sooner_than_1_s_later(node: FakeNode) -> None:
    node.faults = ["429:1"]
    rpc = backend_for(node.url)

    async def main() -> Any:
        try:
            return await call_backend(rpc, R, "eth_getBalance", params(ALICE, hex(105)))
        finally:
            await rpc.close()

    reply = run(main())
    assert reply.error is None and int(reply.result, 16) == balance(ALICE, 105)
    assert reply.throttled
    assert len(node.arrivals) == 2
    waited = node.arrivals[1][0] - node.arrivals[0][0]
    # a lower bound only (the backoff alone is 1 ms); 5 ms for the event loop's clock grain
    assert waited >= 1.0 - 0.005, waited
    assert rpc.stats.throttled == 1 and rpc.stats.retries == 1


def test_retry_after_as_an_http_date(node: FakeNode) -> None:
    # An HTTP date has whole seconds: two seconds from now is at least one second away.
    node.faults = ["429:" + formatdate(time.time() + 2, usegmt=True)]
    rpc = backend_for(node.url)

    async def main() -> Any:
        try:
            return await call_backend(rpc, R, "eth_getBalance", params(BOB, hex(101)))
        finally:
            await rpc.close()

    reply = run(main())
    assert reply.error is None and int(reply.result, 16) == balance(BOB, 101)
    assert node.arrivals[1][0] - node.arrivals[0][0] >= 1.0 - 0.005


def test_a_retry_after_beyond_retry_after_max_s_fails_at_once(node: FakeNode) -> None:
    node.faults = ["429:3600"]
    rpc = backend_for(node.url, retry_after_max_s=5)

    async def main() -> Any:
        try:
            return await call_backend(rpc, R, "eth_getBalance", params(ALICE, hex(105)))
        finally:
            await rpc.close()

    reply = run(main())
    assert reply.error is not None and reply.error.retryable
    assert "HTTP 429" in reply.error.message and "retry after 3600s" in reply.error.message
    assert "retry_after_max_s=5" in reply.error.message
    assert len(node.arrivals) == 1


def test_a_retry_after_holds_the_other_batches_of_the_chain_too(node: FakeNode) -> None:
    node.faults = ["429:1"]
    rpc = backend_for(node.url)

    async def main() -> Any:
        try:
            first = asyncio.ensure_future(
                call_backend(rpc, R, "eth_getBalance", params(ALICE, hex(105)))
            )
            while not node.arrivals:  # the 429 came back
                await asyncio.sleep(0.01)
            while not rpc.stats.throttled:
                await asyncio.sleep(0.01)
            second = await call_backend(rpc, R, "eth_getBalance", params(BOB, hex(106)))
            return await first, second
        finally:
            await rpc.close()

    first, second = run(main())
    assert first.error is None and second.error is None
    assert second.throttled  # held by the chain's Retry-After, though it was never refused
    later = [t for t, _ in node.arrivals[1:]]
    assert min(later) - node.arrivals[0][0] >= 1.0 - 0.005


@pytest.mark.parametrize("fault", ["limit_error", "limit_batch_error"])
def test_rate_limit_errors_are_retried_and_counted_in_the_task_stats(
    node: FakeNode, fault: str
) -> None:
    node.faults = [fault]
    io = IOSubsystem(
        load_io_config({"rpc": {"endpoints": {"eth": [node.url]}, "backoff_base_ms": 1}}, env={})
    )
    scope = io.task_scope("t")

    async def main() -> Any:
        try:
            return await asyncio.gather(
                *(
                    answer(
                        scope.handle_io(
                            "t",
                            f"c{i}",
                            payload("rpc", "eth_getBalance", params(ALICE, hex(100 + i))),
                            None,
                        )
                    )
                    for i in range(3)
                )
            )
        finally:
            await io.close()

    results = run(main())
    assert [int(r.result, 16) for r in results] == [balance(ALICE, 100 + i) for i in range(3)]
    assert node.bodies == [3, 3]  # refused once, then answered
    stats = scope.stats.operation("rpc", "eth_getBalance")
    assert stats.throttled == 3 and stats.errors == 0
    assert scope.stats.totals()["throttled"] == 3
    assert "throttled" in scope.stats.format_table()


def test_a_rate_limit_error_that_never_ends_gives_up_retryable(node: FakeNode) -> None:
    node.faults = ["limit_error"] * 4
    rpc = backend_for(node.url, max_attempts=4)

    async def main() -> Any:
        try:
            return await call_backend(rpc, R, "eth_getBalance", params(ALICE, hex(105)))
        finally:
            await rpc.close()

    reply = run(main())
    assert reply.error is not None and reply.error.retryable
    assert "rate limited: JSON-RPC error -32005" in reply.error.message
    assert "gave up after 4 tries" in reply.error.message


@pytest.mark.slow
def test_max_requests_per_s_is_an_upper_bound_on_what_the_node_sees(node: FakeNode) -> None:
    rate = 20.0
    reads = 80
    rpc = backend_for(node.url, max_requests_per_s={"eth": rate})

    async def main() -> Any:
        try:
            return await asyncio.gather(
                *(
                    call_backend(rpc, R, "eth_getBalance", params(ALICE, hex(100 + i % 11)))
                    for i in range(reads)
                )
            )
        finally:
            await rpc.close()

    replies = run(main(), timeout=120)
    assert [int(r.result, 16) for r in replies] == [
        balance(ALICE, 100 + i % 11) for i in range(reads)
    ]
    burst = TokenBucket(rate).burst
    assert max(node.bodies) <= burst  # batches cut to the bucket's burst
    arrivals = sorted(node.arrivals)
    assert sum(n for _, n in arrivals) == reads
    elapsed = arrivals[-1][0] - arrivals[0][0]
    observed = (reads - burst) / elapsed  # the first burst may leave at once
    print(f"{reads} reads at max {rate:g}/s: {observed:.2f}/s over {elapsed:.2f} s")
    assert observed <= rate * 1.1, observed
    # any one second: rate + burst, and one more batch for the network's jitter
    assert max_in_window(arrivals, 1.0) <= rate + 2 * burst
    assert rpc.stats.held > 0 and all(r.throttled for r in replies[burst:])


def test_held_for_tells_a_waiting_batch_about_a_later_hold() -> None:
    bucket = TokenBucket(10.0, now=T0)
    assert bucket.held_for(T0) == 0.0
    bucket.hold_until(T0 + 1.0, T0 + 0.05)
    assert bucket.held_for(T0 + 0.1) == pytest.approx(0.9)
    assert bucket.held_for(T0 + 2.0) == 0.0


def test_batches_already_waiting_for_their_turn_also_wait_out_a_retry_after(
    node: FakeNode,
) -> None:
    # At 10/s each request is its own batch, 0.1 s apart: the second and third have their
    # turn before the first one's 429 comes back, and must still wait for its Retry-After.
    node.faults = ["429:1"]
    rpc = backend_for(node.url, max_requests_per_s=10)

    async def main() -> Any:
        try:
            return await asyncio.gather(
                *(
                    call_backend(rpc, R, "eth_getBalance", params(ALICE, hex(100 + i)))
                    for i in range(3)
                )
            )
        finally:
            await rpc.close()

    replies = run(main())
    assert [int(r.result, 16) for r in replies] == [balance(ALICE, 100 + i) for i in range(3)]
    first = node.arrivals[0][0]
    assert all(t - first >= 1.0 - 0.005 for t, _ in node.arrivals[1:]), node.arrivals
    assert all(r.throttled for r in replies)


def test_the_response_parser_keeps_retry_after_fed_whole_or_byte_by_byte() -> None:
    from blockx.worker.io.http_response import ResponseParser

    raw = b"HTTP/1.1 429 Too Many Requests\r\nretry-after:  7 \r\nContent-Length: 2\r\n\r\nno"
    whole = ResponseParser()
    assert whole.feed(raw)
    bytewise = ResponseParser()
    done = [bytewise.feed(raw[i : i + 1]) for i in range(len(raw))]
    assert done[-1] and not any(done[:-1])
    for parser in (whole, bytewise):
        assert (parser.status, parser.retry_after, parser.body) == (429, "7", b"no")
    plain = ResponseParser()
    plain.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
    assert plain.retry_after == ""


@settings(max_examples=300, deadline=None)
@given(
    rate=st.floats(min_value=0.5, max_value=2000.0),
    steps=st.lists(
        st.tuples(
            st.floats(min_value=0.0, max_value=0.5),  # time until the next batch asks
            st.integers(min_value=1, max_value=500),  # the batch wanted
            st.floats(min_value=0.0, max_value=2.0),  # a Retry-After coming then (0: none)
        ),
        min_size=1,
        max_size=60,
    ),
)
def test_no_window_ever_sees_more_than_rate_times_its_length_plus_the_burst(
    rate: float, steps: list[tuple[float, int, float]]
) -> None:
    """An event simulation of rpc._ChainClient._wait_for_turn: batches reserve, wake, wait
    out holds that came meanwhile and reserve again; Retry-Afters arrive at any time."""
    bucket = TokenBucket(rate, now=T0)
    events: list[tuple[float, int, str, int]] = []  # (time, order, what, size or hold)
    order = 0
    now = T0
    for gap, wanted, retry_after in steps:
        now += gap
        events.append((now, order, "ask", bucket.max_batch(wanted)))
        order += 1
        if retry_after:
            events.append((now, order, "hold", round(retry_after * 1e6)))
            order += 1
    heapq.heapify(events)
    sends: list[tuple[float, int]] = []
    while events:
        at, _, what, value = heapq.heappop(events)
        if what == "hold":
            bucket.hold_until(at + value / 1e6, at)
            continue
        if what == "ask":
            assert value <= bucket.burst
            wake = at + bucket.reserve(value, at)
            heapq.heappush(events, (wake, order, "wake", value))
        elif what == "wake":
            held = bucket.held_for(at)
            if held <= 0:
                sends.append((at, value))
                continue
            heapq.heappush(events, (at + held, order, "ask", value))  # reserve again
        order += 1
    assert len(sends) == len(steps)
    sends.sort()
    for i, (start, _) in enumerate(sends):
        seen = 0
        for end, size in sends[i:]:
            seen += size
            assert seen <= rate * (end - start) + bucket.burst + 1e-6
