"""Fixtures of the IO tests: a real PostgreSQL server (session), a real JSON-RPC node,
and the ``engine`` parameter that runs the table-store suites on SQLite and PostgreSQL."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from jsonrpc_node import FakeNode
from pg_cluster import pg_dsn  # noqa: F401 - the shared session fixture

_prefixes = itertools.count(1)


@pytest.fixture(params=["sqlite", "postgres"])
def engine_config(request: pytest.FixtureRequest, tmp_path: Any) -> dict[str, Any]:
    """``io.blockdb`` settings for one engine; each test gets its own tables
    (a fresh SQLite file, or a fresh table prefix on the shared PostgreSQL server)."""
    if request.param == "sqlite":
        return {"engine": "sqlite", "sqlite_path": str(tmp_path / "data" / "blockdb.sqlite3")}
    dsn = request.getfixturevalue("pg_dsn")
    return {
        "engine": "postgres",
        "postgres_dsn": dsn,
        "table_prefix": f"t{next(_prefixes)}_",
        "postgres_pool_size": 4,
    }


@pytest.fixture(scope="session")
def fake_node() -> Iterator[FakeNode]:
    with FakeNode() as node:
        yield node


@pytest.fixture
def node(fake_node: FakeNode) -> FakeNode:
    """The session's JSON-RPC node, its knobs and records reset for this test."""
    fake_node.reset()
    return fake_node
