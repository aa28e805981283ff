"""The ``rpc`` backend against a real local JSON-RPC HTTP server (``jsonrpc_node.FakeNode``):
batching, retries with endpoint rotation, timeouts, JSON-RPC errors, caching per task."""

from __future__ import annotations

import asyncio
import random
import socket
from typing import Any

import pytest
from io_support import answer, call_backend, ok, payload, run
from jsonrpc_node import ALICE, BOB, CONTRACT, LATEST_BLOCK, FakeNode, balance

from blockx.wire import keys
from blockx.worker.io.backend import IORequestError
from blockx.worker.io.config import RpcConfig, load_io_config
from blockx.worker.io.handler import IOResult
from blockx.worker.io.registry import IOSubsystem
from blockx.worker.io.rpc import RpcBackend

R = keys.IO_READ


def backend_for(*urls: str, **knobs: Any) -> RpcBackend:
    knobs.setdefault("backoff_base_ms", 1)
    return RpcBackend(RpcConfig(endpoints={"eth": list(urls)}, **knobs), rng=random.Random(7))


def params(*method_params: Any, chain: str = "eth") -> dict[str, Any]:
    return {"chain": chain, "params": list(method_params)}


def dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/"


def test_single_request_and_result(node: FakeNode) -> None:
    rpc = backend_for(node.url)

    async def main() -> None:
        try:
            reply = await call_backend(rpc, R, "eth_getBalance", params(ALICE, hex(105)))
            assert reply.error is None
            assert int(reply.result, 16) == balance(ALICE, 105)
        finally:
            await rpc.close()

    run(main())
    assert node.bodies == [1]


def test_concurrent_requests_are_coalesced_into_batches(node: FakeNode) -> None:
    rpc = backend_for(node.url, max_batch=40)

    async def main() -> None:
        try:
            replies = await asyncio.gather(
                *(
                    call_backend(rpc, R, "eth_getBalance", params(ALICE, hex(100 + i % 11)))
                    for i in range(100)
                )
            )
            assert [int(r.result, 16) for r in replies] == [
                balance(ALICE, 100 + i % 11) for i in range(100)
            ]
        finally:
            await rpc.close()

    run(main())
    assert sorted(node.bodies) == [20, 40, 40]  # one loop turn, split at max_batch
    assert rpc.stats.batches == 3 and rpc.stats.rpc_requests == 100


def test_a_batch_window_collects_requests_across_loop_turns(node: FakeNode) -> None:
    rpc = backend_for(node.url, batch_window_ms=50)

    async def main() -> None:
        async def later(i: int) -> Any:
            await asyncio.sleep(0.002 * i)
            return await call_backend(rpc, R, "eth_getTransactionCount", params(BOB, "latest"))

        try:
            replies = await asyncio.gather(*(later(i) for i in range(5)))
            assert {r.result for r in replies} == {hex(LATEST_BLOCK - 100)}
        finally:
            await rpc.close()

    run(main())
    assert node.bodies == [5]


def test_batching_can_be_turned_off(node: FakeNode) -> None:
    rpc = backend_for(node.url, max_batch=1)

    async def main() -> None:
        try:
            await asyncio.gather(*(call_backend(rpc, R, "eth_chainId", params()) for _ in range(4)))
        finally:
            await rpc.close()

    run(main())
    assert node.bodies == [1, 1, 1, 1]


@pytest.mark.parametrize("fault", ["500", "503", "429", "drop", "bad_json"])
def test_transient_failures_are_retried(node: FakeNode, fault: str) -> None:
    node.faults = [fault, fault]
    rpc = backend_for(node.url, max_attempts=3)

    async def main() -> None:
        try:
            replies = await asyncio.gather(
                *(call_backend(rpc, R, "eth_getCode", params(CONTRACT, "latest")) for _ in range(3))
            )
            assert all(r.error is None for r in replies), replies
        finally:
            await rpc.close()

    run(main())
    assert node.bodies == [3, 3, 3]
    assert rpc.stats.retries == 2


