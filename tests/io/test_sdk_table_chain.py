"""The user SDK (``blockx.db.Table``, ``blockx.chain.ChainState``) through the provider seam.

Two providers: :class:`RecordingProvider` checks the requests the SDK makes;
:class:`LoopProvider` carries them, as the executor would (JSON on the way,
``io_error`` raised as ``RemoteIOError``), to a real :class:`IOSubsystem` on a
background event loop: real SQLite tables and the real JSON-RPC node.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import orjson
import pytest
from io_support import payload
from jsonrpc_node import (
    ALICE,
    BOB,
    CONTRACT,
    CONTRACT_CODE,
    LATEST_BLOCK,
    FakeNode,
    balance,
    block_hash,
)

from blockx import chain as chain_module
from blockx.chain import ChainState, ChainStateError, hex_quantity
from blockx.db import Table, TableError
from blockx.executor.sdk_bridge import RemoteIOError, io_error_class
from blockx.sdk import NoProviderError, Provider, reset_provider, rpc, set_provider
from blockx.wire import keys
from blockx.worker.io.config import load_io_config
from blockx.worker.io.handler import IOResult
from blockx.worker.io.registry import IOSubsystem


class RecordingProvider:
    """Records each request; answers from ``answers`` (by operation) or None."""

    def __init__(self, answers: Mapping[str, Any] | None = None) -> None:
        self.requests: list[tuple[str, str, str, Any, str | None]] = []
        self.answers = dict(answers or {})

    def read_req(
        self,
        backend: str,
        operation: str,
        params: Mapping[str, Any],
        *,
        cache_key: str | None = None,
    ) -> Any:
        self.requests.append(("read", backend, operation, params, cache_key))
        return self.answers.get(operation)

    def write_req(self, backend: str, operation: str, params: Mapping[str, Any]) -> Any:
        self.requests.append(("write", backend, operation, params, None))
        return self.answers.get(operation)

    def capability_req(
        self, backend: str, operation: str, params: Mapping[str, Any], *, cache_key: str = ""
    ) -> Any:
        raise AssertionError("not used by the SDK classes")

    def subcall(self, function_id: str, args: Any) -> Any:
        raise AssertionError("not used")

    def sleep(self, seconds: float) -> None:
        raise AssertionError("not used")


class LoopProvider(RecordingProvider):
    """Serves requests with a real IOSubsystem scope on a background loop (see module doc)."""

    def __init__(self, io_config: Any) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.io = IOSubsystem(io_config)
        self.scope = self.io.task_scope("sdk-task")

    def _io(
        self, io_kind: str, backend: str, operation: str, params: Any, cache_key: str | None
    ) -> Any:
        # the wire: params travel as JSON
        sent = orjson.loads(orjson.dumps(params))
        body = payload(backend, operation, sent, io_kind=io_kind, cache_key=cache_key)

        async def serve() -> IOResult:
            returned = self.scope.handle_io("sdk-task", "c1", body, None)
            return returned if type(returned) is IOResult else await returned

        result = asyncio.run_coroutine_threadsafe(serve(), self.loop).result(30)
        if result.error is not None:
            error = result.error
            raise io_error_class(error.kind)(error.kind, error.message, error.retryable)
        return orjson.loads(orjson.dumps(result.result))

    def read_req(
        self,
        backend: str,
        operation: str,
        params: Mapping[str, Any],
        *,
        cache_key: str | None = None,
    ) -> Any:
        self.requests.append(("read", backend, operation, params, cache_key))
        return self._io(keys.IO_READ, backend, operation, params, cache_key)

    def write_req(self, backend: str, operation: str, params: Mapping[str, Any]) -> Any:
        self.requests.append(("write", backend, operation, params, None))
        return self._io(keys.IO_WRITE, backend, operation, params, None)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.io.close(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def installed(provider: Provider) -> Iterator[Provider]:
    token = set_provider(provider)
    try:
        yield provider
    finally:
        reset_provider(token)


@pytest.fixture
def recording() -> Iterator[RecordingProvider]:
    yield from installed(RecordingProvider())  # type: ignore[misc]


@pytest.fixture
def live(tmp_path: Any, node: FakeNode) -> Iterator[LoopProvider]:
    config = load_io_config(
        {
            "blockdb": {"sqlite_path": str(tmp_path / "sdk.sqlite3")},
            "rpc": {"endpoints": {"eth": [node.url]}},
        },
        env={},
    )
    provider = LoopProvider(config)
    try:
        yield from installed(provider)  # type: ignore[misc]
    finally:
        provider.close()


# --- Table: the requests it makes ----------------------------------------------------------------


def test_table_reads_carry_canonical_cache_keys(recording: RecordingProvider) -> None:
    recording.answers = {"scan": [[1, {"key": 1}]]}
    t = Table("prices")
    t.get_row("eth")
    t.get_rows(["eth", ["a", 1]])
    assert t.scan(prefix="e", limit=10) == [(1, {"key": 1})]
    kinds = [(r[0], r[1], r[2]) for r in recording.requests]
    assert kinds == [
        ("read", "blockdb", "get_row"),
        ("read", "blockdb", "get_rows"),
        ("read", "blockdb", "scan"),
    ]
    _, _, _, params, cache_key = recording.requests[0]
    assert params == {"table": "prices", "key": "eth"}
    assert cache_key == '{"key":"eth","table":"prices"}'
    assert recording.requests[2][3] == {"table": "prices", "prefix": "e", "limit": 10}


def test_table_writes_are_writes(recording: RecordingProvider) -> None:
    recording.answers = {"upsert_rows": 2, "delete_rows": 1}
    t = Table("prices")
    assert t.upsert_rows([{"key": "a"}, {"key": "b"}]) == 2
    assert t.upsert_rows([{"sym": "a", "n": 1}], key_field=["sym", "n"]) == 2
    assert t.delete_rows(["a"]) == 1
    assert [(r[0], r[2]) for r in recording.requests] == [
        ("write", "upsert_rows"),
        ("write", "upsert_rows"),
        ("write", "delete_rows"),
    ]
    assert recording.requests[1][3]["key_field"] == ["sym", "n"]
    assert "key_field" not in recording.requests[0][3]
    # nothing to do: no request
    assert t.upsert_rows([]) == 0 and t.delete_rows([]) == 0 and t.get_rows([]) == []
    assert len(recording.requests) == 3


@pytest.mark.parametrize(
    ("action", "message"),
    [
        (lambda: Table("Prices"), "bad table name 'Prices' (use 'prices')"),
        (lambda: Table(3), "bad table name of type int"),
        (
            lambda: Table("prices").get_row({"a": 1}),
            "table 'prices': key must be str, int or a list of them (composite key), got dict",
        ),
        (lambda: Table("prices").get_row(1.5), "got float"),
        (
            lambda: Table("prices").get_row(True),
            "key must be str, int or a list of them (composite key), got bool",
        ),
        (lambda: Table("prices").get_row(""), "key must not be an empty string"),
        (lambda: Table("prices").get_row(2**64), "outside the signed 64-bit range"),
        (lambda: Table("prices").get_rows("abc"), "keys must be a list of keys, got str"),
        (lambda: Table("prices").scan(limit=0), "limit must be an int from 1 to 10000"),
        (lambda: Table("prices").scan(order="up"), "order must be 'asc' or 'desc'"),
        (lambda: Table("prices").upsert_rows({"key": 1}), "rows must be a list of dicts"),
        (lambda: Table("prices").upsert_rows([{"id": 1}]), "rows[0] has no key field 'key'"),
        (
            lambda: Table("prices").upsert_rows([{"key": [1, {}]}]),
            "rows[0]['key'] part 1 must be str or int, got dict",
        ),
    ],
)
def test_table_misuse_raises_table_error_before_any_request(
    recording: RecordingProvider, action: Any, message: str
) -> None:
    with pytest.raises(TableError) as caught:
        action()
    assert message in str(caught.value)
    assert recording.requests == []


def test_outside_an_executor_the_sdk_says_so() -> None:
    with pytest.raises(NoProviderError, match="only work inside a call run by the BlockX executor"):
        Table("prices").get_row("eth")
    with pytest.raises(NoProviderError):
        ChainState("eth", 1).get_address_balance(ALICE)


# --- ChainState: the requests it makes ------------------------------------------------------------


def test_chain_state_methods_and_conversions(recording: RecordingProvider) -> None:
    recording.answers = {
        "eth_getBalance": "0xde0b6b3a7640000",
        "eth_getTransactionCount": "0x5",
        "eth_getCode": "0x60",
        "eth_getStorageAt": "0x" + "0" * 63 + "1",
        "eth_call": "0x01",
        "eth_getBlockByNumber": {"number": "0x10"},
        "eth_getLogs": [],
    }
    state = ChainState("eth", 19_000_000)
    assert state.get_address_balance(ALICE) == 10**18
    assert state.get_address_nonce(ALICE) == 5
    assert state.get_address_code(CONTRACT) == "0x60"
    assert state.get_storage_at(CONTRACT, 1).endswith("1")
    assert state.call(CONTRACT, b"\x70\xa0\x82\x31", value=5) == "0x01"
    assert state.get_block() == {"number": "0x10"}
    assert state.get_logs({"address": CONTRACT}) == []
    assert state.get_block_number() == 19_000_000
    sent = {r[2]: r[3]["params"] for r in recording.requests}
    block = hex(19_000_000)
    assert sent["eth_getBalance"] == [ALICE, block]
    assert sent["eth_getStorageAt"] == [CONTRACT, "0x1", block]
    assert sent["eth_call"] == [{"to": CONTRACT, "data": "0x70a08231", "value": "0x5"}, block]
    assert sent["eth_getBlockByNumber"] == [block, False]
    assert sent["eth_getLogs"] == [{"address": CONTRACT, "fromBlock": block, "toBlock": block}]
    assert all(r[1] == "rpc" and r[4] for r in recording.requests)  # every read has a cache key


@pytest.mark.parametrize(
    ("action", "message"),
    [
        (lambda: ChainState("", 1), "chain must be a chain name"),
        (lambda: ChainState("eth", -1), "block number must not be negative"),
        (lambda: ChainState("eth", "newest"), "block must be a number, a tag"),
        (
            lambda: ChainState("eth").get_address_balance("0x12"),
            "address must be a 0x-prefixed 20-byte hex address, got '0x12'",
        ),
        (lambda: ChainState("eth").get_storage_at(CONTRACT, -1), "slot must be a non-negative"),
        (lambda: ChainState("eth").call(CONTRACT, "0x1"), "data must be 0x-prefixed hex bytes"),
        (lambda: ChainState("eth").get_logs({"topic": []}), "unknown log filter field 'topic'"),
        (lambda: ChainState("eth").get_block(full_txs=1), "full_txs must be True or False"),
    ],
)
def test_chain_state_misuse_raises_before_any_request(
    recording: RecordingProvider, action: Any, message: str
) -> None:
    with pytest.raises(ChainStateError, match=message.replace("(", r"\(")):
        action()
    assert recording.requests == []


@pytest.mark.parametrize(
    "answer", ["0x", "0x1_0", " 0x1", "-0x1", "0x1g", "1f", 1.5, None, ["0x1"]]
)
def test_a_quantity_read_refuses_an_answer_that_is_not_a_hex_quantity(
    recording: RecordingProvider, answer: Any
) -> None:
    """The balance and nonce reads parse their answer themselves (hex_quantity written
    out): whatever int() would take beyond a 0x hex quantity is refused the same way."""
    recording.answers["eth_getBalance"] = answer
    recording.answers["eth_getTransactionCount"] = answer
    state = ChainState("eth", 19_000_000)
    for read in (state.get_address_balance, state.get_address_nonce):
        with pytest.raises(ChainStateError, match=r"answered .*, not a hex quantity"):
            read(ALICE)


def test_quantity_reads_send_what_rpc_call_sends(recording: RecordingProvider) -> None:
    """Written out without blockx.sdk.rpc.call, a read still sends that call's request:
    backend ``rpc``, the chain and params as an object, the canonical JSON cache key."""
    recording.answers["eth_getBalance"] = "0xA"
    recording.answers["eth_getTransactionCount"] = 3
    state = ChainState("eth", 16)
    assert state.get_address_balance(ALICE) == 10
    assert state.get_address_nonce(ALICE) == 3  # an int answer is taken as it is
    rpc.call("eth", "eth_getBalance", [ALICE, "0x10"], cache_key="k")
    (_, b1, op1, p1, k1), (_, b2, op2, p2, _), (_, b3, op3, p3, _) = recording.requests
    assert (
        (b1, op1, p1)
        == (b3, op3, p3)
        == ("rpc", "eth_getBalance", {"chain": "eth", "params": [ALICE, "0x10"]})
    )
    assert k1 == orjson.dumps(p1, option=orjson.OPT_SORT_KEYS).decode()
    assert (b2, op2, p2["params"]) == ("rpc", "eth_getTransactionCount", [ALICE, "0x10"])
    with pytest.raises(ChainStateError, match="address must be"):
        state.get_address_nonce(123)  # type: ignore[arg-type]


def test_account_reads_remember_only_pure_results_and_stay_bounded(
    recording: RecordingProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The account reads keep each request's cache key and each answer's int per process:
    the same request and answers every time, a bad address refused every time, bounded."""
    monkeypatch.setattr(chain_module, "_READ_MEMO_MAX", 8)
    monkeypatch.setattr(chain_module, "_read_keys", {})
    monkeypatch.setattr(chain_module, "_quantities", {})
    recording.answers["eth_getBalance"] = "0x10"
    at_1, at_2 = ChainState("eth", 1), ChainState("eth", 2)
    for _ in range(3):
        assert at_1.get_address_balance(ALICE) == 16
        assert at_2.get_address_balance(ALICE) == 16
        with pytest.raises(ChainStateError, match="address must be"):
            at_1.get_address_balance(ALICE[:-1] + "g")
    keys_sent = {(r[3]["params"][1], r[4]) for r in recording.requests}
    assert keys_sent == {
        (block, orjson.dumps({"chain": "eth", "params": [ALICE, block]}).decode())
        for block in ("0x1", "0x2")
    }
    recording.answers["eth_getBalance"] = "0x1_0"  # never remembered as a quantity
    with pytest.raises(ChainStateError, match="not a hex quantity"):
        at_1.get_address_balance(ALICE)
    for n in range(20):
        recording.answers["eth_getBalance"] = hex(n)
        assert ChainState("eth", n).get_address_balance(ALICE) == n
    assert len(chain_module._read_keys) <= 8 and len(chain_module._quantities) <= 8


