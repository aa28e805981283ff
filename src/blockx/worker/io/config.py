"""IOConfig: the IO subsystem's knobs — cache bounds, the table store, the node endpoints.

Built from defaults ← a mapping (a config file's ``io`` table, a task file's
``io`` section) ← the environment, by :func:`load_io_config`; building the
dataclasses directly runs the same checks. Bad values raise one
:class:`IOConfigError` whose lines name the knob and what is wrong::

    io.blockdb.engine='mysql': expected one of auto, sqlite, postgres
    io.rpc.endpoints='eth': expected a JSON object {"chain": ["http://...", ...]} or ...

(a value from the environment is named by its knob, as here).

Knobs (environment variable in brackets; an empty variable counts as unset):

``data_dir`` [``BLOCKX_DATA_DIR``] = ``.blockx``
    Where embedded state lives (the SQLite table store). A relative value is relative to the
    working directory; `blockx run` with no value set puts it next to the task file.
``cache_max_entries`` [``IO_CACHE_MAX_ENTRIES``] = ``10000``
    Entries of one task's read cache; 0 disables caching (singleflight stays).
``cache_max_bytes`` [``IO_CACHE_MAX_BYTES``] = ``16777216``
    Estimated bytes of one task's read cache (answers + keys); 0 disables caching.
``max_task_scopes`` [``IO_MAX_TASK_SCOPES``] = ``64``
    Task scopes the subsystem keeps when used as one worker-wide IO handler
    (least recently used go first; a task given its own scope is not counted).
``blockdb.engine`` [``BLOCKDB_ENGINE``] = ``auto``
    ``sqlite``, ``postgres``, or ``auto``: PostgreSQL when a DSN is set, else SQLite.
``blockdb.sqlite_path`` [``BLOCKDB_SQLITE_PATH``] = ``{data_dir}/blockdb.sqlite3``
    The SQLite file, created (with its directory) on first use.
``blockdb.postgres_dsn`` [``BLOCKDB_POSTGRES_DSN``] = none
    ``postgresql://user:pass@host:port/db`` (anything asyncpg accepts).
``blockdb.postgres_pool_size`` [``BLOCKDB_POSTGRES_POOL_SIZE``] = ``10``
    Connections in the asyncpg pool (at most).
``blockdb.timeout_s`` [``BLOCKDB_TIMEOUT_S``] = ``30``
    Per statement: PostgreSQL command timeout; SQLite busy timeout.
``blockdb.table_prefix`` [``BLOCKDB_TABLE_PREFIX``] = ``bx_``
    SQL name of table ``t`` is ``{prefix}t`` (both engines).
``blockdb.sqlite_batch_max`` [``BLOCKDB_SQLITE_BATCH_MAX``] = ``256``
    Requests the SQLite thread runs per transaction (one commit per batch).
``rpc.endpoints`` [``RPC_ENDPOINTS``] = ``{}``
    ``{"eth": ["http://127.0.0.1:8545", ...]}``; the environment form is JSON or
    ``eth=http://a,http://b;base=http://c``.
``rpc.timeout_s`` [``RPC_TIMEOUT_S``] = ``10``
    Per HTTP request (one JSON-RPC batch).
``rpc.max_attempts`` [``RPC_MAX_ATTEMPTS``] = ``4``
    Tries of a request on transient errors (connection, timeout, HTTP 5xx/429), rotating endpoints.
``rpc.backoff_base_ms`` [``RPC_BACKOFF_BASE_MS``] = ``50``
``rpc.backoff_max_ms`` [``RPC_BACKOFF_MAX_MS``] = ``2000``
    Backoff before retry n: ``min(max, base * 2^(n-1))``, with ±25% jitter.
``rpc.max_batch`` [``RPC_MAX_BATCH``] = ``100``
    JSON-RPC requests per HTTP batch; 1 disables batching.
``rpc.batch_window_ms`` [``RPC_BATCH_WINDOW_MS``] = ``0``
    How long a batch collects requests; 0: what arrives within one event-loop turn.
``rpc.max_connections`` [``RPC_MAX_CONNECTIONS``] = ``32``
    Keep-alive HTTP connections per chain (concurrent batches beyond this queue).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

__all__ = [
    "BlockDBConfig",
    "IOConfig",
    "IOConfigError",
    "RpcConfig",
    "load_io_config",
    "parse_endpoints",
]

ENGINES: Final = ("auto", "sqlite", "postgres")


class IOConfigError(ValueError):
    """One or more bad IO configuration values; each line names one."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(problems))