def test_retries_give_up_with_a_retryable_error(node: FakeNode) -> None:
    node.faults = ["503"] * 3
    rpc = backend_for(node.url, max_attempts=3)

    async def main() -> None:
        try:
            reply = await call_backend(rpc, R, "eth_chainId", params())
            assert reply.error is not None and reply.error.retryable
            assert reply.error.kind == "io_error"
            assert (
                "HTTP 503" in reply.error.message and "gave up after 3 tries" in reply.error.message
            )
        finally:
            await rpc.close()

    run(main())


def test_retries_rotate_to_the_next_endpoint(node: FakeNode) -> None:
    rpc = backend_for(dead_url(), node.url, max_attempts=2)

    async def main() -> None:
        try:
            reply = await call_backend(rpc, R, "eth_blockNumber", params())
            assert reply.result == hex(LATEST_BLOCK)
            # the client stays on the endpoint that worked
            reply = await call_backend(rpc, R, "eth_blockNumber", params())
            assert reply.error is None
        finally:
            await rpc.close()

    run(main())
    assert node.bodies == [1, 1] and rpc.stats.retries == 1


def test_a_slow_node_times_out_and_is_retried(node: FakeNode) -> None:
    node.faults = ["hang"]
    node.hang_s = 2.0
    rpc = backend_for(node.url, timeout_s=0.3, max_attempts=2)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            reply = await call_backend(rpc, R, "eth_chainId", params())
            assert reply.result == "0x1"
            assert loop.time() - started < 1.5
        finally:
            await rpc.close()

    run(main())


def test_a_timeout_on_every_try_fails_retryably(node: FakeNode) -> None:
    node.delay_s = 1.0
    rpc = backend_for(node.url, timeout_s=0.2, max_attempts=2)

    async def main() -> None:
        try:
            reply = await call_backend(rpc, R, "eth_chainId", params())
            assert reply.error is not None and reply.error.retryable
            assert "no answer within 0.2s" in reply.error.message
        finally:
            await rpc.close()

    run(main())


def test_json_rpc_errors_answer_their_own_request_only(node: FakeNode) -> None:
    rpc = backend_for(node.url)

    async def main() -> None:
        try:
            ok_, reverted, missing = await asyncio.gather(
                call_backend(
                    rpc,
                    R,
                    "eth_call",
                    params(
                        {"to": CONTRACT, "data": "0x70a08231" + ALICE[2:].rjust(64, "0")}, "latest"
                    ),
                ),
                call_backend(
                    rpc, R, "eth_call", params({"to": CONTRACT, "data": "0xdeadbeef"}, "latest")
                ),
                call_backend(rpc, R, "eth_nosuchmethod", params()),
            )
            assert int(ok_.result, 16) == balance(ALICE, LATEST_BLOCK)
            assert reverted.error is not None and not reverted.error.retryable
            assert (
                reverted.error.message == "rpc eth eth_call: JSON-RPC error 3: execution reverted"
            )
            assert missing.error is not None and "-32601" in missing.error.message
        finally:
            await rpc.close()

    run(main())
    assert node.bodies == [3]


def test_missing_responses_are_sent_again(node: FakeNode) -> None:
    node.faults = ["drop_ids"]
    rpc = backend_for(node.url)

    async def main() -> None:
        try:
            replies = await asyncio.gather(
                *(
                    call_backend(rpc, R, "eth_getStorageAt", params(CONTRACT, hex(i), "latest"))
                    for i in range(6)
                )
            )
            assert [int(r.result, 16) for r in replies] == [i + LATEST_BLOCK for i in range(6)]
        finally:
            await rpc.close()

    run(main())
    assert node.bodies == [6, 3]  # the odd ids went again


def test_an_error_for_the_whole_batch_fails_each_request(node: FakeNode) -> None:
    node.faults = ["batch_error"]
    rpc = backend_for(node.url)

    async def main() -> None:
        try:
            replies = await asyncio.gather(
                *(call_backend(rpc, R, "eth_chainId", params()) for _ in range(2))
            )
            for reply in replies:
                assert reply.error is not None and not reply.error.retryable
                assert "-32600: batch too large" in reply.error.message
        finally:
            await rpc.close()

    run(main())


