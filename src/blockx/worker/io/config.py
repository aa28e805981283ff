"""IOConfig: the IO subsystem's knobs — cache bounds, the table store, the node endpoints.

Theory of operation
-------------------
Declared like the worker's sections (:mod:`blockx.worker.config`): every knob
is a field made by :func:`~blockx.worker.config_kinds.knob` carrying its kind
(type and bounds), default, environment variable and meaning. :data:`IO_SCHEMA`
hands them to the one configuration model (:mod:`blockx.worker.config_model`),
which resolves IO and worker knobs alike (both together:
:mod:`blockx.worker.config_layers`), and ``docs/configuration.md``'s IO table is
rendered from these fields.
Building a section directly runs the same checks (:func:`check_section`) and
the cross-knob ones (``engine='postgres'`` needs a DSN).

:func:`load_io_config` layers defaults ← a mapping (a config file's ``io``
table, a task file's ``io`` section) ← the environment. Bad values raise one
:class:`IOConfigError` (a :class:`~blockx.worker.config_kinds.ConfigError`)
whose lines name the knob, or the environment variable, and what is wrong::

    io.blockdb.engine='mysql': expected one of auto, sqlite, postgres
    RPC_ENDPOINTS='eth': expected a JSON object {"chain": ["http://...", ...]} or ...
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from blockx.worker.config_kinds import Checked, ConfigError, check_section, knob
from blockx.worker.config_model import Schema, environment_layer, mapping_layer, resolve

__all__ = [
    "IO_SCHEMA",
    "BlockDBConfig",
    "HttpConfig",
    "IOConfig",
    "IOConfigError",
    "RpcConfig",
    "load_io_config",
    "parse_allow_hosts",
    "parse_endpoints",
    "parse_rates",
]

ENGINES: Final = ("auto", "sqlite", "postgres")


class IOConfigError(ConfigError):
    """One or more bad IO configuration values; each line names one."""


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


def parse_rates(value: Any) -> dict[str, float]:
    """``max_requests_per_s``: ``{"eth": 50, "base": 10}``, JSON text, ``eth=50;base=10``,
    or one number for every chain (key ``"*"``); 0 or empty: no limit."""
    expected = 'a number, or a mapping {"chain": requests per second} (JSON or eth=50;base=10)'
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return {}
        if text.startswith("{"):
            try:
                value = json.loads(text)
            except ValueError:
                raise ValueError(expected) from None
        elif "=" in text:
            pairs: dict[str, str] = {}
            for part in text.split(";"):
                chain, _sep, rate_text = part.partition("=")
                if not chain.strip():
                    raise ValueError(expected)
                pairs[chain.strip()] = rate_text.strip()
            value = pairs
        else:
            value = {"*": text}
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        value = {"*": value}
    if not isinstance(value, Mapping):
        raise ValueError(expected)
    rates: dict[str, float] = {}
    for chain, given in value.items():
        if not isinstance(chain, str) or not chain:
            raise ValueError(f"chain names must be non-empty strings, not {chain!r}")
        try:
            rate = _float(given, allow_zero=True, maximum=1e9)
        except ValueError:
            raise ValueError(
                f'chain {chain!r} ("*": every chain): a non-negative number of requests per second'
            ) from None
        if rate > 0:
            rates[chain] = rate
    return rates


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


def _positive(value: Any) -> int:
    return _int(value, 1)


def _non_negative(value: Any) -> int:
    return _int(value, 0)


def _duration_ms(value: Any) -> int:
    return _int(value, 0, MAX_TIME_MS)


def _window_ms(value: Any) -> float:
    return _float(value, allow_zero=True, maximum=MAX_TIME_MS)


POSITIVE_INT: Final = Checked(_positive)
NON_NEGATIVE_INT: Final = Checked(_non_negative)
DURATION_MS: Final = Checked(_duration_ms)
TIME_S: Final = Checked(_float)
TEXT: Final = Checked(_text)
OPTIONAL_TEXT: Final = Checked(_optional_text)


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockDBConfig:
    """The ``blockdb`` table store."""

    engine: str = knob(
        "auto",
        kind=Checked(_choice),
        env="BLOCKDB_ENGINE",
        doc="``sqlite``, ``postgres``, or ``auto``: PostgreSQL when a DSN is set, else SQLite.",
    )
    sqlite_path: str | None = knob(
        None,
        kind=OPTIONAL_TEXT,
        env="BLOCKDB_SQLITE_PATH",
        default_text="{data_dir}/blockdb.sqlite3",
        doc="The SQLite file, created (with its directory) on first use.",
    )
    postgres_dsn: str | None = knob(
        None,
        kind=OPTIONAL_TEXT,
        env="BLOCKDB_POSTGRES_DSN",
        default_text="none",
        doc="``postgresql://user:pass@host:port/db`` (anything asyncpg accepts).",
    )
    postgres_pool_size: int = knob(
        10,
        kind=POSITIVE_INT,
        env="BLOCKDB_POSTGRES_POOL_SIZE",
        doc="Connections in the asyncpg pool (at most).",
    )
    timeout_s: float = knob(
        30.0,
        kind=TIME_S,
        env="BLOCKDB_TIMEOUT_S",
        default_text="30",
        doc="Per statement: PostgreSQL command timeout; SQLite busy timeout.",
    )
    table_prefix: str = knob(
        "bx_",
        kind=Checked(_prefix),
        env="BLOCKDB_TABLE_PREFIX",
        doc="SQL name of table ``t`` is ``{prefix}t`` (both engines).",
    )
    sqlite_batch_max: int = knob(
        256,
        kind=POSITIVE_INT,
        env="BLOCKDB_SQLITE_BATCH_MAX",
        doc="Requests the SQLite thread runs per transaction (one commit per batch).",
    )

    def __post_init__(self) -> None:
        check_section(self, "io.blockdb", error=IOConfigError)
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
    """The ``rpc`` node client."""

    endpoints: Mapping[str, tuple[str, ...]] = knob(
        kind=Checked(parse_endpoints),
        env="RPC_ENDPOINTS",
        default_text="{}",
        default_factory=dict,
        doc='``{"eth": ["http://127.0.0.1:8545", ...]}``; the environment form is JSON or '
        "``eth=http://a,http://b;base=http://c``.",
    )
    timeout_s: float = knob(
        10.0,
        kind=TIME_S,
        env="RPC_TIMEOUT_S",
        default_text="10",
        doc="Per HTTP request (one JSON-RPC batch).",
    )
    max_attempts: int = knob(
        4,
        kind=POSITIVE_INT,
        env="RPC_MAX_ATTEMPTS",
        doc="Tries of a request on transient errors (connection, timeout, HTTP 5xx/429, "
        "JSON-RPC rate-limit errors), rotating endpoints.",
    )
    backoff_base_ms: int = knob(
        50,
        kind=DURATION_MS,
        env="RPC_BACKOFF_BASE_MS",
        doc="Backoff before retry n: ``min(max, base * 2^(n-1))``, with ±25% jitter.",
    )
    backoff_max_ms: int = knob(
        2000,
        kind=DURATION_MS,
        env="RPC_BACKOFF_MAX_MS",
        doc="Longest backoff before a retry (the ``max`` of ``backoff_base_ms``).",
    )
    max_batch: int = knob(
        100,
        kind=POSITIVE_INT,
        env="RPC_MAX_BATCH",
        doc="JSON-RPC requests per HTTP batch; 1 disables batching.",
    )
    batch_window_ms: float = knob(
        0.0,
        kind=Checked(_window_ms),
        env="RPC_BATCH_WINDOW_MS",
        default_text="0",
        doc="How long a batch collects requests; 0: what arrives within one event-loop turn.",
    )
    max_connections: int = knob(
        32,
        kind=POSITIVE_INT,
        env="RPC_MAX_CONNECTIONS",
        doc="Keep-alive HTTP connections per endpoint host (concurrent batches beyond this queue).",
    )
    max_requests_per_s: Mapping[str, float] = knob(
        kind=Checked(parse_rates),
        env="RPC_MAX_REQUESTS_PER_S",
        default_text="{}",
        default_factory=dict,
        doc="JSON-RPC requests per second per chain, tries included (a token bucket shared by "
        'all batches): ``{"eth": 50}``, or one number for every chain; env ``eth=50;base=10``. '
        "Empty or 0: no limit.",
    )
    retry_after_max_s: float = knob(
        60.0,
        kind=TIME_S,
        env="RPC_RETRY_AFTER_MAX_S",
        default_text="60",
        doc="The longest ``Retry-After`` (HTTP 429/503) waited for; a node asking for longer "
        "fails the requests at once (retryable).",
    )

    def __post_init__(self) -> None:
        check_section(self, "io.rpc", error=IOConfigError)

    def rate_of(self, chain: str) -> float | None:
        """``max_requests_per_s`` of ``chain`` (its own, else ``"*"``); None: no limit."""
        rates = self.max_requests_per_s
        return rates.get(chain, rates.get("*"))


# --- io.http (the ``http`` backend: Http.get_json / post_json) ------------------------------

_HOST_RE: Final = r"(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"


def parse_allow_hosts(value: Any) -> tuple[str, ...]:
    """Host names (``api.example.com``, optionally ``host:port``; IP literals too, an IPv6
    one in brackets) from a list, JSON text or ``a.com,b.com:8443``; lowercased."""
    import re

    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                value = json.loads(text)
            except ValueError:
                raise ValueError('a JSON list ["api.example.com", ...] or a,b,c') from None
        else:
            value = [part.strip() for part in text.split(",") if part.strip()]
    if not isinstance(value, (list, tuple)):
        raise ValueError('a list of host names ["api.example.com", "127.0.0.1:8080", ...]')
    hosts: list[str] = []
    for item in value:
        if not isinstance(item, str) or not item.strip():
            raise ValueError(f"host names as strings, not {item!r}")
        host = item.strip().lower()
        name, port = host, ""
        if host.startswith("["):
            end = host.find("]")
            name, rest = host[: end + 1], host[end + 1 :]
            if end < 0 or (rest and not rest.startswith(":")):
                raise ValueError(f"{item!r} is not a host name (host or host:port)")
            port = rest[1:]
        elif host.count(":") == 1:
            name, port = host.split(":")
        ok_name = (name.startswith("[") and name.endswith("]") and len(name) > 2) or bool(
            re.fullmatch(_HOST_RE, name)
        )
        ok_port = not port or (port.isdigit() and 0 < int(port) < 65536)
        if not ok_name or not ok_port or "/" in host:
            raise ValueError(
                f"{item!r} is not a host name: exact names only (api.example.com or "
                "api.example.com:8443), no scheme, path or wildcard"
            )
        hosts.append(host)
    return tuple(dict.fromkeys(hosts))


def _rate(value: Any) -> float:
    """Requests per second: 0 (no limit) or positive."""
    return _float(value, allow_zero=True, maximum=1_000_000)


@dataclass(frozen=True, slots=True, kw_only=True)
class HttpConfig:
    """The ``http`` backend (``Http.get_json`` / ``Http.post_json``: docs/http.md)."""

    allow_hosts: tuple[str, ...] = knob(
        kind=Checked(parse_allow_hosts),
        env="HTTP_ALLOW_HOSTS",
        default_text="[]",
        default_factory=tuple,
        doc="Hosts user code may reach (``api.example.com`` or ``host:port``, exact names); empty: "
        "no HTTP at all. Loopback, private and link-local addresses only when listed as such "
        "(by that name or IP). The environment form is ``a.com,b.com:8443`` or a JSON list.",
    )
    max_concurrency: int = knob(
        16,
        kind=POSITIVE_INT,
        env="HTTP_MAX_CONCURRENCY",
        doc="Requests in flight per host at once (the others queue).",
    )
    max_requests_per_s: float = knob(
        0.0,
        kind=Checked(_rate),
        env="HTTP_MAX_REQUESTS_PER_S",
        default_text="0",
        doc="Requests started per second per host (a token bucket); 0: no limit.",
    )
    timeout_s: float = knob(
        10.0,
        kind=TIME_S,
        env="HTTP_TIMEOUT_S",
        default_text="10",
        doc="Per request, redirects included (a call's own budget cuts a GET off sooner).",
    )
    max_redirects: int = knob(
        5,
        kind=NON_NEGATIVE_INT,
        env="HTTP_MAX_REDIRECTS",
        doc="Redirects followed per request, each checked against ``allow_hosts``; 0 refuses them.",
    )
    max_response_bytes: int = knob(
        8 * 1024 * 1024,
        kind=POSITIVE_INT,
        env="HTTP_MAX_RESPONSE_BYTES",
        doc="Largest response body accepted (a longer one fails the request).",
    )

    def __post_init__(self) -> None:
        check_section(self, "io.http", error=IOConfigError)


@dataclass(frozen=True, slots=True, kw_only=True)
class IOConfig:
    """The IO subsystem's configuration (see the module docstring)."""

    data_dir: str = knob(
        ".blockx",
        kind=TEXT,
        env="BLOCKX_DATA_DIR",
        doc="Where embedded state lives (the SQLite table store). A relative value is relative "
        "to the working directory; `blockx run` with no value set puts it next to the task file.",
    )
    cache_max_entries: int = knob(
        10_000,
        kind=NON_NEGATIVE_INT,
        env="IO_CACHE_MAX_ENTRIES",
        doc="Entries of one task's read cache; 0 disables caching (singleflight stays). "
        "1,024 until the task repeats a read (a hit, or a read joining an equal one in "
        "flight).",
    )
    cache_max_bytes: int = knob(
        16 * 1024 * 1024,
        kind=NON_NEGATIVE_INT,
        env="IO_CACHE_MAX_BYTES",
        doc="Estimated bytes of one task's read cache (answers + keys); 0 disables caching.",
    )
    max_task_scopes: int = knob(
        64,
        kind=POSITIVE_INT,
        env="IO_MAX_TASK_SCOPES",
        doc="Task scopes the subsystem keeps when used as one worker-wide IO handler (least "
        "recently used go first; a task given its own scope is not counted).",
    )
    blockdb: BlockDBConfig = field(default_factory=BlockDBConfig)
    rpc: RpcConfig = field(default_factory=RpcConfig)
    http: HttpConfig = field(default_factory=HttpConfig)

    def __post_init__(self) -> None:
        check_section(self, "io", error=IOConfigError)
        if not isinstance(self.blockdb, BlockDBConfig):
            raise IOConfigError(["io.blockdb: expected a BlockDBConfig"])
        if not isinstance(self.rpc, RpcConfig):
            raise IOConfigError(["io.rpc: expected an RpcConfig"])
        if not isinstance(self.http, HttpConfig):
            raise IOConfigError(["io.http: expected an HttpConfig"])

    @property
    def sqlite_path(self) -> str:
        """The SQLite file: ``blockdb.sqlite_path``, else ``{data_dir}/blockdb.sqlite3``."""
        return self.blockdb.sqlite_path or os.path.join(self.data_dir, "blockdb.sqlite3")


