"""``blockdb``: the table store's semantics, shared by its SQLite and PostgreSQL engines.

Data model (identical on both engines)
--------------------------------------
A *table* is a key → row store. Its name matches ``[a-z_][a-z0-9_]{0,46}``
(lowercase: SQLite would fold case, PostgreSQL would not); in SQL it is the
table ``{table_prefix}{name}`` (default prefix ``bx_``) with two columns::

    key  TEXT PRIMARY KEY   -- the encoded key (below); byte order ("C" collation)
    row  TEXT NOT NULL      -- the row: a JSON object, compact UTF-8 JSON text

A *row* is a JSON object (a ``dict``); it is stored and returned whole,
including its key field. A *key* is

* a non-empty ``str`` without control characters (U+0000–U+001F), or
* an ``int`` in the signed 64-bit range (``bool`` is not a key), or
* a composite key: a list of 1–8 such parts (``["eth", 19000000]``); a
  one-part list is the same key as its part.

Keys are encoded into the ``key`` column so that the column's byte order is
the keys' order: a string part is stored as itself, an int part as ``\\x1e``
followed by the 20-digit zero-padded value of ``n + 2**63``, parts joined by
``\\x1f``. So ints sort numerically and before strings, strings by code point,
composite keys part by part (a shorter key before its extensions). An encoded
key is at most 1024 UTF-8 bytes.

Operations (``params`` keys; results):

``get_row {table, key}``
    the row, or ``None`` (also when the table does not exist).
``get_rows {table, keys}``
    a list aligned with ``keys`` (``None`` where missing); at most 10,000 keys.
``scan {table, prefix?, start?, end?, after?, limit?=1000, order?="asc"}``
    ``[[key, row], ...]`` in key order (``"desc"``: reverse). ``prefix``: a
    ``str`` (string keys, or composite keys whose first part, starting with it)
    or a list of parts (composite keys beginning with exactly those parts, and
    that key itself). ``start`` is inclusive, ``end`` and ``after`` exclusive;
    all bounds combine. ``limit`` 1..10,000.
``upsert_rows {table, rows, key_field?="key"}``
    insert or replace each row under ``row[key_field]`` (``key_field`` a list of
    field names: the composite key of those fields). Creates the table on
    first use. Duplicate keys in one request: the last row wins. Returns the
    number of distinct keys written. At most 10,000 rows.
``delete_rows {table, keys}``
    delete those keys; returns how many rows existed. At most 10,000 keys.

Reads of a table that does not exist answer as if it were empty; only
``upsert_rows`` creates tables. Reads use ``ioKind=read``, writes
``ioKind=write`` (a mismatch is refused). ``params`` may also arrive as the
sidecar: the same JSON object as bytes. Bad params are refused with
``io_error`` (not retryable) and a message naming the operation, the table and
the problem; engine failures are ``io_error``, retryable when transient.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Sequence
from typing import Any, Final, Protocol

import msgspec

from blockx.wire import NotSerializableError, dumps_wire, keys, loads_wire

from .backend import IORequestError, PreparedRequest, Reply

__all__ = [
    "MAX_BATCH",
    "MAX_KEY_BYTES",
    "TABLE_NAME_PATTERN",
    "BlockDBBackend",
    "BlockDBEngine",
    "Delete",
    "GetRow",
    "GetRows",
    "Scan",
    "TableOp",
    "Upsert",
    "decode_key",
    "encode_key",
]

BACKEND: Final = "blockdb"
TABLE_NAME_PATTERN: Final = r"[a-z_][a-z0-9_]{0,46}"
_TABLE_RE: Final = re.compile(TABLE_NAME_PATTERN + r"\Z")
#: How many checked table names a backend remembers (their SQL names).
_MAX_KNOWN_TABLES: Final = 4096
_CONTROL_RE: Final = re.compile(r"[\x00-\x1f]")
MAX_KEY_BYTES: Final = 1024
MAX_KEY_PARTS: Final = 8
MAX_BATCH: Final = 10_000
DEFAULT_SCAN_LIMIT: Final = 1000

_INT_TAG: Final = "\x1e"
_SEP: Final = "\x1f"
_INT_OFFSET: Final = 1 << 63
_INT_MIN: Final = -(1 << 63)
_INT_MAX: Final = (1 << 63) - 1

READ_OPERATIONS: Final = ("get_row", "get_rows", "scan")
WRITE_OPERATIONS: Final = ("upsert_rows", "delete_rows")
_PARAMS: Final[dict[str, tuple[str, ...]]] = {
    "get_row": ("table", "key"),
    "get_rows": ("table", "keys"),
    "scan": ("table", "prefix", "start", "end", "after", "limit", "order"),
    "upsert_rows": ("table", "rows", "key_field"),
    "delete_rows": ("table", "keys"),
}
_PARAM_SETS: Final = {operation: frozenset(names) for operation, names in _PARAMS.items()}


class _Invalid(ValueError):
    """A bad key or param (becomes an :class:`IORequestError` with context)."""


# --- keys ---------------------------------------------------------------------------------------


def _type_name(value: Any) -> str:
    return "None" if value is None else type(value).__name__


def _encode_part(part: Any, what: str) -> str:
    kind = type(part)
    if kind is str:
        text: str = part
        if not text:
            raise _Invalid(f"{what} must not be an empty string")
        if _CONTROL_RE.search(text):
            raise _Invalid(f"{what} must not contain control characters (U+0000-U+001F)")
        return text
    if kind is int:
        if not _INT_MIN <= part <= _INT_MAX:
            raise _Invalid(f"{what} {part} is outside the signed 64-bit range")
        return _INT_TAG + str(part + _INT_OFFSET).zfill(20)
    raise _Invalid(f"{what} must be str or int, got {_type_name(part)}")


def encode_key(key: Any, what: str = "key") -> str:
    """The ``key`` column text of a key (see the module docstring); raises ValueError."""
    if type(key) is int and _INT_MIN <= key <= _INT_MAX:
        # The common case: 21 ASCII characters. str() + zfill, not a "020d" format of a
        # 64-bit-plus int (the format spec parsed per key: ~2.5x the cost).
        return _INT_TAG + str(key + _INT_OFFSET).zfill(20)
    if type(key) is list or type(key) is tuple:
        if not 1 <= len(key) <= MAX_KEY_PARTS:
            raise _Invalid(
                f"{what}: a composite key has 1 to {MAX_KEY_PARTS} parts, got {len(key)}"
            )
        text = _SEP.join(_encode_part(part, f"{what} part {i}") for i, part in enumerate(key))
    elif type(key) is str or type(key) is int:
        text = _encode_part(key, what)
    else:
        raise _Invalid(
            f"{what} must be str, int or a list of them (composite key), got {_type_name(key)}"
        )
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise _Invalid(f"{what} is not valid Unicode text (lone surrogate)") from None
    if size > MAX_KEY_BYTES:
        raise _Invalid(f"{what} is {size} bytes encoded; the limit is {MAX_KEY_BYTES}")
    return text


def decode_key(text: str) -> Any:
    """The key a ``key`` column text encodes: str, int, or a list for composite keys."""
    if _SEP not in text:
        return int(text[1:]) - _INT_OFFSET if text.startswith(_INT_TAG) else text
    return [
        int(part[1:]) - _INT_OFFSET if part.startswith(_INT_TAG) else part
        for part in text.split(_SEP)
    ]


def _successor(prefix: str) -> str | None:
    """The least string greater than every string starting with ``prefix`` (None: none)."""
    chars = list(prefix)
    while chars:
        code = ord(chars[-1])
        if code < 0x10FFFF:
            code += 1
            if 0xD800 <= code <= 0xDFFF:
                code = 0xE000
            chars[-1] = chr(code)
            return "".join(chars)
        chars.pop()
    return None


# --- operations ---------------------------------------------------------------------------------

#: Thread-safe (no shared decoder state): the SQLite engine decodes rows in its own thread.
_loads: Final = msgspec.json.decode


class TableOp:
    """A checked operation on one table; the engines run it and call :meth:`finish`."""

    __slots__ = ("sql_table", "table")

    operation: str = ""
    write: bool = False

    def __init__(self, table: str, sql_table: str) -> None:
        self.table = table
        #: The quoted SQL identifier: ``"bx_prices"``.
        self.sql_table = sql_table

    @property
    def raw_table(self) -> str:
        """The SQL table name, unquoted."""
        return self.sql_table[1:-1]

    def finish(self, raw: Any) -> Reply:
        """The reply, from what the engine read (see each op)."""
        raise NotImplementedError

    def empty(self) -> Reply:
        """The reply when the table does not exist."""
        return self.finish(None)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.table!r})"


class GetRow(TableOp):
    """``raw``: the row text or None."""

    __slots__ = ("key",)
    operation = "get_row"

    def __init__(self, table: str, sql_table: str, key: str) -> None:
        super().__init__(table, sql_table)
        self.key = key

    def finish(self, raw: str | None) -> Reply:
        if raw is None:
            return Reply(None, nbytes=4)
        return Reply(_loads(raw), nbytes=len(raw))


class GetRows(TableOp):
    """``raw``: ``{key text: row text}`` of the keys found."""

    __slots__ = ("keys", "unique")
    operation = "get_rows"

    def __init__(self, table: str, sql_table: str, keys: list[str]) -> None:
        super().__init__(table, sql_table)
        self.keys = keys
        self.unique = list(dict.fromkeys(keys))

    def finish(self, raw: dict[str, str] | None) -> Reply:
        if not raw:
            return Reply([None] * len(self.keys), nbytes=5 * len(self.keys) + 2)
        decoded = {k: _loads(v) for k, v in raw.items()}
        nbytes = sum(len(v) for v in raw.values()) + 5 * len(self.keys)
        return Reply([decoded.get(k) for k in self.keys], nbytes=nbytes)


class Scan(TableOp):
    """``raw``: ``[(key text, row text), ...]`` in order.

    ``conditions``: ``(operator, key text)`` pairs, operator one of ``>=``, ``>``, ``<``.
    """

    __slots__ = ("conditions", "descending", "limit")
    operation = "scan"

    def __init__(
        self,
        table: str,
        sql_table: str,
        conditions: list[tuple[str, str]],
        limit: int,
        descending: bool,
    ) -> None:
        super().__init__(table, sql_table)
        self.conditions = conditions
        self.limit = limit
        self.descending = descending

    def finish(self, raw: Sequence[tuple[str, str]] | None) -> Reply:
        if not raw:
            return Reply([], nbytes=2)
        nbytes = 2
        rows = []
        for key, row in raw:
            nbytes += len(key) + len(row) + 4
            rows.append([decode_key(key), _loads(row)])
        return Reply(rows, nbytes=nbytes)


class Upsert(TableOp):
    """``raw``: the number of rows written. ``items``: ``(key text, row text)``, keys distinct."""

    __slots__ = ("items",)
    operation = "upsert_rows"
    write = True

    def __init__(self, table: str, sql_table: str, items: list[tuple[str, str]]) -> None:
        super().__init__(table, sql_table)
        self.items = items

    def finish(self, raw: int | None) -> Reply:
        return Reply(raw or 0, nbytes=8)


class Delete(TableOp):
    """``raw``: the number of rows deleted. ``keys`` distinct."""

    __slots__ = ("keys",)
    operation = "delete_rows"
    write = True

    def __init__(self, table: str, sql_table: str, keys: list[str]) -> None:
        super().__init__(table, sql_table)
        self.keys = keys

    def finish(self, raw: int | None) -> Reply:
        return Reply(raw or 0, nbytes=8)


# --- the backend --------------------------------------------------------------------------------


class BlockDBEngine(Protocol):
    """Runs checked operations: SQLite (a thread) or PostgreSQL (asyncpg)."""

    #: ``sqlite`` or ``postgres``.
    engine: str

    def submit(self, op: TableOp) -> Awaitable[Reply]: ...

    async def close(self) -> None: ...


def _key_list(value: Any, what: str) -> list[str]:
    if type(value) is not list:
        raise _Invalid(f"{what} must be a list of keys, got {_type_name(value)}")
    if len(value) > MAX_BATCH:
        raise _Invalid(f"{what}: at most {MAX_BATCH} keys per request, got {len(value)}")
    return [encode_key(key, f"{what}[{i}]") for i, key in enumerate(value)]


class BlockDBBackend:
    """The ``blockdb`` :class:`~blockx.worker.io.backend.IOBackend` over one engine."""

    __slots__ = ("_sql_tables", "engine", "table_prefix")

    name = BACKEND

    def __init__(self, engine: BlockDBEngine, *, table_prefix: str = "bx_") -> None:
        self.engine = engine
        self.table_prefix = table_prefix
        #: Table names checked already -> their quoted SQL names (bounded: see prepare).
        self._sql_tables: dict[str, str] = {}

    def __repr__(self) -> str:
        return f"BlockDBBackend({self.engine!r}, prefix={self.table_prefix!r})"

    def prepare(
        self, io_kind: str, operation: str, params: Any, sidecar: bytes | None
    ) -> PreparedRequest:
        expected = _PARAMS.get(operation)
        if expected is None:
            raise IORequestError(
                f"blockdb has no operation {operation!r}; operations: "
                + ", ".join(READ_OPERATIONS + WRITE_OPERATIONS)
            )
        # Each message names "blockdb <operation>", formatted only when it is raised.
        is_write = operation in WRITE_OPERATIONS
        if is_write and io_kind != keys.IO_WRITE:
            raise IORequestError(
                f"blockdb {operation} is a write: send it with ioKind 'write' (blockx.sdk.db.write)"
            )
        if not is_write and io_kind != keys.IO_READ:
            raise IORequestError(
                f"blockdb {operation} is a read: send it with ioKind 'read' (blockx.sdk.db.read)"
            )
        if sidecar is not None and params is None:
            try:
                params = loads_wire(sidecar)
            except (msgspec.DecodeError, ValueError):
                raise IORequestError(
                    f"blockdb {operation}: the sidecar is not a JSON object"
                ) from None
        if type(params) is not dict:
            raise IORequestError(
                f"blockdb {operation}: params must be an object with {', '.join(expected)}, "
                f"got {_type_name(params)}"
            )
        if not _PARAM_SETS[operation].issuperset(params):
            unknown = [name for name in params if name not in expected]
            raise IORequestError(
                f"blockdb {operation}: unknown parameter {unknown[0]!r} "
                f"(expected: {', '.join(expected)})"
            )
        table = params.get("table")
        if type(table) is not str:
            raise IORequestError(_table_name_problem(f"blockdb {operation}", table))
        sql_tables = self._sql_tables
        sql_table = sql_tables.get(table)
        if sql_table is None:
            if not _TABLE_RE.match(table):
                raise IORequestError(_table_name_problem(f"blockdb {operation}", table))
            sql_table = f'"{self.table_prefix}{table}"'
            if len(sql_tables) >= _MAX_KNOWN_TABLES:
                sql_tables.clear()  # many distinct names: start over (each is re-checked once)
            sql_tables[table] = sql_table
        try:
            op = _BUILDERS[operation](table, sql_table, params)
        except _Invalid as exc:
            raise IORequestError(f"blockdb {operation}: table {table!r}: {exc}") from None
        return PreparedRequest(operation, op, domain=table, cacheable=True)

    def execute(self, request: PreparedRequest) -> Awaitable[Reply]:
        return self.engine.submit(request.body)

    async def close(self) -> None:
        await self.engine.close()


def _table_name_problem(where: str, table: Any) -> str:
    if type(table) is not str:
        return f"{where}: 'table' must be a table name (str), got {_type_name(table)}"
    hint = ""
    if table.lower() != table and _TABLE_RE.match(table.lower()):
        hint = f" (use {table.lower()!r})"
    return (
        f"{where}: bad table name {table!r}{hint}: names are 1-47 characters of lowercase "
        "letters, digits and '_', not starting with a digit"
    )


def _build_get_row(table: str, sql_table: str, params: dict[str, Any]) -> TableOp:
    if "key" not in params:
        raise _Invalid("get_row needs 'key'")
    return GetRow(table, sql_table, encode_key(params["key"]))


def _build_get_rows(table: str, sql_table: str, params: dict[str, Any]) -> TableOp:
    return GetRows(table, sql_table, _key_list(params.get("keys"), "keys"))


def _build_scan(table: str, sql_table: str, params: dict[str, Any]) -> TableOp:
    conditions: list[tuple[str, str]] = []
    prefix = params.get("prefix")
    if prefix is not None:
        if type(prefix) is str:
            if _CONTROL_RE.search(prefix):
                raise _Invalid("prefix must not contain control characters (U+0000-U+001F)")
            if prefix:
                conditions.append((">=", prefix))
                upper = _successor(prefix)
                if upper is not None:
                    conditions.append(("<", upper))
        elif type(prefix) is list:
            low = encode_key(prefix, "prefix")
            conditions.append((">=", low))
            conditions.append(("<", low + " "))  # " " follows the part separator \x1f
        else:
            raise _Invalid(f"prefix must be a str or a list of key parts, got {_type_name(prefix)}")
    for name, operator in (("start", ">="), ("after", ">"), ("end", "<")):
        value = params.get(name)
        if value is not None:
            conditions.append((operator, encode_key(value, name)))
    limit = params.get("limit", DEFAULT_SCAN_LIMIT)
    if limit is None:
        limit = DEFAULT_SCAN_LIMIT
    if type(limit) is not int or not 1 <= limit <= MAX_BATCH:
        raise _Invalid(f"limit must be an int from 1 to {MAX_BATCH}, got {limit!r}")
    order = params.get("order", "asc")
    if order not in ("asc", "desc", None):
        raise _Invalid(f"order must be 'asc' or 'desc', got {order!r}")
    return Scan(table, sql_table, conditions, limit, order == "desc")


def _build_upsert(table: str, sql_table: str, params: dict[str, Any]) -> TableOp:
    rows = params.get("rows")
    if type(rows) is not list:
        raise _Invalid(f"rows must be a list of objects, got {_type_name(rows)}")
    if len(rows) > MAX_BATCH:
        raise _Invalid(f"at most {MAX_BATCH} rows per upsert, got {len(rows)}")
    key_field = params.get("key_field", "key")
    if key_field is None:
        key_field = "key"
    if type(key_field) is str:
        fields: tuple[str, ...] | None = None
    elif (
        type(key_field) is list
        and 1 <= len(key_field) <= MAX_KEY_PARTS
        and all(type(f) is str for f in key_field)
    ):
        fields = tuple(key_field)
    else:
        raise _Invalid(
            f"key_field must be a field name or a list of 1 to {MAX_KEY_PARTS} names, "
            f"got {key_field!r}"
        )
    items: dict[str, str] = {}
    for i, row in enumerate(rows):
        if type(row) is not dict:
            raise _Invalid(f"rows[{i}] must be an object (dict), got {_type_name(row)}")
        if fields is None:
            if key_field not in row:
                raise _Invalid(f"rows[{i}] has no key field {key_field!r}")
            key = encode_key(row[key_field], f"rows[{i}][{key_field!r}]")
        else:
            missing = [f for f in fields if f not in row]
            if missing:
                raise _Invalid(f"rows[{i}] has no key field {missing[0]!r}")
            key = encode_key([row[f] for f in fields], f"rows[{i}] key {list(fields)}")
        try:
            text = dumps_wire(row).decode("utf-8")
        except (NotSerializableError, TypeError, ValueError) as exc:
            raise _Invalid(f"rows[{i}] is not storable JSON: {exc}") from None
        items.pop(key, None)  # the last row of a key wins, in its own position
        items[key] = text
    return Upsert(table, sql_table, list(items.items()))


def _build_delete(table: str, sql_table: str, params: dict[str, Any]) -> TableOp:
    keys_ = _key_list(params.get("keys"), "keys")
    return Delete(table, sql_table, list(dict.fromkeys(keys_)))


_BUILDERS: Final = {
    "get_row": _build_get_row,
    "get_rows": _build_get_rows,
    "scan": _build_scan,
    "upsert_rows": _build_upsert,
    "delete_rows": _build_delete,
}