def test_hex_quantity() -> None:
    assert hex_quantity("0x0") == 0 and hex_quantity("0xff") == 255 and hex_quantity(7) == 7
    with pytest.raises(ValueError):
        hex_quantity("ff")


# --- live: the SDK over a real scope, SQLite and the JSON-RPC node ---------------------------------


def test_table_against_a_real_sqlite_store(live: LoopProvider) -> None:
    prices = Table("prices")
    assert prices.get_row("eth") is None
    assert (
        prices.upsert_rows(
            [{"key": "eth", "usd": 3000}, {"key": "btc", "usd": 60000}, {"key": 7, "usd": 1}]
        )
        == 3
    )
    assert prices.get_row("eth") == {"key": "eth", "usd": 3000}  # the write invalidated
    assert prices.get_rows(["btc", "nope", 7]) == [
        {"key": "btc", "usd": 60000},
        None,
        {"key": 7, "usd": 1},
    ]
    assert prices.scan() == [
        (7, {"key": 7, "usd": 1}),
        ("btc", {"key": "btc", "usd": 60000}),
        ("eth", {"key": "eth", "usd": 3000}),
    ]
    assert [k for k, _ in prices.iter_scan(page_size=2)] == [7, "btc", "eth"]
    assert prices.delete_rows(["btc", "zzz"]) == 1
    assert prices.get_row("btc") is None
    stats = live.scope.stats.operation("blockdb", "get_row")
    assert stats.requests == 3 and stats.backend_calls == 3  # every read followed a write
    prices.get_row("eth")
    prices.get_row("eth")
    assert (stats.backend_calls, stats.cache_hits) == (4, 1)


