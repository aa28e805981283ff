"""``rpc``: Ethereum JSON-RPC over HTTP, to the endpoints configured per chain.

Theory of operation
-------------------
A request is ``backend="rpc"``, ``operation`` = the JSON-RPC method,
``params = {"chain": "eth", "params": [...]}``. :meth:`RpcBackend.prepare`
checks it (the chain must be configured); :meth:`RpcBackend.execute` hands it
to the chain's :class:`_ChainClient` and returns a future — no task per
request.

**Batching.** A chain client collects the requests submitted within one
event-loop turn (``batch_window_ms = 0``; or within that many ms) and sends
them as one JSON-RPC batch (a JSON array) in one HTTP POST, up to
``max_batch`` per batch (a full batch leaves at once). One request alone is
sent as a plain JSON-RPC object. Ids are the positions in the batch;
responses are matched by id, in any order. Every batch is one asyncio task;
when the chain has no ``max_requests_per_s``, nothing holds it and a kept-alive
connection is free, the flush writes the batch itself
(``HttpClient.start_post``) and the task only reads the answer — the batch
leaves in the loop turn that flushed it, not one turn later, when its task first
runs (a read's round trip is a few loop turns, each busy with the frames of
hundreds of calls).

**Retries.** Transient failures — connection errors, a timeout
(``timeout_s`` per HTTP request), HTTP 5xx and 429, a body that is not
JSON-RPC, responses missing from a batch — are retried up to ``max_attempts``
tries in all, each on the chain's next endpoint (round robin), after
``min(backoff_max_ms, backoff_base_ms * 2^(n-1))`` ms ±25% jitter. Only the
requests still unanswered are sent again. When the tries run out, the
requests fail with a retryable ``io_error`` (the call may be retried by the
worker's policy). Other HTTP statuses (400, 401, 404, ...) fail the batch's
requests at once, not retryable.

**Rate limits** (``rate_limit.py``). A chain with ``max_requests_per_s`` has
one token bucket shared by all its batches: each try of a batch of ``n``
requests takes ``n`` tokens and waits until the bucket allows it, and batches
are cut to the bucket's burst (a tenth of a second's worth). The node's own
"slow down" is a transient failure like the others, retried with backoff on
the next endpoint: HTTP 429 or 503 — waiting at least its ``Retry-After``
(seconds or an HTTP date; the whole chain holds its requests until then; one
longer than ``retry_after_max_s`` fails the requests at once, retryable) —
and JSON-RPC errors that mean "too many requests" (codes ``-32005``,
``-32029``, ``-32007``, ``-32090``, ``429``, or a message such as "limit
exceeded", "rate limit", "too many requests"), which leave their requests
unanswered for the next try. :class:`RpcStats` counts ``throttled`` (requests
the node refused so), ``held`` (requests the bucket delayed) and ``held_s``;
each request's :class:`Reply` says whether it was throttled or held
(``Reply.throttled``), which the task's statistics count.

**Errors.** A JSON-RPC error object answers its own request with a
non-retryable ``io_error`` whose message carries the code and message
(``rpc eth eth_call: JSON-RPC error 3: execution reverted``) and its ``data``;
revert data (``0x`` hex) is kept whole up to 4 KiB (``ChainState.call_function``
decodes it) and an ``Error(string)`` reason the node's message lacks is added
(``execution reverted: not enough``). An error object with a null id answering a
whole batch fails every request of it that way.

**Caching.** Answers are cacheable per task except for methods whose answer
moves while a task runs (``eth_blockNumber``, ``eth_gasPrice``, filters, ...)
and requests naming the ``pending`` block; singleflight applies to all reads.
A read at ``latest`` is cached per request (an identical read sees the same
answer; different reads may see different heads): pass a block number for a
consistent snapshot.

**Immutable reads.** A state read at a block number or a block hash, never at
a tag (``eth_getBalance``, ``eth_getTransactionCount``, ``eth_getCode``,
``eth_getStorageAt``, ``eth_call``, ``eth_getProof``, ``eth_getBlockByNumber``,
``eth_getBlockByHash``, ... see :data:`IMMUTABLE_AT_BLOCK`), answers the same
forever: it is marked immutable (:func:`immutable_read`), so the executor keeps
a successful, non-null answer and serves identical reads of the task itself
(docs/protocol.md, ``ResumeCall.immutable``). A ``null`` answer (a block not
there yet) and an error are never kept.

The HTTP client is one :class:`~blockx.worker.io.http_client.HttpClient` (our
own small HTTP/1.1 keep-alive client: at most ``max_connections`` connections
per endpoint host, ``timeout_s`` per HTTP request), created on first use. Within
one try, it sends a request once more on a new connection when the node closed
the kept-alive one before answering (JSON-RPC reads are idempotent); that is not
counted as a retry.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, Final

import msgspec

from blockx.wire import dumps_wire, loads_wire

from .backend import IORequestError, PreparedRequest, Reply
from .config import RpcConfig
from .http_client import HttpClient, HttpClientError, StartedPost
from .rate_limit import TokenBucket, is_rate_limit_error, retry_after_s

__all__ = ["IMMUTABLE_AT_BLOCK", "VOLATILE_METHODS", "RpcBackend", "RpcStats", "immutable_read"]

_log = logging.getLogger("blockx.worker.io.rpc")

BACKEND: Final = "rpc"
_METHOD_RE: Final = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}\Z")
#: Methods whose answers change while a task runs: never cached (still de-duplicated).
VOLATILE_METHODS: Final = frozenset(
    {
        "eth_blockNumber",
        "eth_gasPrice",
        "eth_maxPriorityFeePerGas",
        "eth_feeHistory",
        "eth_blobBaseFee",
        "eth_syncing",
        "eth_newFilter",
        "eth_newBlockFilter",
        "eth_newPendingTransactionFilter",
        "eth_getFilterChanges",
        "eth_getFilterLogs",
        "eth_uninstallFilter",
        "eth_sendRawTransaction",
        "eth_sendTransaction",
        "net_peerCount",
        "txpool_content",
        "txpool_status",
    }
)
_JSON_HEADERS: Final = {
    "Content-Type": "application/json",
    "Accept": "application/json",
    "User-Agent": "blockx",
}
#: How much of an unexpected HTTP body an error message quotes.
_BODY_QUOTE: Final = 200
#: How much revert data (hex characters) an error message keeps whole.
_REVERT_DATA_MAX: Final = 4096
_HEX_DATA_RE: Final = re.compile(r"0x[0-9a-fA-F]*\Z")
#: Statuses whose ``Retry-After`` is honoured.
_RETRY_AFTER_STATUSES: Final = (429, 503)


def revert_reason(data: str) -> str | None:
    """The text of an ``Error(string)`` revert (``0x08c379a0`` + ABI string), else None.
    Decoded by hand: the worker does not import eth-abi."""
    if not data.startswith("0x08c379a0") or len(data) < 10 + 128:
        return None
    try:
        raw = bytes.fromhex(data[10:])
        offset = int.from_bytes(raw[:32], "big")
        length = int.from_bytes(raw[offset : offset + 32], "big")
        text = raw[offset + 32 : offset + 32 + length]
    except ValueError:
        return None
    if offset + 32 + length > len(raw):
        return None
    return text.decode("utf-8", "replace")


class RpcStats:
    """What the client sent: HTTP requests, batches, JSON-RPC requests, retries, and the
    rate limits met: ``throttled`` (requests the node refused as too many), ``held``
    (requests ``max_requests_per_s`` delayed) and ``held_s`` (the delays, summed per batch)."""

    __slots__ = (
        "batches",
        "held",
        "held_s",
        "http_requests",
        "retries",
        "rpc_requests",
        "throttled",
    )

    def __init__(self) -> None:
        self.http_requests = 0
        #: HTTP requests that carried more than one JSON-RPC request.
        self.batches = 0
        self.rpc_requests = 0
        self.retries = 0
        self.throttled = 0
        self.held = 0
        self.held_s = 0.0

    def __repr__(self) -> str:
        return (
            f"RpcStats(http={self.http_requests}, batches={self.batches}, "
            f"rpc={self.rpc_requests}, retries={self.retries}, throttled={self.throttled}, "
            f"held={self.held})"
        )


class _Request:
    __slots__ = ("abandoned", "future", "method", "params", "throttled")

    def __init__(self, method: str, params: list[Any], future: asyncio.Future[Reply]) -> None:
        self.method = method
        self.params = params
        self.future = future
        #: Whether a rate limit (the node's or ours) slowed this request down.
        self.throttled = False
        #: Its batch's cancellation watch (``_ChainClient._flush``), while it has no answer.
        self.abandoned: Callable[[asyncio.Future[Reply]], None] | None = None

    def answer(self, reply: Reply) -> None:
        """Resolve the request (once); a throttled one's reply says so."""
        future = self.future
        if future.done():
            return
        if self.throttled:
            reply = reply.marked_throttled()
        abandoned = self.abandoned
        if abandoned is not None:
            # Only a cancellation needs the watch: answered, its callback would be one
            # more event-loop handle per read, run to find nothing to do.
            self.abandoned = None
            future.remove_done_callback(abandoned)
        future.set_result(reply)


