"""In-memory tables for :mod:`blockx.testing`: the ``blockdb`` store without a file.

Theory of operation
-------------------
Requests are checked by the real backend's ``prepare``
(:class:`blockx.worker.io.blockdb.BlockDBBackend`): the same operations, key
rules, limits and error messages as SQLite and PostgreSQL. The checked
operation is then run here against one ``dict`` per table, ``{encoded key:
row JSON text}``, with the engines' semantics: keys ordered by their encoded
text (ints before strings, composite keys part by part), rows stored as JSON
text (so a row comes back as a fresh dict, exactly as the engine would return
it: tuples become lists), reads of a missing table find nothing, and only
``upsert_rows`` creates a table.

A refused request raises :class:`~blockx.executor.errors.RemoteIOError` (kind
``io_error``, not retryable) in the calling function, as the worker's answer
would. Nothing is cached: the engine caches reads per task, which changes how
often the store is asked, never what it answers.

Seed tables with ``InMemoryTables({"prices": [{"key": "ETH", "usd": 3000}]})``
(rows keyed by ``"key"``; :meth:`InMemoryTables.seed` takes another
``key_field``) and inspect them after the call with :meth:`~InMemoryTables.rows`,
:meth:`~InMemoryTables.get` or ``tables["prices"]``.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import msgspec

from blockx.executor.errors import RemoteIOError
from blockx.wire import keys
from blockx.worker.io.backend import IORequestError
from blockx.worker.io.blockdb import (
    BlockDBBackend,
    Delete,
    GetRow,
    GetRows,
    Scan,
    TableOp,
    Upsert,
    decode_key,
    encode_key,
)

__all__ = ["InMemoryTables"]

_decode = msgspec.json.decode


class _NoEngine:
    """The backend's engine slot: never used (operations run in :class:`InMemoryTables`)."""

    engine = "memory"

    def submit(self, op: TableOp) -> Any:  # pragma: no cover - never called
        raise RuntimeError("InMemoryTables runs operations itself")

    async def close(self) -> None:  # pragma: no cover - never called
        return None


class _Table:
    """One table: encoded key -> row text, plus the keys in order."""

    __slots__ = ("order", "rows")

    def __init__(self) -> None:
        self.rows: dict[str, str] = {}
        self.order: list[str] = []  # sorted encoded keys

    def put(self, key: str, text: str) -> None:
        if key not in self.rows:
            bisect.insort(self.order, key)
        self.rows[key] = text

    def delete(self, key: str) -> bool:
        if self.rows.pop(key, None) is None:
            return False
        del self.order[bisect.bisect_left(self.order, key)]
        return True


def _matches(key: str, conditions: Sequence[tuple[str, str]]) -> bool:
    for operator, bound in conditions:
        if operator == ">=":
            if not key >= bound:
                return False
        elif operator == ">":
            if not key > bound:
                return False
        elif not key < bound:  # "<"
            return False
    return True


class InMemoryTables:
    """The ``blockdb`` tables of one test environment (see the module docstring)."""

    __slots__ = ("_backend", "_tables", "reads", "writes")

    def __init__(self, seed: Mapping[str, Sequence[Mapping[str, Any]]] | None = None) -> None:
        self._backend = BlockDBBackend(_NoEngine())
        self._tables: dict[str, _Table] = {}
        #: Read requests answered (a test may assert on them), and write requests.
        self.reads = 0
        self.writes = 0
        for name, rows in (seed or {}).items():
            self.seed(name, rows)

    def __repr__(self) -> str:
        sizes = ", ".join(f"{name}={len(t.rows)}" for name, t in sorted(self._tables.items()))
        return f"InMemoryTables({sizes})"

    # --- the test's side ------------------------------------------------------------------------

    def seed(
        self, table: str, rows: Sequence[Mapping[str, Any]], key_field: str | Sequence[str] = "key"
    ) -> int:
        """Store ``rows`` (as ``Table(table).upsert_rows(rows, key_field)`` would)."""
        params: dict[str, Any] = {"table": table, "rows": [dict(row) for row in rows]}
        if key_field != "key":
            params["key_field"] = key_field if isinstance(key_field, str) else list(key_field)
        try:
            count: int = self.request(keys.IO_WRITE, "upsert_rows", params)
        except RemoteIOError as exc:
            raise ValueError(f"cannot seed table {table!r}: {exc.message}") from None
        self.writes -= 1  # seeding is not the function's write
        return count

    def names(self) -> list[str]:
        """The tables that exist (created by a seed or an upsert), sorted."""
        return sorted(self._tables)

    def rows(self, table: str) -> list[dict[str, Any]]:
        """Every row of ``table`` in key order (``[]`` for a table that does not exist)."""
        stored = self._tables.get(table)
        if stored is None:
            return []
        return [_decode(stored.rows[key]) for key in stored.order]

    def items(self, table: str) -> list[tuple[Any, dict[str, Any]]]:
        """``(key, row)`` pairs of ``table`` in key order."""
        stored = self._tables.get(table)
        if stored is None:
            return []
        return [(decode_key(key), _decode(stored.rows[key])) for key in stored.order]

    def get(self, table: str, key: Any) -> dict[str, Any] | None:
        """The row under ``key`` in ``table``, or None."""
        stored = self._tables.get(table)
        if stored is None:
            return None
        text = stored.rows.get(encode_key(key))
        return None if text is None else _decode(text)

    def __getitem__(self, table: str) -> list[dict[str, Any]]:
        return self.rows(table)

    def __contains__(self, table: object) -> bool:
        return table in self._tables

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    # --- the function's side --------------------------------------------------------------------

    def request(self, io_kind: str, operation: str, params: Any) -> Any:
        """Answer one ``blockdb`` request as the worker would, or raise ``RemoteIOError``."""
        sidecar = bytes(params) if isinstance(params, (bytes, bytearray, memoryview)) else None
        try:
            prepared = self._backend.prepare(
                io_kind, operation, None if sidecar is not None else params, sidecar
            )
        except IORequestError as exc:
            raise RemoteIOError(keys.ERR_IO_ERROR, exc.message, exc.retryable) from None
        op: TableOp = prepared.body
        if op.write:
            self.writes += 1
        else:
            self.reads += 1
        return op.finish(self._run(op)).result

    def _run(self, op: TableOp) -> Any:
        table = self._tables.get(op.table)
        if isinstance(op, Upsert):
            if table is None:
                table = self._tables[op.table] = _Table()
            for key, text in op.items:
                table.put(key, text)
            return len(op.items)
        if table is None:
            return None  # a missing table reads as empty, deletes nothing
        if isinstance(op, GetRow):
            return table.rows.get(op.key)
        if isinstance(op, GetRows):
            return {k: table.rows[k] for k in op.unique if k in table.rows}
        if isinstance(op, Scan):
            keys_in_order = reversed(table.order) if op.descending else iter(table.order)
            found: list[tuple[str, str]] = []
            for key in keys_in_order:
                if _matches(key, op.conditions):
                    found.append((key, table.rows[key]))
                    if len(found) >= op.limit:
                        break
            return found
        if isinstance(op, Delete):
            return sum(1 for key in op.keys if table.delete(key))
        raise RuntimeError(f"InMemoryTables: unknown operation {op!r}")