def test_a_client_error_status_is_not_retried(node: FakeNode) -> None:
    node.faults = ["400"]
    rpc = backend_for(node.url)

    async def main() -> None:
        try:
            reply = await call_backend(rpc, R, "eth_chainId", params())
            assert reply.error is not None and not reply.error.retryable
            assert "HTTP 400: injected 400" in reply.error.message
        finally:
            await rpc.close()

    run(main())
    assert node.bodies == [1]


@pytest.mark.parametrize(
    ("operation", "body", "message"),
    [
        (
            "eth_getBalance",
            {"chain": "base", "params": []},
            "no endpoints are configured for chain 'base' (configured: eth",
        ),
        ("eth_getBalance", {"chain": "eth", "params": "x"}, "'params' must be a list"),
        ("eth_getBalance", ["eth"], "params must be {'chain': str, 'params': list}"),
        ("eth_getBalance", {"chain": "eth", "foo": 1}, "unknown parameter 'foo'"),
        ("eth getBalance", {"chain": "eth"}, "is not a JSON-RPC method name"),
    ],
)
def test_bad_requests_are_refused(operation: str, body: Any, message: str) -> None:
    rpc = RpcBackend(RpcConfig(endpoints={"eth": ["http://127.0.0.1:1/"]}))
    with pytest.raises(IORequestError, match=message.replace("(", r"\(").replace("[", r"\[")):
        rpc.prepare(R, operation, body, None)


def test_through_a_task_scope_identical_reads_share_one_request_and_are_cached(
    node: FakeNode,
) -> None:
    config = load_io_config({"rpc": {"endpoints": {"eth": [node.url]}}}, env={})

    async def main() -> None:
        async with IOSubsystem(config) as io:
            scope = io.task_scope("t")
            read = payload("rpc", "eth_getBalance", params(BOB, hex(101)))
            pending = [scope.handle_io("t", f"c{i}", read, None) for i in range(20)]
            other = scope.handle_io(
                "t", "x", payload("rpc", "eth_getBalance", params(ALICE, hex(101))), None
            )
            results = [ok(await answer(p)) for p in pending]
            assert set(results) == {hex(balance(BOB, 101))}
            await answer(other)
            assert type(scope.handle_io("t", "y", read, None)) is IOResult
            # eth_blockNumber moves: joined while in flight, never cached
            number = payload("rpc", "eth_blockNumber", params())
            a = scope.handle_io("t", "n1", number, None)
            b = scope.handle_io("t", "n2", number, None)
            assert scope.stats.operation("rpc", "eth_blockNumber").singleflight_joins == 1
            assert await answer(a) == await answer(b)
            assert type(scope.handle_io("t", "n3", number, None)) is not IOResult

    run(main())
    assert node.bodies[0] == 2  # BOB once (19 joined) + ALICE, in one batch


def test_a_read_nobody_waits_for_stops_retrying_at_its_next_try(node: FakeNode) -> None:
    """A node that keeps failing: the read retries every ~100 ms. Once its only waiter
    leaves (the worker cancels its future: the call's budget ran out), the scope
    cancels the backend call and the client sends no further try."""
    node.faults = ["503"] * 50
    config = load_io_config(
        {
            "rpc": {
                "endpoints": {"eth": [node.url]},
                "max_attempts": 50,
                "backoff_base_ms": 100,
                "backoff_max_ms": 100,
            }
        },
        env={},
    )

    async def main() -> None:
        async with IOSubsystem(config) as io:
            scope = io.task_scope("t")
            waiter = scope.handle_io("t", "c", payload("rpc", "eth_chainId", params()), None)
            await asyncio.sleep(0.35)
            tries = len(node.bodies)
            assert tries >= 2
            assert waiter.cancel()
            await asyncio.sleep(0.5)  # ~5 more tries, had it gone on
            assert len(node.bodies) <= tries + 1  # at most the one already on its way
            assert scope.stats.operation("rpc", "eth_chainId").abandoned == 1

    run(main())


