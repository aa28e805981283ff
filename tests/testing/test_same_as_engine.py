"""A function gives the same answers under ``load_function`` as in the engine.

The same source runs twice: in process (``blockx.testing``: in-memory tables)
and through a real worker and executor (``blockx.map`` with the SQLite table
store). Table semantics (key order, composite keys, JSON rows, missing tables),
sub-calls and the wire must agree.
"""

from __future__ import annotations

import pytest

import blockx
from blockx.testing import load_function

pytestmark = pytest.mark.slow

WRITER_AND_SCANNER = """
def _(run):
    t = Table("mixed_" + run)
    t.upsert_rows([{"key": k, "v": [1, (2, 3)]} for k in ["b", 10, "a", -5, 2, "é", "Z"]])
    c = Table("comp_" + run)
    c.upsert_rows([{"chain": ch, "n": n} for ch, n in [("eth", 3), ("eth", 1), ("arb", 9)]],
                  key_field=["chain", "n"])
    c.upsert_rows([{"chain": "eth", "n": 1, "again": True}], key_field=["chain", "n"])
    return {
        "asc": [k for k, _ in t.scan()],
        "desc": [k for k, _ in t.scan(order="desc", limit=3)],
        "range": [k for k, _ in t.scan(start=2, end="b")],
        "prefix": [k for k, _ in c.scan(["eth"])],
        "rows": t.get_rows([10, "nope", "a"]),
        "missing": Table("never_" + run).get_row("x"),
        "deleted": t.delete_rows(["a", "nope"]),
        "again": c.get_row(["eth", 1]),
        "child": function.call("child", [1, 2]),
    }
"""
CHILD = "def _(a, b):\n    return {'sum': a + b, 'pair': (a, b)}\n"


def test_tables_sub_calls_and_the_wire_agree(tmp_path):
    in_process = load_function(WRITER_AND_SCANNER, functions={"child": CHILD})("p")
    [in_engine] = blockx.map(
        WRITER_AND_SCANNER,
        ["p"],
        functions={"child": CHILD},
        executors=1,
        max_attempts=1,
        io={"blockdb": {"sqlite_path": str(tmp_path / "tables.sqlite3")}},
    )
    assert (tmp_path / "tables.sqlite3").exists()  # the engine used the SQLite store
    assert in_process == in_engine
    assert in_process["asc"] == [-5, 2, 10, "Z", "a", "b", "é"]
