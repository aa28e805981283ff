"""``blockx.db``: tables of the ``blockdb`` store, from user code.

::

    def _(p):
        row = Table("prices").get_row(p["token"])           # dict or None
        Table("seen").upsert_rows([{"key": p["token"], "at": p["block"]}])
        return {"usd": row["usd"] if row else None}

``Table`` is predefined in every function module (no import needed). Each
method is one request through the worker (``blockx.sdk`` provider: the call
suspends, other calls run meanwhile) and returns its result. Reads are cached
per task by the worker, and identical concurrent reads share one backend call;
a write drops the task's cached reads of that table, so a call reads what it
wrote. Writes by other tasks are not seen through the cache.

Keys are ``str`` (non-empty, no control characters), ``int`` (signed 64-bit), or a list
of those for a composite key (``["eth", 19000000]``). Rows are dicts, stored
whole (the key field included). Scans return ``(key, row)`` pairs in key
order: ints before strings, ints by value, strings by code point, composite
keys part by part.

Errors: a bad table name, key or argument raises :class:`TableError` here,
before any request (uncaught, the call fails as ``user_error``, not retried);
a failure in the store raises ``RemoteIOError`` (kind ``io_error``; uncaught,
the call fails with it, retried when the store said it is transient).
Outside a call run by the BlockX executor, every method raises
``blockx.sdk.NoProviderError``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Any, Final

import orjson

from blockx.sdk import db as _db

__all__ = ["MAX_BATCH", "Table", "TableError"]

#: Keys per get_rows/delete_rows, rows per upsert_rows, and the largest scan limit.
MAX_BATCH: Final = 10_000
_TABLE_RE: Final = re.compile(r"[a-z_][a-z0-9_]{0,46}\Z")
_CONTROL_RE: Final = re.compile(r"[\x00-\x1f]")
_INT_MIN: Final = -(1 << 63)
_INT_MAX: Final = (1 << 63) - 1
_MAX_PARTS: Final = 8
_SORTED: Final = orjson.OPT_SORT_KEYS


class TableError(ValueError):
    """A table was used wrongly (bad name, key, rows or argument); nothing was sent."""


def _type_name(value: Any) -> str:
    return "None" if value is None else type(value).__name__


def _cache_key(params: dict[str, Any]) -> str:
    """The read's cache key: its params as canonical JSON (the worker skips re-encoding)."""
    try:
        return orjson.dumps(params, option=_SORTED).decode()
    except TypeError:
        import json

        return json.dumps(params, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class Table:
    """A table of the ``blockdb`` store (see the module docstring).

    ``Table("prices")``: names are 1–47 characters of lowercase letters,
    digits and ``_``, not starting with a digit. Creating a ``Table`` sends
    nothing; the table itself is created by its first ``upsert_rows``, and
    reads of a table that does not exist find nothing.
    """

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        if type(name) is not str or not _TABLE_RE.match(name):
            hint = ""
            if type(name) is str and _TABLE_RE.match(name.lower()):
                hint = f" (use {name.lower()!r})"
            shown = repr(name) if type(name) is str else f"of type {_type_name(name)}"
            raise TableError(
                f"bad table name {shown}{hint}: 1-47 lowercase letters, digits and '_', "
                "not starting with a digit"
            )
        self.name = name

    def __repr__(self) -> str:
        return f"Table({self.name!r})"

    def __eq__(self, other: object) -> bool:
        return type(other) is Table and other.name == self.name

    def __hash__(self) -> int:
        return hash(("blockx.Table", self.name))

    # --- checks ---------------------------------------------------------------------------------

    def _error(self, message: str) -> TableError:
        return TableError(f"table {self.name!r}: {message}")

    def _check_part(self, part: Any, what: str) -> Any:
        kind = type(part)
        if kind is str:
            if not part:
                raise self._error(f"{what} must not be an empty string")
            if _CONTROL_RE.search(part):
                raise self._error(f"{what} must not contain control characters (U+0000-U+001F)")
            return part
        if kind is int:
            if not _INT_MIN <= part <= _INT_MAX:
                raise self._error(f"{what} {part} is outside the signed 64-bit range")
            return part
        raise self._error(f"{what} must be str or int, got {_type_name(part)}")

    def _check_key(self, key: Any, what: str = "key") -> Any:
        kind = type(key)
        if kind is str or kind is int:
            return self._check_part(key, what)
        if kind is list or kind is tuple:
            if not 1 <= len(key) <= _MAX_PARTS:
                raise self._error(
                    f"{what}: a composite key has 1 to {_MAX_PARTS} parts, got {len(key)}"
                )
            return [self._check_part(p, f"{what} part {i}") for i, p in enumerate(key)]
        raise self._error(
            f"{what} must be str, int or a list of them (composite key), got {_type_name(key)}"
        )

    def _check_keys(self, keys: Any) -> list[Any]:
        if isinstance(keys, (str, bytes, dict)) or not isinstance(
            keys, (Sequence, set, frozenset, Iterator)
        ):
            raise self._error(f"keys must be a list of keys, got {_type_name(keys)}")
        checked = [self._check_key(k, f"keys[{i}]") for i, k in enumerate(keys)]
        if len(checked) > MAX_BATCH:
            raise self._error(f"at most {MAX_BATCH} keys per request, got {len(checked)}")
        return checked

    def _read(self, operation: str, params: dict[str, Any]) -> Any:
        return _db.read(operation, params, cache_key=_cache_key(params))

    # --- reads ----------------------------------------------------------------------------------

    def get_row(self, key: Any) -> dict[str, Any] | None:
        """The row stored under ``key``, or None."""
        return self._read("get_row", {"table": self.name, "key": self._check_key(key)})  # type: ignore[no-any-return]

    def get_rows(self, keys: Sequence[Any]) -> list[dict[str, Any] | None]:
        """The rows of ``keys``, in the same order (None where missing)."""
        checked = self._check_keys(keys)
        if not checked:
            return []
        return self._read("get_rows", {"table": self.name, "keys": checked})  # type: ignore[no-any-return]

    def scan(
        self,
        prefix: str | Sequence[Any] | None = None,
        start: Any = None,
        end: Any = None,
        limit: int = 1000,
        *,
        after: Any = None,
        order: str = "asc",
    ) -> list[tuple[Any, dict[str, Any]]]:
        """Up to ``limit`` ``(key, row)`` pairs in key order (``order="desc"``: reversed).

        ``prefix``: a str (string keys starting with it; composite keys whose first
        part does) or a list of parts (composite keys beginning with exactly those
        parts). ``start`` is inclusive, ``end`` and ``after`` exclusive; all combine.
        Page through a table with ``after=<last key of the previous page>``, or use
        :meth:`iter_scan`.
        """
        params: dict[str, Any] = {"table": self.name}
        if prefix is not None:
            if type(prefix) is str:
                if _CONTROL_RE.search(prefix):
                    raise self._error("prefix must not contain control characters")
                params["prefix"] = prefix
            elif isinstance(prefix, (list, tuple)):
                params["prefix"] = self._check_key(list(prefix), "prefix")
            else:
                raise self._error(
                    f"prefix must be a str or a list of key parts, got {_type_name(prefix)}"
                )
        for name, value in (("start", start), ("end", end), ("after", after)):
            if value is not None:
                params[name] = self._check_key(value, name)
        if type(limit) is not int or not 1 <= limit <= MAX_BATCH:
            raise self._error(f"limit must be an int from 1 to {MAX_BATCH}, got {limit!r}")
        params["limit"] = limit
        if order not in ("asc", "desc"):
            raise self._error(f"order must be 'asc' or 'desc', got {order!r}")
        if order == "desc":
            params["order"] = "desc"
        pairs = self._read("scan", params)
        return [(key, row) for key, row in pairs]

    def iter_scan(
        self,
        prefix: str | Sequence[Any] | None = None,
        start: Any = None,
        end: Any = None,
        *,
        page_size: int = 1000,
    ) -> Iterator[tuple[Any, dict[str, Any]]]:
        """Every ``(key, row)`` in range, ascending, fetched ``page_size`` at a time."""
        after = None
        while True:
            page = self.scan(prefix, start, end, page_size, after=after)
            yield from page
            if len(page) < page_size:
                return
            after = page[-1][0]

    # --- writes ---------------------------------------------------------------------------------

    def upsert_rows(
        self, rows: Sequence[dict[str, Any]], key_field: str | Sequence[str] = "key"
    ) -> int:
        """Insert or replace ``rows``, each under ``row[key_field]``; returns the keys written.

        ``key_field`` may be a list of field names: the composite key of those
        fields. Within one call the last row of a key wins. Creates the table on
        first use.
        """
        if isinstance(rows, dict) or not isinstance(rows, (Sequence, Iterator)):
            raise self._error(f"rows must be a list of dicts, got {_type_name(rows)}")
        rows = list(rows)
        if len(rows) > MAX_BATCH:
            raise self._error(f"at most {MAX_BATCH} rows per upsert, got {len(rows)}")
        if type(key_field) is str:
            fields: list[str] | None = None
        elif (
            isinstance(key_field, (list, tuple))
            and 1 <= len(key_field) <= _MAX_PARTS
            and all(type(f) is str for f in key_field)
        ):
            fields = list(key_field)
        else:
            raise self._error(
                f"key_field must be a field name or a list of 1 to {_MAX_PARTS} names, "
                f"got {key_field!r}"
            )
        for i, row in enumerate(rows):
            if type(row) is not dict:
                raise self._error(f"rows[{i}] must be a dict, got {_type_name(row)}")
            if fields is None:
                if key_field not in row:
                    raise self._error(f"rows[{i}] has no key field {key_field!r}")
                self._check_key(row[key_field], f"rows[{i}][{key_field!r}]")
            else:
                for f in fields:
                    if f not in row:
                        raise self._error(f"rows[{i}] has no key field {f!r}")
                    self._check_part(row[f], f"rows[{i}][{f!r}]")
        if not rows:
            return 0
        params: dict[str, Any] = {"table": self.name, "rows": rows}
        if fields is not None:
            params["key_field"] = fields
        elif key_field != "key":
            params["key_field"] = key_field
        return _db.write("upsert_rows", params)  # type: ignore[no-any-return]

    def upsert_row(self, row: dict[str, Any], key_field: str | Sequence[str] = "key") -> int:
        """``upsert_rows([row], key_field)``."""
        return self.upsert_rows([row], key_field)

    def delete_rows(self, keys: Sequence[Any]) -> int:
        """Delete the rows of ``keys``; returns how many existed."""
        checked = self._check_keys(keys)
        if not checked:
            return 0
        return _db.write("delete_rows", {"table": self.name, "keys": checked})  # type: ignore[no-any-return]
