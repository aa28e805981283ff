"""The IO subsystem: a registry of backends, their instances, task scopes and statistics.

Theory of operation
-------------------
A :class:`BackendRegistry` maps backend names to a backend *instance* or a
*factory* ``factory(config: IOConfig) -> IOBackend``.
:func:`default_registry` holds ``blockdb`` (SQLite or PostgreSQL, by
``io.blockdb``) and ``rpc``; a deployment registers more
(``registry.register_factory("prices", make_price_feed)``), which user code
reaches with ``blockx.sdk`` ``read_req`` / ``write_req`` / ``capability_req``.

An :class:`IOSubsystem` builds each backend on its first request (so the
SQLite file, the PostgreSQL pool and the HTTP session appear only when used)
and closes them all in :meth:`IOSubsystem.close`. It serves tasks two ways:

* :meth:`IOSubsystem.task_scope` — a dedicated
  :class:`~blockx.worker.io.scope.TaskIOScope` (``Task(io_handler=scope)``):
  the task's cache lives exactly as long as the scope. The CLI does this, one
  scope per task, and prints ``scope.stats``.
* as an :class:`~blockx.worker.io.IOHandler` itself (``Worker(io_handlers=io)``):
  requests are routed to a scope per ``task_id`` made on first use; at most
  ``max_task_scopes`` are kept (least recently used dropped — a dropped
  scope's cache is gone, which costs repeated reads, never wrong answers);
  :meth:`IOSubsystem.end_task` drops one at once.

Every scope's statistics roll up into :attr:`IOSubsystem.stats`.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from .backend import IOBackend
from .config import IOConfig, load_io_config
from .handler import IOReturn, io_error
from .scope import TaskIOScope
from .stats import IOStats

__all__ = [
    "BackendFactory",
    "BackendRegistry",
    "IOSubsystem",
    "default_registry",
    "make_blockdb_backend",
    "make_http_backend",
    "make_rpc_backend",
]

_log = logging.getLogger("blockx.worker.io")

BackendFactory = Callable[[IOConfig], IOBackend]


class BackendRegistry:
    """Backend names → instances or factories (see the module docstring)."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: dict[str, tuple[str, Any]] = {}

    def __repr__(self) -> str:
        return f"BackendRegistry({self.names()})"

    def register(self, name: str, backend: IOBackend, *, replace: bool = False) -> None:
        """Serve ``name`` with ``backend`` (an instance; its ``close`` runs at subsystem close)."""
        if not isinstance(backend, IOBackend):
            raise TypeError(
                f"backend {name!r}: {backend!r} lacks name/prepare/execute/close "
                "(see blockx.worker.io.backend.IOBackend)"
            )
        self._add(name, ("instance", backend), replace)

    def register_factory(
        self, name: str, factory: BackendFactory, *, replace: bool = False
    ) -> None:
        """Serve ``name`` with ``factory(config)``, called on the first request."""
        if not callable(factory):
            raise TypeError(f"backend {name!r}: the factory must be callable")
        self._add(name, ("factory", factory), replace)

    def _add(self, name: str, entry: tuple[str, Any], replace: bool) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError("a backend name must be a non-empty string")
        if name in self._entries and not replace:
            raise ValueError(f"backend {name!r} is already registered (pass replace=True)")
        self._entries[name] = entry

    def unregister(self, name: str) -> None:
        self._entries.pop(name, None)

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def build(self, name: str, config: IOConfig) -> IOBackend | None:
        """The backend for ``name``: the instance, or a new one from the factory."""
        entry = self._entries.get(name)
        if entry is None:
            return None
        kind, value = entry
        if kind == "instance":
            return value  # type: ignore[no-any-return]
        backend = value(config)
        if not isinstance(backend, IOBackend):
            raise TypeError(f"backend {name!r}: the factory returned {backend!r}")
        return backend

    def copy(self) -> BackendRegistry:
        clone = BackendRegistry()
        clone._entries = dict(self._entries)
        return clone


def make_blockdb_backend(config: IOConfig) -> IOBackend:
    """``blockdb`` on SQLite (``{data_dir}/blockdb.sqlite3``) or PostgreSQL (a DSN)."""
    from .blockdb import BlockDBBackend

    settings = config.blockdb
    if settings.effective_engine == "postgres":
        from .blockdb_postgres import PostgresEngine

        assert settings.postgres_dsn is not None
        engine: Any = PostgresEngine(
            settings.postgres_dsn,
            pool_size=settings.postgres_pool_size,
            timeout_s=settings.timeout_s,
        )
    else:
        from .blockdb_sqlite import SQLiteEngine

        engine = SQLiteEngine(
            config.sqlite_path,
            busy_timeout_s=settings.timeout_s,
            batch_max=settings.sqlite_batch_max,
        )
    return BlockDBBackend(engine, table_prefix=settings.table_prefix)


def make_rpc_backend(config: IOConfig) -> IOBackend:
    """``rpc`` to ``io.rpc.endpoints``."""
    from .rpc import RpcBackend

    return RpcBackend(config.rpc)


def make_http_backend(config: IOConfig) -> IOBackend:
    """``http`` to the hosts of ``io.http.allow_hosts`` (docs/http.md)."""
    from .http_backend import HttpBackend

    return HttpBackend(config.http)


def default_registry() -> BackendRegistry:
    """``blockdb``, ``rpc`` and ``http``, built from the subsystem's :class:`IOConfig`."""
    registry = BackendRegistry()
    registry.register_factory("blockdb", make_blockdb_backend)
    registry.register_factory("rpc", make_rpc_backend)
    registry.register_factory("http", make_http_backend)
    return registry