#: Methods whose answer at a fixed block never changes: the index of their block parameter.
IMMUTABLE_AT_BLOCK: Final[Mapping[str, int]] = {
    "eth_getBalance": 1,
    "eth_getTransactionCount": 1,
    "eth_getCode": 1,
    "eth_getStorageAt": 2,
    "eth_call": 1,
    "eth_getProof": 2,
    "eth_getBlockByNumber": 0,
    "eth_getBlockByHash": 0,
    "eth_getBlockTransactionCountByNumber": 0,
    "eth_getBlockTransactionCountByHash": 0,
    "eth_getUncleCountByBlockNumber": 0,
    "eth_getUncleCountByBlockHash": 0,
}
_BLOCK_NUMBER_RE: Final = re.compile(r"0x[0-9a-fA-F]{1,16}\Z")
_BLOCK_HASH_RE: Final = re.compile(r"0x[0-9a-fA-F]{64}\Z")


def _fixed_block(ref: Any) -> bool:
    """Whether ``ref`` names one block for good: a hex number or a block hash, or an
    EIP-1898 object of one (never a tag such as ``latest``)."""
    if type(ref) is str:
        return bool(_BLOCK_NUMBER_RE.match(ref) or _BLOCK_HASH_RE.match(ref))
    if type(ref) is dict:
        block_hash = ref.get("blockHash")
        if block_hash is not None:
            return type(block_hash) is str and bool(_BLOCK_HASH_RE.match(block_hash))
        number = ref.get("blockNumber")
        return type(number) is str and bool(_BLOCK_NUMBER_RE.match(number))
    return False