def test_a_batch_nobody_waits_for_stops_its_http_request_at_once(node: FakeNode) -> None:
    """A node that hangs: once every request of a batch was cancelled, the batch's HTTP
    request is dropped then, not when its timeout (10 s here) ends it."""
    node.faults = ["hang"]
    node.hang_s = 5.0
    rpc = backend_for(node.url, timeout_s=10.0, max_attempts=1)

    async def main() -> None:
        try:
            prepared = [
                rpc.prepare(R, "eth_getBalance", params(who, "latest"), None)
                for who in (ALICE, BOB)
            ]
            futures = [rpc.execute(p) for p in prepared]
            await asyncio.sleep(0.3)
            (client,) = rpc._chains.values()
            (task,) = client._tasks
            assert len(node.bodies) == 1 and not task.done()  # one batch, on its way
            futures[0].cancel()
            await asyncio.sleep(0.05)
            assert not task.done()  # BOB still waits for it
            futures[1].cancel()
            await asyncio.sleep(0.05)
            assert task.cancelled() and not client._tasks
        finally:
            await rpc.close()

    run(main())


@pytest.mark.parametrize("rate", [None, 1000.0])
def test_a_batch_leaves_in_the_loop_turn_that_flushes_it(
    node: FakeNode, rate: float | None
) -> None:
    """With a kept-alive connection free and no rate limit, the flush writes the batch
    itself (its task only reads the answer); a rate-limited chain's batches wait for
    their task, which takes their tokens."""
    rpc = backend_for(node.url, **({} if rate is None else {"max_requests_per_s": rate}))

    async def main() -> None:
        try:
            first = await call_backend(rpc, R, "eth_getBalance", params(ALICE, hex(105)))
            assert first.error is None  # a kept-alive connection is idle now
            futures = [
                rpc.execute(rpc.prepare(R, "eth_getBalance", params(who, hex(105)), None))
                for who in (ALICE, BOB)
            ]
            assert rpc.stats.http_requests == 1
            await asyncio.sleep(0)  # the flush's turn
            assert rpc.stats.http_requests == (2 if rate is None else 1)
            replies = await asyncio.gather(*futures)
            assert [int(r.result, 16) for r in replies] == [
                balance(ALICE, 105),
                balance(BOB, 105),
            ]
            assert rpc.stats.http_requests == 2 and rpc.stats.retries == 0
            assert rpc.session().open_connections() == 1  # the same connection throughout
        finally:
            await rpc.close()

    run(main())
    assert node.bodies == [1, 2]


def test_a_written_batch_nobody_waits_for_leaves_no_connection_behind(node: FakeNode) -> None:
    """A batch the flush wrote, whose reads are all cancelled at once: its connection (a
    request on it, unanswered) is closed, never put back in the pool, and the next
    read gets a fresh one."""
    rpc = backend_for(node.url, timeout_s=10.0, max_attempts=1)

    async def main() -> None:
        try:
            first = await call_backend(rpc, R, "eth_getBalance", params(ALICE, hex(105)))
            assert first.error is None
            node.faults = ["hang"]
            node.hang_s = 5.0
            futures = [
                rpc.execute(rpc.prepare(R, "eth_getBalance", params(who, hex(105)), None))
                for who in (ALICE, BOB)
            ]
            await asyncio.sleep(0)  # flushed: written on the idle connection
            assert rpc.stats.http_requests == 2
            (client,) = rpc._chains.values()
            (task,) = client._tasks
            for future in futures:
                future.cancel()
            await asyncio.sleep(0.05)
            assert task.cancelled() and not client._tasks
            assert rpc.session().open_connections() == 0
            again = await call_backend(rpc, R, "eth_getBalance", params(BOB, hex(106)))
            assert int(again.result, 16) == balance(BOB, 106)
        finally:
            await rpc.close()

    run(main())