def test_store_errors_surface_as_remote_io_errors(live: LoopProvider) -> None:
    # a read bypassing Table's checks: the backend refuses it with io_error
    from blockx.sdk import db

    with pytest.raises(RemoteIOError) as caught:
        db.read("get_row", {"table": "Prices", "key": 1})
    assert caught.value.kind == "io_error" and not caught.value.retryable
    assert "bad table name 'Prices' (use 'prices')" in caught.value.message


def test_chain_state_against_the_json_rpc_node(live: LoopProvider, node: FakeNode) -> None:
    state = ChainState("eth", 105)
    assert state.get_address_balance(ALICE) == balance(ALICE, 105)
    assert state.get_address_nonce(BOB) == 5
    assert state.get_address_code(CONTRACT) == CONTRACT_CODE
    assert state.get_address_code(BOB) == "0x"
    assert int(state.get_storage_at(CONTRACT, 3), 16) == 108
    holder_word = "0x70a08231" + ALICE[2:].rjust(64, "0")
    assert int(state.call(CONTRACT, holder_word), 16) == balance(ALICE, 105)
    block = state.get_block(full_txs=True)
    assert block is not None and block["number"] == hex(105)
    assert block["transactions"][0]["from"] == ALICE
    logs = state.get_logs({"address": CONTRACT})
    assert [log["blockNumber"] for log in logs] == [hex(105)]
    assert len(ChainState("eth", 100).get_logs({"fromBlock": 100, "toBlock": 102})) == 6
    assert ChainState("eth", "latest").get_block_number() == LATEST_BLOCK
    assert ChainState("eth", block_hash(103)).get_block_number() == 103
    assert ChainState("eth", "earliest").get_address_nonce(ALICE) == 0
    with pytest.raises(RemoteIOError, match="JSON-RPC error 3: execution reverted"):
        state.call(CONTRACT, "0xdeadbeef")
    with pytest.raises(RemoteIOError, match="no endpoints are configured for chain 'base'"):
        ChainState("base", 1).get_address_balance(ALICE)
    before = len(node.methods)
    assert state.get_address_balance(ALICE) == balance(ALICE, 105)  # cached in the task
    assert len(node.methods) == before
