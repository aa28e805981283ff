"""The ``blockdb`` operations and their semantics, identical on SQLite and PostgreSQL.

Every test runs twice (``engine_config``): on a real SQLite file and on a real
PostgreSQL server started for the session.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import pytest
from io_support import call_backend, run

from blockx.wire import keys
from blockx.worker.io.backend import IORequestError, Reply
from blockx.worker.io.blockdb import decode_key, encode_key
from blockx.worker.io.config import load_io_config
from blockx.worker.io.registry import make_blockdb_backend

R, W = keys.IO_READ, keys.IO_WRITE

Op = Callable[..., Awaitable[Any]]


def scenario(engine_config: dict[str, Any], body: Callable[[Op], Awaitable[None]]) -> None:
    """Run ``body(op)`` against a fresh backend; ``op(operation, **params)`` returns the result
    (raising AssertionError on an error reply)."""
    config = load_io_config({"blockdb": engine_config}, env={})

    async def main() -> None:
        backend = make_blockdb_backend(config)
        try:

            async def op(operation: str, **params: Any) -> Any:
                kind = W if operation in ("upsert_rows", "delete_rows") else R
                reply: Reply = await call_backend(backend, kind, operation, params)
                assert reply.error is None, reply.error
                return reply.result

            await body(op)
        finally:
            await backend.close()

    run(main())


def test_reads_of_a_missing_table_find_nothing(engine_config: dict[str, Any]) -> None:
    async def body(op: Op) -> None:
        assert await op("get_row", table="nothing_here", key="a") is None
        assert await op("get_rows", table="nothing_here", keys=["a", 1]) == [None, None]
        assert await op("scan", table="nothing_here") == []
        assert await op("delete_rows", table="nothing_here", keys=["a"]) == 0
        # ...and they did not create it
        assert await op("scan", table="nothing_here") == []

    scenario(engine_config, body)


def test_upsert_then_read_back(engine_config: dict[str, Any]) -> None:
    async def body(op: Op) -> None:
        rows = [{"key": "eth", "usd": 3000.5, "tags": ["l1"]}, {"key": "btc", "usd": 60000}]
        assert await op("upsert_rows", table="prices", rows=rows) == 2
        assert await op("get_row", table="prices", key="eth") == rows[0]
        assert await op("get_rows", table="prices", keys=["btc", "doge", "eth", "btc"]) == [
            rows[1],
            None,
            rows[0],
            rows[1],
        ]
        # replace
        assert await op("upsert_rows", table="prices", rows=[{"key": "eth", "usd": 1}]) == 1
        assert await op("get_row", table="prices", key="eth") == {"key": "eth", "usd": 1}

    scenario(engine_config, body)


def test_upsert_duplicate_keys_last_wins_and_counts_distinct(engine_config: dict[str, Any]) -> None:
    async def body(op: Op) -> None:
        rows = [{"key": "a", "v": 1}, {"key": "b", "v": 2}, {"key": "a", "v": 3}]
        assert await op("upsert_rows", table="dups", rows=rows) == 2
        assert await op("get_row", table="dups", key="a") == {"key": "a", "v": 3}

    scenario(engine_config, body)


def test_custom_and_composite_key_fields(engine_config: dict[str, Any]) -> None:
    async def body(op: Op) -> None:
        await op(
            "upsert_rows",
            table="tokens",
            key_field="symbol",
            rows=[{"symbol": "USDC", "decimals": 6}],
        )
        assert await op("get_row", table="tokens", key="USDC") == {"symbol": "USDC", "decimals": 6}
        rows = [
            {"chain": "eth", "block": 19, "h": "x"},
            {"chain": "eth", "block": 20, "h": "y"},
            {"chain": "arb", "block": 5, "h": "z"},
        ]
        assert await op("upsert_rows", table="heads", rows=rows, key_field=["chain", "block"]) == 3
        assert await op("get_row", table="heads", key=["eth", 20]) == rows[1]
        assert await op("scan", table="heads", prefix=["eth"]) == [
            [["eth", 19], rows[0]],
            [["eth", 20], rows[1]],
        ]

    scenario(engine_config, body)


def test_key_order_ints_before_strings_numeric_and_code_point(
    engine_config: dict[str, Any],
) -> None:
    keys_ = [10, -5, 2**63 - 1, -(2**63), 0, 9, "b", "a", "B", "é", "z", "😀", "a b", "ab"]

    async def body(op: Op) -> None:
        await op("upsert_rows", table="ordered", rows=[{"key": k} for k in keys_])
        scanned = [k for k, _ in await op("scan", table="ordered")]
        ints = sorted(k for k in keys_ if type(k) is int)
        strs = sorted(k for k in keys_ if type(k) is str)  # Python sorts str by code point
        assert scanned == ints + strs
        desc = [k for k, _ in await op("scan", table="ordered", order="desc")]
        assert desc == list(reversed(ints + strs))

    scenario(engine_config, body)


def test_composite_keys_order_part_by_part(engine_config: dict[str, Any]) -> None:
    keys_ = [["a", 2], ["a", 10], ["a"], ["ab", 1], ["a", "x"], ["a", 2, "z"], "a"]

    async def body(op: Op) -> None:
        rows = [{"k": k, "i": i} for i, k in enumerate(keys_)]
        # ["a"] and "a" are the same key: the later row wins
        assert await op("upsert_rows", table="composite", rows=rows, key_field="k") == 6
        scanned = [k for k, _ in await op("scan", table="composite")]
        assert scanned == ["a", ["a", 2], ["a", 2, "z"], ["a", 10], ["a", "x"], ["ab", 1]]
        assert (await op("get_row", table="composite", key=["a"]))["i"] == 6

    scenario(engine_config, body)


def test_scan_prefix_bounds_after_limit(engine_config: dict[str, Any]) -> None:
    names = ["eth:a", "eth:b", "eth:c", "etha", "eti", "et", "btc:a", 5]

    async def body(op: Op) -> None:
        await op("upsert_rows", table="s", rows=[{"key": k} for k in names])

        async def scan(**kw: Any) -> list[Any]:
            return [k for k, _ in await op("scan", table="s", **kw)]

        assert await scan(prefix="eth:") == ["eth:a", "eth:b", "eth:c"]
        assert await scan(prefix="eth") == ["eth:a", "eth:b", "eth:c", "etha"]
        assert await scan(prefix="") == [5, "btc:a", "et", "eth:a", "eth:b", "eth:c", "etha", "eti"]
        assert await scan(start="eth:b", end="eti") == ["eth:b", "eth:c", "etha"]
        assert await scan(after="eth:b", limit=2) == ["eth:c", "etha"]
        assert await scan(prefix="eth:", order="desc", limit=2) == ["eth:c", "eth:b"]
        assert await scan(start=0, end="a") == [5]
        assert await scan(prefix="eth:", start="eth:b", after="eth:b") == ["eth:c"]
        assert await scan(prefix="\U0010ffff") == []
        assert await scan(limit=1) == [5]

    scenario(engine_config, body)


def test_delete_rows_counts_existing(engine_config: dict[str, Any]) -> None:
    async def body(op: Op) -> None:
        await op("upsert_rows", table="d", rows=[{"key": i} for i in range(5)])
        assert await op("delete_rows", table="d", keys=[1, 3, 3, 99]) == 2
        assert [k for k, _ in await op("scan", table="d")] == [0, 2, 4]

    scenario(engine_config, body)


def test_rows_round_trip_exactly(engine_config: dict[str, Any]) -> None:
    row = {
        "key": "r",
        "big": 2**200,
        "neg": -(2**70),
        "f": 0.1,
        "s": 'ü\u0000\n"',
        "n": None,
        "nested": {"z": 1, "a": [1, {"b": True}]},
        "empty": {},
    }

    async def body(op: Op) -> None:
        await op("upsert_rows", table="exact", rows=[row])
        got = await op("get_row", table="exact", key="r")
        assert got == row
        assert list(got["nested"]) == ["z", "a"]  # key order kept (rows are TEXT, not JSONB)

    scenario(engine_config, body)


def test_many_keys_and_rows_in_one_request(engine_config: dict[str, Any]) -> None:
    async def body(op: Op) -> None:
        rows = [{"key": i, "v": i * i} for i in range(2500)]
        assert await op("upsert_rows", table="bulk", rows=rows) == 2500
        got = await op("get_rows", table="bulk", keys=list(range(0, 3000, 3)))
        assert got == [rows[i] if i < 2500 else None for i in range(0, 3000, 3)]
        assert len(await op("scan", table="bulk", limit=10000)) == 2500
        assert await op("delete_rows", table="bulk", keys=list(range(1200))) == 1200

    scenario(engine_config, body)


def test_params_may_travel_as_a_sidecar(engine_config: dict[str, Any]) -> None:
    config = load_io_config({"blockdb": engine_config}, env={})

    async def main() -> None:
        backend = make_blockdb_backend(config)
        try:
            body = orjson.dumps({"table": "side", "rows": [{"key": "a", "v": 1}]})
            reply = await call_backend(backend, W, "upsert_rows", None, body)
            assert reply.result == 1
            reply = await call_backend(backend, R, "get_row", None, b'{"table":"side","key":"a"}')
            assert reply.result == {"key": "a", "v": 1}
        finally:
            await backend.close()

    run(main())


@pytest.mark.parametrize(
    ("kind", "operation", "params", "message"),
    [
        (R, "get_row", {"table": "Prices", "key": "a"}, "bad table name 'Prices' (use 'prices')"),
        (R, "get_row", {"table": "1abc", "key": "a"}, "bad table name '1abc'"),
        (R, "get_row", {"table": "a-b", "key": "a"}, "bad table name 'a-b'"),
        (R, "get_row", {"table": "x" * 48, "key": "a"}, "bad table name"),
        (R, "get_row", {"table": 5, "key": "a"}, "'table' must be a table name (str), got int"),
        (
            R,
            "get_row",
            {"table": "t", "key": {"a": 1}},
            "table 't': key must be str, int or a list of them (composite key), got dict",
        ),
        (R, "get_row", {"table": "t", "key": True}, "got bool"),
        (R, "get_row", {"table": "t", "key": 2**63}, "outside the signed 64-bit range"),
        (R, "get_row", {"table": "t", "key": "a\nb"}, "control characters"),
        (R, "get_row", {"table": "t", "key": ["a", ""]}, "key part 1 must not be an empty string"),
        (R, "get_row", {"table": "t", "key": "x" * 1025}, "the limit is 1024"),
        (R, "get_row", {"table": "t", "key": list(range(9))}, "1 to 8 parts, got 9"),
        (R, "get_row", {"table": "t", "key": [1, [2]]}, "key part 1 must be str or int, got list"),
        (R, "get_row", {"table": "t"}, "get_row needs 'key'"),
        (R, "get_row", {"table": "t", "key": "a", "keyy": 1}, "unknown parameter 'keyy'"),
        (R, "get_rows", {"table": "t", "keys": "abc"}, "keys must be a list of keys, got str"),
        (R, "get_rows", {"table": "t", "keys": list(range(10001))}, "at most 10000 keys"),
        (R, "scan", {"table": "t", "limit": 0}, "limit must be an int from 1 to 10000"),
        (R, "scan", {"table": "t", "order": "up"}, "order must be 'asc' or 'desc'"),
        (R, "scan", {"table": "t", "prefix": 5}, "prefix must be a str or a list of key parts"),
        (W, "upsert_rows", {"table": "t", "rows": {"key": 1}}, "rows must be a list of objects"),
        (W, "upsert_rows", {"table": "t", "rows": [{"id": 1}]}, "rows[0] has no key field 'key'"),
        (
            W,
            "upsert_rows",
            {"table": "t", "rows": [[1]]},
            "rows[0] must be an object (dict), got list",
        ),
        (
            W,
            "upsert_rows",
            {"table": "t", "rows": [{"key": 1.5}]},
            "rows[0]['key'] must be str, int or a list of them (composite key), got float",
        ),
        (
            W,
            "upsert_rows",
            {"table": "t", "rows": [], "key_field": 3},
            "key_field must be a field name",
        ),
        (R, "upsert_rows", {"table": "t", "rows": []}, "is a write: send it with ioKind 'write'"),
        (W, "get_row", {"table": "t", "key": 1}, "is a read: send it with ioKind 'read'"),
        (R, "drop_table", {"table": "t"}, "blockdb has no operation 'drop_table'"),
        (R, "get_row", ["t", 1], "params must be an object with table, key, got list"),
    ],
)
def test_bad_requests_are_refused_with_a_clear_message(
    tmp_path: Any, kind: str, operation: str, params: Any, message: str
) -> None:
    """Checked before any engine is involved: one engine is enough."""
    config = load_io_config({"blockdb": {"sqlite_path": str(tmp_path / "x.sqlite3")}}, env={})
    backend = make_blockdb_backend(config)
    with pytest.raises(IORequestError) as caught:
        backend.prepare(kind, operation, params, None)
    assert message in caught.value.message
    assert caught.value.message.startswith("blockdb ")
    assert not caught.value.retryable
    assert not (tmp_path / "x.sqlite3").exists()


def test_key_encoding_round_trips_and_orders() -> None:
    samples = [-(2**63), -1, 0, 1, 2**63 - 1, "a", "é", ["a", 1], ["a", -1, "b"], [0]]
    for key in samples:
        decoded = decode_key(encode_key(key))
        assert decoded == (key[0] if isinstance(key, list) and len(key) == 1 else key)
    ints = [-(2**63), -7, 0, 3, 10, 2**63 - 1]
    assert sorted(ints, key=encode_key) == ints


def test_int_keys_are_stored_exactly_as_the_column_format_says() -> None:
    """``\x1e`` + the 20-digit zero-padded ``n + 2**63``: the text already in users'
    tables, whatever way the encoder computes it."""
    edges = [-(2**63), -(2**63) + 1, -1, 0, 1, 10**18, 2**63 - 10**19 - 1, 2**63 - 10**19]
    edges += [2**63 - 1, *range(-1000, 1000, 7), *(3**k for k in range(40))]
    for n in edges:
        expected = "\x1e" + format(n + 2**63, "020d")
        assert encode_key(n) == expected, n
        assert encode_key(["p", n]) == "p\x1f" + expected, n
        assert decode_key(expected) == n


def test_a_table_name_is_checked_every_time_until_it_passed_and_the_memo_is_bounded(
    tmp_path: Any,
) -> None:
    config = load_io_config({"blockdb": {"sqlite_path": str(tmp_path / "x.sqlite3")}}, env={})
    backend = make_blockdb_backend(config)
    for _ in range(2):  # a refused name is refused again (never remembered)
        with pytest.raises(IORequestError, match="bad table name 'Prices'"):
            backend.prepare(R, "get_row", {"table": "Prices", "key": 1}, None)
    first = backend.prepare(R, "get_row", {"table": "prices", "key": 1}, None)
    again = backend.prepare(R, "get_row", {"table": "prices", "key": 2}, None)
    assert first.body.sql_table == again.body.sql_table == '"bx_prices"'
    assert (first.domain, again.domain) == ("prices", "prices")
    for i in range(5000):  # many distinct names: the memo starts over, names still work
        prepared = backend.prepare(R, "get_row", {"table": f"t{i}", "key": 1}, None)
        assert prepared.body.sql_table == f'"bx_t{i}"'
    assert len(backend._sql_tables) <= 4096
    with pytest.raises(IORequestError, match="bad table name 'Prices'"):
        backend.prepare(R, "get_row", {"table": "Prices", "key": 1}, None)