#: The longest time any IO knob may give (a timeout, a backoff, a batching window): 24 h.
#: Larger values overflow the backends' own limits (SQLite's busy timeout is an int of ms).
MAX_TIME_S: Final = 86_400
MAX_TIME_MS: Final = MAX_TIME_S * 1000


def _int(value: Any, minimum: int, maximum: int | None = None) -> int:
    expected = "a positive integer" if minimum == 1 else "a non-negative integer"
    if maximum is not None:
        expected += f" of at most {maximum:,} (24 h)" if maximum == MAX_TIME_MS else f" ≤ {maximum}"
    if isinstance(value, str):
        try:
            value = int(value.strip(), 10)
        except ValueError:
            raise ValueError(expected) from None
    if type(value) is not int or value < minimum or (maximum is not None and value > maximum):
        raise ValueError(expected)
    return value


def _float(value: Any, *, allow_zero: bool = False, maximum: float = MAX_TIME_S) -> float:
    """A time (seconds, or ms where the knob says so): positive (or zero), at most
    ``maximum`` (24 h)."""
    expected = "a non-negative number" if allow_zero else "a positive number"
    expected += f" of at most {maximum:,g} (24 h)"
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise ValueError(expected) from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(expected)
    number = float(value)
    if not (number >= 0 if allow_zero else number > 0) or not number <= maximum:
        raise ValueError(expected)
    return number


def _text(value: Any) -> str:
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value.strip():
        raise ValueError("a non-empty string")
    return value


def parse_endpoints(value: Any) -> dict[str, tuple[str, ...]]:
    """``{"chain": [url, ...]}`` from a mapping, JSON text or ``eth=URL[,URL];chain2=URL``."""
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return {}
        if text.startswith("{"):
            try:
                value = json.loads(text)
            except ValueError:
                raise ValueError('a JSON object {"chain": ["http://...", ...]}') from None
        else:
            parsed: dict[str, list[str]] = {}
            for part in text.split(";"):
                chain, sep, urls = part.partition("=")
                if not sep or not chain.strip():
                    raise ValueError(
                        'a JSON object {"chain": ["http://...", ...]} or eth=URL[,URL];chain2=URL'
                    )
                parsed[chain.strip()] = [u.strip() for u in urls.split(",") if u.strip()]
            value = parsed
    if not isinstance(value, Mapping):
        raise ValueError('a mapping {"chain": ["http://...", ...]}')
    endpoints: dict[str, tuple[str, ...]] = {}
    for chain, given in value.items():
        if not isinstance(chain, str) or not chain:
            raise ValueError(f"chain names must be non-empty strings, not {chain!r}")
        chain_urls = (given,) if isinstance(given, str) else given
        if not isinstance(chain_urls, (list, tuple)) or not chain_urls:
            raise ValueError(f"chain {chain!r}: a list of http(s) URLs")
        for url in chain_urls:
            if not isinstance(url, str) or not url.startswith(("http://", "https://")):
                raise ValueError(f"chain {chain!r}: {url!r} is not an http(s) URL")
        endpoints[chain] = tuple(chain_urls)
    return endpoints


def _check(section: Any, name: str, checks: Mapping[str, Any]) -> None:
    problems: list[str] = []
    for attr, check in checks.items():
        value = getattr(section, attr)
        try:
            checked = check(value)
        except (ValueError, TypeError) as exc:
            problems.append(f"{name}.{attr}={value!r}: expected {exc}")
            continue
        if checked is not value:
            object.__setattr__(section, attr, checked)
    if problems:
        raise IOConfigError(problems)


