"""``blockx.testing.InMemoryTables``: the ``blockdb`` store's semantics without a file.

Requests are checked by the real backend (same errors), and answered in key
order as SQLite and PostgreSQL answer them (docs/sdk.md, ``Table``).
"""

from __future__ import annotations

import pytest

from blockx.db import TableError
from blockx.executor.errors import RemoteIOError
from blockx.testing import InMemoryTables, load_function


def run(body: str, tables=None):
    f = load_function(f"def _():\n    return {body}\n", tables=tables)
    return f(), f.tables


def test_scan_orders_ints_before_strings_and_composite_keys_part_by_part():
    tables = InMemoryTables()
    tables.seed("t", [{"key": k} for k in ["b", 10, "a", -5, 2]])
    tables.seed(
        "c",
        [{"chain": "eth", "n": n} for n in (3, 1, 2)] + [{"chain": "arb", "n": 9}],
        key_field=["chain", "n"],
    )

    keys_of = run("[k for k, _ in Table('t').scan()]", tables)[0]
    assert keys_of == [-5, 2, 10, "a", "b"]
    assert run("[k for k, _ in Table('t').scan(order='desc', limit=2)]", tables)[0] == ["b", "a"]
    assert run("[k for k, _ in Table('c').scan(['eth'])]", tables)[0] == [
        ["eth", 1],
        ["eth", 2],
        ["eth", 3],
    ]
    assert run("[k for k, _ in Table('c').scan('e', after=['eth', 1])]", tables)[0] == [
        ["eth", 2],
        ["eth", 3],
    ]
    assert run("[k for k, _ in Table('t').scan(start=2, end='a')]", tables)[0] == [2, 10]
    assert run("list(Table('t').iter_scan(page_size=2))", tables)[0] == [
        [k, {"key": k}] for k in [-5, 2, 10, "a", "b"]
    ]


def test_get_rows_upsert_and_delete_count_as_the_engines():
    tables = InMemoryTables({"t": [{"key": "a", "v": 1}]})
    out, _ = run(
        "(Table('t').get_rows(['a', 'x', 'a']), "
        "Table('t').upsert_rows([{'key': 'b', 'v': 1}, {'key': 'b', 'v': 2}]), "
        "Table('t').delete_rows(['a', 'zz']), Table('gone').get_row('a'))",
        tables,
    )
    assert out == [[{"key": "a", "v": 1}, None, {"key": "a", "v": 1}], 1, 1, None]
    assert tables.rows("t") == [{"key": "b", "v": 2}]
    assert "gone" not in tables  # reads create no table
    assert tables.reads == 2 and tables.writes == 2


def test_rows_come_back_as_stored_json():
    tables = InMemoryTables()
    run("Table('t').upsert_row({'key': 'a', 'pair': (1, 2)})", tables)
    stored = tables.get("t", "a")
    assert stored == {"key": "a", "pair": [1, 2]}
    stored["pair"].append(3)  # a copy: the store is not changed through it
    assert tables.get("t", "a") == {"key": "a", "pair": [1, 2]}


def test_bad_requests_fail_as_in_the_engine():
    with pytest.raises(TableError, match="bad table name"):
        run("Table('Prices')")
    long_key = "x" * 1100
    with pytest.raises(RemoteIOError, match="limit is 1024") as raised:
        run(f"Table('t').get_row({long_key!r})")
    assert raised.value.kind == "io_error" and not raised.value.retryable
    with pytest.raises(RemoteIOError, match="not storable JSON"):
        run("Table('t').upsert_row({'key': 'a', 'v': float('nan')})")


def test_seeding_a_bad_row_is_a_clear_error():
    with pytest.raises(ValueError, match=r"cannot seed table 'prices'.*no key field 'key'"):
        InMemoryTables({"prices": [{"symbol": "ETH"}]})