#: Sub-section name -> its class (``""`` is :class:`IOConfig`'s own knobs).
_SECTION_TYPES: Final = {"blockdb": BlockDBConfig, "rpc": RpcConfig, "http": HttpConfig}
#: (sub-section or ``""``, knob) -> section class, in table order.
IO_SECTIONS: Final[dict[str, type[Any]]] = {"": IOConfig, **_SECTION_TYPES}


def iter_io_knobs() -> Iterator[tuple[str, str, dataclasses.Field[Any]]]:
    """``(sub-section or "", field name, dataclass field)`` of every IO knob, in table order."""
    for section, cls in IO_SECTIONS.items():
        for f in dataclasses.fields(cls):
            if f.init and "kind" in f.metadata:
                yield section, f.name, f


#: The IO knobs, for :func:`blockx.worker.config_model.resolve`: named ``io.*``, in a
#: configuration file under ``[io]``, ``[io.blockdb]``, ``[io.rpc]``, ``[io.http]``.
IO_SCHEMA: Final = Schema(
    part="io",
    root=IOConfig,
    sections=IO_SECTIONS,
    prefix="io",
    title="IO",
    unknown_knob="{prefix}{name}: unknown knob",
)

#: (section, knob) -> environment variable (read from the fields).
ENV_VARS: Final[dict[tuple[str, str], str]] = {
    (section, name): f.metadata["env"] for section, name, f in iter_io_knobs()
}


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
    bad or unknown knob (a bad variable by its name). The layering is
    :func:`blockx.worker.config_model.resolve`'s, as for every knob.
    """
    environ = os.environ if env is None else env
    schemas = (IO_SCHEMA,)
    layers = [
        mapping_layer(schemas, mapping or {}, source="mapping", annotate=False, within=IO_SCHEMA),
        environment_layer(schemas, environ),
    ]
    try:
        config = resolve(schemas, layers, bases={"io": base}).configs["io"]
    except ConfigError as exc:
        raise IOConfigError(exc.problems) from None
    assert isinstance(config, IOConfig)
    return config