def _choice(value: Any) -> str:
    if isinstance(value, str) and value.strip().lower() in ENGINES:
        return value.strip().lower()
    raise ValueError("one of " + ", ".join(ENGINES))


def _optional_text(value: Any) -> str | None:
    return None if value is None else _text(value)


def _prefix(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("a string")
    import re

    if not re.fullmatch(r"[a-z_][a-z0-9_]{0,15}|", value):
        raise ValueError(
            "lowercase letters, digits and '_' (at most 16, not starting with a digit)"
        )
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockDBConfig:
    """The ``blockdb`` table store (see the module docstring for each knob)."""

    engine: str = "auto"
    sqlite_path: str | None = None
    postgres_dsn: str | None = None
    postgres_pool_size: int = 10
    timeout_s: float = 30.0
    table_prefix: str = "bx_"
    sqlite_batch_max: int = 256

    def __post_init__(self) -> None:
        _check(
            self,
            "io.blockdb",
            {
                "engine": _choice,
                "sqlite_path": _optional_text,
                "postgres_dsn": _optional_text,
                "postgres_pool_size": lambda v: _int(v, 1),
                "timeout_s": _float,
                "table_prefix": _prefix,
                "sqlite_batch_max": lambda v: _int(v, 1),
            },
        )
        if self.engine == "postgres" and not self.postgres_dsn:
            raise IOConfigError(
                [
                    "io.blockdb.engine='postgres' needs io.blockdb.postgres_dsn "
                    "(BLOCKDB_POSTGRES_DSN), e.g. postgresql://user:pass@127.0.0.1:5432/blockx"
                ]
            )

    @property
    def effective_engine(self) -> str:
        """``sqlite`` or ``postgres`` (``auto`` resolved by whether a DSN is set)."""
        if self.engine == "auto":
            return "postgres" if self.postgres_dsn else "sqlite"
        return self.engine


@dataclass(frozen=True, slots=True, kw_only=True)
class RpcConfig:
    """The ``rpc`` node client (see the module docstring for each knob)."""

    endpoints: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    timeout_s: float = 10.0
    max_attempts: int = 4
    backoff_base_ms: int = 50
    backoff_max_ms: int = 2000
    max_batch: int = 100
    batch_window_ms: float = 0.0
    max_connections: int = 32

    def __post_init__(self) -> None:
        _check(
            self,
            "io.rpc",
            {
                "endpoints": parse_endpoints,
                "timeout_s": _float,
                "max_attempts": lambda v: _int(v, 1),
                "backoff_base_ms": lambda v: _int(v, 0, MAX_TIME_MS),
                "backoff_max_ms": lambda v: _int(v, 0, MAX_TIME_MS),
                "max_batch": lambda v: _int(v, 1),
                "batch_window_ms": lambda v: _float(v, allow_zero=True, maximum=MAX_TIME_MS),
                "max_connections": lambda v: _int(v, 1),
            },
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class IOConfig:
    """The IO subsystem's configuration (see the module docstring)."""

    data_dir: str = ".blockx"
    cache_max_entries: int = 10_000
    cache_max_bytes: int = 16 * 1024 * 1024
    max_task_scopes: int = 64
    blockdb: BlockDBConfig = field(default_factory=BlockDBConfig)
    rpc: RpcConfig = field(default_factory=RpcConfig)

    def __post_init__(self) -> None:
        _check(
            self,
            "io",
            {
                "data_dir": _text,
                "cache_max_entries": lambda v: _int(v, 0),
                "cache_max_bytes": lambda v: _int(v, 0),
                "max_task_scopes": lambda v: _int(v, 1),
            },
        )
        if not isinstance(self.blockdb, BlockDBConfig):
            raise IOConfigError(["io.blockdb: expected a BlockDBConfig"])
        if not isinstance(self.rpc, RpcConfig):
            raise IOConfigError(["io.rpc: expected an RpcConfig"])

    @property
    def sqlite_path(self) -> str:
        """The SQLite file: ``blockdb.sqlite_path``, else ``{data_dir}/blockdb.sqlite3``."""
        return self.blockdb.sqlite_path or os.path.join(self.data_dir, "blockdb.sqlite3")


#: (section, knob) -> environment variable.
ENV_VARS: Final[dict[tuple[str, str], str]] = {
    ("", "data_dir"): "BLOCKX_DATA_DIR",
    ("", "cache_max_entries"): "IO_CACHE_MAX_ENTRIES",
    ("", "cache_max_bytes"): "IO_CACHE_MAX_BYTES",
    ("", "max_task_scopes"): "IO_MAX_TASK_SCOPES",
    ("blockdb", "engine"): "BLOCKDB_ENGINE",
    ("blockdb", "sqlite_path"): "BLOCKDB_SQLITE_PATH",
    ("blockdb", "postgres_dsn"): "BLOCKDB_POSTGRES_DSN",
    ("blockdb", "postgres_pool_size"): "BLOCKDB_POSTGRES_POOL_SIZE",
    ("blockdb", "timeout_s"): "BLOCKDB_TIMEOUT_S",
    ("blockdb", "table_prefix"): "BLOCKDB_TABLE_PREFIX",
    ("blockdb", "sqlite_batch_max"): "BLOCKDB_SQLITE_BATCH_MAX",
    ("rpc", "endpoints"): "RPC_ENDPOINTS",
    ("rpc", "timeout_s"): "RPC_TIMEOUT_S",
    ("rpc", "max_attempts"): "RPC_MAX_ATTEMPTS",
    ("rpc", "backoff_base_ms"): "RPC_BACKOFF_BASE_MS",
    ("rpc", "backoff_max_ms"): "RPC_BACKOFF_MAX_MS",
    ("rpc", "max_batch"): "RPC_MAX_BATCH",
    ("rpc", "batch_window_ms"): "RPC_BATCH_WINDOW_MS",
    ("rpc", "max_connections"): "RPC_MAX_CONNECTIONS",
}

_SECTION_TYPES: Final = {"blockdb": BlockDBConfig, "rpc": RpcConfig}


def load_io_config(
    mapping: Mapping[str, Any] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    base: IOConfig | None = None,
) -> IOConfig:
    """``base`` (or the defaults) ← ``mapping`` ← the environment (``os.environ`` by default;
    pass ``env={}`` to ignore it).

    ``mapping`` is ``{"data_dir": ..., "cache_max_entries": ..., "blockdb": {...},
    "rpc": {"endpoints": {...}, ...}}``. Raises :class:`IOConfigError` naming every
    bad or unknown knob.
    """
    environ = os.environ if env is None else env
    values: dict[tuple[str, str], Any] = {}
    problems: list[str] = []
    known = {knob for knob in ENV_VARS}
    for key, value in (mapping or {}).items():
        if key in _SECTION_TYPES:
            if not isinstance(value, Mapping):
                problems.append(f"io.{key}: expected a table of knobs")
                continue
            for name, item in value.items():
                if (key, name) not in known:
                    problems.append(f"io.{key}.{name}: unknown knob")
                else:
                    values[(key, name)] = item
        elif ("", key) in known:
            values[("", key)] = value
        else:
            problems.append(f"io.{key}: unknown knob")
    for knob, variable in ENV_VARS.items():
        text = environ.get(variable)
        if text is not None and text.strip():
            values[knob] = text
    if problems:
        raise IOConfigError(problems)
    base = base or IOConfig()
    sections: dict[str, Any] = {}
    for section, cls in _SECTION_TYPES.items():
        changes = {name: v for (sec, name), v in values.items() if sec == section}
        current = getattr(base, section)
        try:
            sections[section] = dataclasses.replace(current, **changes) if changes else current
        except IOConfigError as exc:
            problems.extend(exc.problems)
        except (ValueError, TypeError) as exc:  # pragma: no cover - the checks raise IOConfigError
            problems.append(f"io.{section}: {exc}")
        del cls
    top = {name: v for (sec, name), v in values.items() if sec == ""}
    if problems:
        raise IOConfigError(problems)
    try:
        return dataclasses.replace(base, **top, **sections)
    except IOConfigError as exc:
        raise IOConfigError(list(exc.problems)) from None