def immutable_read(method: str, params: list[Any]) -> bool:
    """Whether ``method(*params)`` answers the same forever (module docstring)."""
    index = IMMUTABLE_AT_BLOCK.get(method)
    return index is not None and index < len(params) and _fixed_block(params[index])


def _contains_pending(params: Any) -> bool:
    if params == "pending":
        return True
    if type(params) is list:
        return any(_contains_pending(p) for p in params)
    if type(params) is dict:
        return any(_contains_pending(p) for p in params.values())
    return False


class _ChainClient:
    """Batches, sends and retries the requests of one chain (see the module docstring)."""

    __slots__ = (
        "_current",
        "_flush_handle",
        "_loop",
        "_pending",
        "_tasks",
        "backend",
        "bucket",
        "chain",
        "endpoints",
    )

    def __init__(self, backend: RpcBackend, chain: str, endpoints: tuple[str, ...]) -> None:
        self.backend = backend
        self.chain = chain
        self.endpoints = endpoints
        #: The loop it runs on, kept: ``asyncio.get_running_loop()`` costs a ``getpid``
        #: system call on CPython 3.11 (its fork check), and ``submit`` runs per request.
        self._loop = asyncio.get_running_loop()
        #: ``max_requests_per_s`` and the node's ``Retry-After``, for every batch of the chain.
        self.bucket = TokenBucket(backend.config.rate_of(chain), now=self._loop.time())
        self._current = 0
        self._pending: list[_Request] = []
        self._flush_handle: asyncio.Handle | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def __repr__(self) -> str:
        return (
            f"_ChainClient({self.chain!r}, pending={len(self._pending)}, "
            f"sending={len(self._tasks)})"
        )

    def running_loop(self) -> asyncio.AbstractEventLoop:
        """The running loop: the one kept while it runs (no system call), else asked for."""
        loop = self._loop
        if not loop.is_running():
            loop = self._loop = asyncio.get_running_loop()
        return loop

    def submit(self, method: str, params: list[Any]) -> asyncio.Future[Reply]:
        loop = self.running_loop()
        future: asyncio.Future[Reply] = loop.create_future()
        self._pending.append(_Request(method, params, future))
        config = self.backend.config
        if len(self._pending) >= self.bucket.max_batch(config.max_batch):
            self._flush()
        elif self._flush_handle is None:
            if config.batch_window_ms > 0:
                self._flush_handle = loop.call_later(config.batch_window_ms / 1000, self._flush)
            else:
                self._flush_handle = loop.call_soon(self._flush)
        return future

    def _flush(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        pending, self._pending = self._pending, []
        size = self.bucket.max_batch(self.backend.config.max_batch)
        loop = self.running_loop()
        for start in range(0, len(pending), size):
            batch = pending[start : start + size]
            started = self._start(batch, loop)
            task = loop.create_task(self._send(batch, started))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            if started is not None:
                # A task cancelled before it ran never reads the answer: drop it.
                task.add_done_callback(started[1].abandon)
            abandoned = partial(self._request_done, task, batch)
            for request in batch:
                request.abandoned = abandoned
                request.future.add_done_callback(abandoned)

    @staticmethod
    def _request_done(
        task: asyncio.Task[None], batch: list[_Request], future: asyncio.Future[Reply]
    ) -> None:
        """A request's future is done: when it was cancelled (nobody waits for it any more,
        see TaskIOScope) and so is every other request of its batch, stop the batch now —
        the HTTP request on its way included — rather than at its next try."""
        if future.cancelled() and not task.done() and all(r.future.done() for r in batch):
            task.cancel()

    async def close(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        closed = Reply.failure(f"rpc {self.chain}: the client was closed", retryable=True)
        for request in self._pending:
            request.answer(closed)
        self._pending = []
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # --- one batch, with its retries ------------------------------------------------------------

    def _start(
        self, requests: list[_Request], loop: asyncio.AbstractEventLoop
    ) -> tuple[str, StartedPost] | None:
        """Write the batch's first try now, when it may leave at once: no rate limit, no
        ``Retry-After`` hold, a free slot and kept-alive connection (the URL and the
        started POST); None leaves the whole batch to :meth:`_send`."""
        bucket = self.bucket
        if bucket.rate is not None or bucket.held_for(loop.time()) > 0:
            return None  # tokens to take, or a Retry-After hold: _wait_for_turn's work
        url = self.endpoints[self._current % len(self.endpoints)]
        session = self.backend.session()
        started = session.start_post(url, self._body(requests))
        if started is None:
            return None
        self._count(requests)
        return url, started

    async def _send(
        self, requests: list[_Request], started: tuple[str, StartedPost] | None = None
    ) -> None:
        backend = self.backend
        config = backend.config
        stats = backend.stats
        loop = asyncio.get_running_loop()
        bucket = self.bucket
        attempt = 0
        reason = ""
        try:
            while True:
                first: StartedPost | None = None
                if started is not None:  # written by _flush: its ids are these positions
                    url, first = started
                    started = None
                else:
                    requests = [r for r in requests if not r.future.done()]
                    if not requests:
                        return
                    await self._wait_for_turn(requests)
                    requests = [r for r in requests if not r.future.done()]
                    if not requests:
                        return
                    url = self.endpoints[self._current % len(self.endpoints)]
                attempt += 1
                reason, retry_after = await self._post(url, requests, first)
                if not reason:
                    return
                if reason.startswith("!"):  # permanent: already answered
                    return
                if retry_after is not None and retry_after > config.retry_after_max_s:
                    reason += (
                        f" asking to retry after {retry_after:g}s (more than "
                        f"io.rpc.retry_after_max_s={config.retry_after_max_s:g})"
                    )
                    break
                if attempt >= config.max_attempts:
                    break
                stats.retries += 1
                self._current = (self._current + 1) % len(self.endpoints)
                if retry_after is not None:  # the whole chain waits: see rate_limit.py
                    now = loop.time()
                    bucket.hold_until(now + retry_after, now)
                await asyncio.sleep(backend.backoff_s(attempt))
            failed = Reply.failure(
                f"rpc {self.chain}: {reason} (gave up after {attempt} "
                f"{'try' if attempt == 1 else 'tries'}; endpoints: {', '.join(self.endpoints)})",
                retryable=True,
            )
            for request in requests:
                request.answer(failed)
        except asyncio.CancelledError:
            cancelled = Reply.failure(f"rpc {self.chain}: the client was closed", retryable=True)
            for request in requests:
                request.answer(cancelled)
            raise

    async def _wait_for_turn(self, requests: list[_Request]) -> None:
        """Wait until the chain's bucket lets ``requests`` go (``max_requests_per_s``, and
        the node's latest ``Retry-After``). A hold that came while waiting is waited out
        and the tokens are taken again after it, so batches held together do not leave
        together (the tokens taken before are lost: the error is on the safe side)."""
        bucket = self.bucket
        stats = self.backend.stats
        loop = asyncio.get_running_loop()
        while True:
            delay = bucket.reserve(len(requests), loop.time())
            if delay > 0:
                stats.held += len(requests)
                stats.held_s += delay
                for request in requests:
                    request.throttled = True
                await asyncio.sleep(delay)
            held = bucket.held_for(loop.time())
            if held <= 0:
                return
            for request in requests:  # a Retry-After came while this batch waited
                request.throttled = True
            await asyncio.sleep(held)

    @staticmethod
    def _body(requests: list[_Request]) -> bytes:
        """The JSON-RPC text of one try: a plain object for one request, else a batch
        whose ids are the requests' positions."""
        if len(requests) == 1:
            r = requests[0]
            return dumps_wire({"jsonrpc": "2.0", "id": 0, "method": r.method, "params": r.params})
        return dumps_wire(
            [
                {"jsonrpc": "2.0", "id": i, "method": r.method, "params": r.params}
                for i, r in enumerate(requests)
            ]
        )

    def _count(self, requests: list[_Request]) -> None:
        """Count one try of ``requests`` (an HTTP request; a batch when more than one)."""
        stats = self.backend.stats
        if len(requests) > 1:
            stats.batches += 1
        stats.http_requests += 1
        stats.rpc_requests += len(requests)

    async def _post(
        self, url: str, requests: list[_Request], started: StartedPost | None
    ) -> tuple[str, float | None]:
        """Send ``requests`` once (``started``: already sent by :meth:`_start`); answer
        what can be answered.

        Returns ``""`` when every request got an answer, ``"!..."`` when they were
        failed for good, else the transient reason (the unanswered ones are retried);
        and the node's ``Retry-After`` in seconds (None when it gave none).
        """
        backend = self.backend
        single = len(requests) == 1
        try:
            if started is None:
                body = self._body(requests)
                self._count(requests)
                status, data, retry_after_text = await backend.session().post_answer(url, body)
            else:
                status, data, retry_after_text = await started.client.finish_post(started)
        except TimeoutError:
            return f"{url}: no answer within {backend.config.timeout_s:g}s", None
        except (HttpClientError, OSError) as exc:
            return f"{url}: {type(exc).__name__}: {exc}", None
        if status == 429 or status >= 500:
            retry_after = None
            if status in _RETRY_AFTER_STATUSES:
                retry_after = retry_after_s(retry_after_text, time.time())
            if status == 429:
                self._throttled(requests)
            said = f" (Retry-After: {retry_after_text})" if retry_after is not None else ""
            return f"{url}: HTTP {status}{said}", retry_after
        if status != 200:
            snippet = data[:_BODY_QUOTE].decode("utf-8", "replace")
            failed = Reply.failure(
                f"rpc {self.chain}: {url}: HTTP {status}: {snippet}", retryable=False
            )
            for request in requests:
                request.answer(failed)
            return "!http", None
        try:
            decoded = loads_wire(data)
        except (msgspec.DecodeError, ValueError):
            return f"{url}: the response is not JSON", None
        items: Any
        if type(decoded) is dict:
            if decoded.get("id") is None and "error" in decoded:
                error = decoded["error"]
                if is_rate_limit_error(error):
                    self._throttled(requests)
                    return f"{url}: rate limited: {_error_text(error)}", None
                if not single:
                    reply = self._error_reply(None, error)
                    for request in requests:
                        request.answer(reply)
                    return "!batch-error", None
            items = [decoded]
        elif type(decoded) is list:
            items = decoded
        else:
            return f"{url}: the response is not a JSON-RPC object or batch", None
        share = max(1, len(data) // max(1, len(items)))
        answered = 0
        limited: Any = None
        for item in items:
            if type(item) is not dict:
                continue
            index = item.get("id")
            if type(index) is str and index.isdigit():
                index = int(index)
            if type(index) is not int or not 0 <= index < len(requests):
                continue
            request = requests[index]
            if request.future.done():
                continue
            if "error" in item and item["error"] is not None:
                error = item["error"]
                if is_rate_limit_error(error):
                    self._throttled([request])
                    limited = error
                    continue  # unanswered: tried again
                reply = self._error_reply(request.method, error)
            elif "result" in item:
                reply = Reply(item["result"], nbytes=share)
            else:
                continue
            request.answer(reply)
            answered += 1
        missing = sum(1 for r in requests if not r.future.done())
        if not missing:
            return "", None
        if limited is not None:
            return f"{url}: rate limited: {_error_text(limited)}", None
        return f"{url}: {missing} of {len(requests)} responses missing from the answer", None

    def _throttled(self, requests: list[_Request]) -> None:
        """The node refused ``requests`` as too many: count them, mark their replies."""
        self.backend.stats.throttled += len(requests)
        for request in requests:
            request.throttled = True

    def _error_reply(self, method: str | None, error: Any) -> Reply:
        where = f"rpc {self.chain} {method}" if method else f"rpc {self.chain}"
        if type(error) is dict:
            code = error.get("code")
            message = error.get("message")
            data = error.get("data")
            if type(data) is dict and type(data.get("data")) is str:  # some nodes nest it
                data = data["data"]
            if type(data) is str and _HEX_DATA_RE.match(data):
                reason = revert_reason(data)
                if reason is not None and type(message) is str and reason not in message:
                    message = f"{message}: {reason}"
                quoted = data if len(data) <= _REVERT_DATA_MAX else data[:_REVERT_DATA_MAX] + "..."
            elif data is not None:
                quoted = str(data)[:_BODY_QUOTE]
            text = f"{where}: JSON-RPC error {code}: {message}"
            if data is not None:
                text += f" (data: {quoted})"
        else:
            text = f"{where}: JSON-RPC error: {str(error)[:_BODY_QUOTE]}"
        return Reply.failure(text, retryable=False)


def _error_text(error: Any) -> str:
    if type(error) is dict:
        return f"JSON-RPC error {error.get('code')}: {str(error.get('message'))[:_BODY_QUOTE]}"
    return str(error)[:_BODY_QUOTE]


class RpcBackend:
    """The ``rpc`` :class:`~blockx.worker.io.backend.IOBackend` (see the module docstring)."""

    __slots__ = ("_chains", "_rng", "_session", "config", "stats")

    name = BACKEND

    def __init__(
        self,
        config: RpcConfig | None = None,
        *,
        rng: random.Random | None = None,
        endpoints: Mapping[str, Any] | None = None,
    ) -> None:
        if config is None:
            config = RpcConfig(endpoints=dict(endpoints or {}))
        elif endpoints is not None:
            raise TypeError("pass endpoints in the RpcConfig or alone, not both")
        self.config = config
        self.stats = RpcStats()
        self._rng = rng or random.Random()
        self._session: HttpClient | None = None
        self._chains: dict[str, _ChainClient] = {}

    def __repr__(self) -> str:
        return f"RpcBackend(chains={sorted(self.config.endpoints)}, {self.stats!r})"

    @property
    def chains(self) -> list[str]:
        return sorted(self.config.endpoints)

    def session(self) -> HttpClient:
        """The shared HTTP client, created on first use (on the running loop)."""
        session = self._session
        if session is None or session.closed:
            session = self._session = HttpClient(
                max_connections=self.config.max_connections,
                timeout_s=self.config.timeout_s,
                headers=_JSON_HEADERS,
            )
        return session

    def backoff_s(self, attempt: int) -> float:
        config = self.config
        delay_ms = min(config.backoff_max_ms, config.backoff_base_ms * (2 ** (attempt - 1)))
        return float(delay_ms * self._rng.uniform(0.75, 1.25) / 1000.0)

    def prepare(
        self, io_kind: str, operation: str, params: Any, sidecar: bytes | None
    ) -> PreparedRequest:
        if not _METHOD_RE.match(operation):
            raise IORequestError(f"rpc: {operation!r} is not a JSON-RPC method name")
        if sidecar is not None:
            raise IORequestError(
                f"rpc {operation}: send params {{'chain': ..., 'params': [...]}}, not a sidecar"
            )
        if type(params) is not dict:
            raise IORequestError(
                f"rpc {operation}: params must be {{'chain': str, 'params': list}}, "
                f"got {type(params).__name__}"
            )
        # Only "chain" and "params" (keys are distinct: the count says it, no loop).
        if len(params) != ("chain" in params) + ("params" in params):
            unknown = [k for k in params if k not in ("chain", "params")]
            raise IORequestError(
                f"rpc {operation}: unknown parameter {unknown[0]!r} (expected: chain, params)"
            )
        chain = params.get("chain")
        if type(chain) is not str:
            raise IORequestError(f"rpc {operation}: 'chain' must be a chain name (str)")
        if chain not in self.config.endpoints:
            configured = ", ".join(self.chains) or "none"
            raise IORequestError(
                f"rpc {operation}: no endpoints are configured for chain {chain!r} "
                f"(configured: {configured}; set io.rpc.endpoints or RPC_ENDPOINTS)"
            )
        method_params = params.get("params")
        if method_params is None:
            method_params = []
        if type(method_params) is not list:
            raise IORequestError(
                f"rpc {operation}: 'params' must be a list (positional JSON-RPC params)"
            )
        # A read at a fixed block is cacheable (none of those methods is volatile, and the
        # block it names is not "pending"): the walk looking for "pending" is skipped.
        immutable = immutable_read(operation, method_params)
        cacheable = immutable or (
            operation not in VOLATILE_METHODS and not _contains_pending(method_params)
        )
        return PreparedRequest(
            operation,
            (chain, method_params),
            domain=chain,
            cacheable=cacheable,
            immutable=immutable,
        )

    def execute(self, request: PreparedRequest) -> asyncio.Future[Reply]:
        chain, method_params = request.body
        client = self._chains.get(chain)
        if client is None:
            client = self._chains[chain] = _ChainClient(self, chain, self.config.endpoints[chain])
        return client.submit(request.operation, method_params)

    async def close(self) -> None:
        for client in list(self._chains.values()):
            await client.close()
        self._chains.clear()
        session, self._session = self._session, None
        if session is not None and not session.closed:
            await session.close()