def _abandoned_note(name: str, backend: Any, grace_s: float) -> str:
    """What closing ``backend`` left undone, for the run's summary."""
    engine = getattr(backend, "engine", None)
    pending = getattr(engine, "in_flight", None)
    what = (
        f"{pending} operation{'s' if pending != 1 else ''} still running"
        if isinstance(pending, int) and pending > 0
        else "still busy"
    )
    return f"{name}: {what} {grace_s:g} s after the task ended: abandoned, not finished"


class IOSubsystem:
    """Backends, task scopes and statistics of one worker (see the module docstring).

    ``IOSubsystem()`` uses :func:`load_io_config` (defaults ← environment) and
    :func:`default_registry`. Use it as ``async with`` or call :meth:`close`.
    """

    __slots__ = ("_backends", "_broken", "_closed", "_scopes", "config", "registry", "stats")

    def __init__(
        self,
        config: IOConfig | Mapping[str, Any] | None = None,
        registry: BackendRegistry | None = None,
    ) -> None:
        if config is None:
            config = load_io_config()
        elif not isinstance(config, IOConfig):
            config = load_io_config(config, env={})
        self.config = config
        self.registry = registry if registry is not None else default_registry()
        self.stats = IOStats()
        self._backends: dict[str, IOBackend] = {}
        self._broken: dict[str, str] = {}
        self._scopes: OrderedDict[str, TaskIOScope] = OrderedDict()
        self._closed = False

    def __repr__(self) -> str:
        return (
            f"IOSubsystem(backends={self.registry.names()}, built={sorted(self._backends)}, "
            f"scopes={len(self._scopes)}, {self.stats!r})"
        )

    # --- backends -------------------------------------------------------------------------------

    def backend(self, name: str) -> IOBackend | None:
        """The backend serving ``name`` (built on first use), or None when unknown.

        Raises :class:`RuntimeError` when building it failed (the message says why).
        """
        backend = self._backends.get(name)
        if backend is not None:
            return backend
        if self._closed:
            raise RuntimeError("the IO subsystem is closed")
        broken = self._broken.get(name)
        if broken is not None:
            raise RuntimeError(broken)
        try:
            backend = self.registry.build(name, self.config)
        except Exception as exc:
            message = f"IO backend {name!r} could not be set up: {exc}"
            _log.error("%s", message)
            self._broken[name] = message
            raise RuntimeError(message) from exc
        if backend is not None:
            self._backends[name] = backend
        return backend

    def _resolve(self, name: str) -> IOBackend | None:
        return self.backend(name)

    # --- task scopes ----------------------------------------------------------------------------

    def task_scope(self, task_id: str) -> TaskIOScope:
        """A new scope for one task: give it to the task as its IO handler."""
        return TaskIOScope(
            task_id,
            self._resolve,
            backend_names=self.registry.names,
            cache_max_entries=self.config.cache_max_entries,
            cache_max_bytes=self.config.cache_max_bytes,
            stats_parent=self.stats,
        )

    def handle_io(
        self, task_id: str, call_id: str, payload: dict[str, Any], sidecar: bytes | None
    ) -> IOReturn:
        """:class:`~blockx.worker.io.IOHandler`: route to the scope of ``task_id``."""
        scopes = self._scopes
        scope = scopes.get(task_id)
        if scope is None:
            if self._closed:
                return io_error("the IO subsystem is closed", retryable=True)
            scope = scopes[task_id] = self.task_scope(task_id)
            while len(scopes) > self.config.max_task_scopes:
                _, dropped = scopes.popitem(last=False)
                dropped.close()
        else:
            scopes.move_to_end(task_id)
        try:
            return scope.handle_io(task_id, call_id, payload, sidecar)
        except RuntimeError as exc:  # a backend that could not be built
            return io_error(str(exc))

    def end_task(self, task_id: str) -> None:
        """Drop the routed scope of ``task_id`` (its cache); its counts stay in :attr:`stats`."""
        scope = self._scopes.pop(task_id, None)
        if scope is not None:
            scope.close()

    def scope_of(self, task_id: str) -> TaskIOScope | None:
        """The routed scope of ``task_id``, if it has one."""
        return self._scopes.get(task_id)

    # --- lifecycle ------------------------------------------------------------------------------

    async def close(self, *, grace_s: float | None = None) -> list[str]:
        """Close every backend that was built (engines, pools, HTTP sessions). Idempotent.

        ``grace_s``: the most the closes may take together. A backend still busy then (a
        SQLite write waiting for a lock another process holds, a query that does not
        end) is abandoned: its operations are left undone (the process exits without
        them). Returns one line per abandoned backend, saying what was left (empty:
        every backend closed)."""
        if self._closed:
            return []
        self._closed = True
        for scope in self._scopes.values():
            scope.close()
        self._scopes.clear()
        backends, self._backends = self._backends, {}
        loop = asyncio.get_running_loop()
        deadline = None if grace_s is None else loop.time() + grace_s
        abandoned: list[str] = []
        for name, backend in backends.items():
            try:
                if deadline is None:
                    await backend.close()
                else:
                    await asyncio.wait_for(backend.close(), max(deadline - loop.time(), 0.01))
            except TimeoutError:
                abandoned.append(_abandoned_note(name, backend, grace_s or 0.0))
                _log.warning("IO backend %s: %s", name, abandoned[-1])
            except Exception:
                _log.exception("closing IO backend %s failed", name)
        return abandoned

    async def __aenter__(self) -> IOSubsystem:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()
