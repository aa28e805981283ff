"""ModuleRegistry: compiled user modules by digest, executed namespaces by task.

Theory of operation
-------------------
* **Compile cache** — source is compiled once per ``functionCodeDigest`` and the
  code object shared by every task (an LRU of
  ``BLOCKX_EXECUTOR_CODE_CACHE_MAX_ENTRIES`` entries, default 512, 0 =
  unlimited). A module that does not compile is cached as its syntax error.
  The filename is ``<blockx:{functionId}>`` and the source is registered in
  :mod:`linecache`, so tracebacks show the user's lines.
* **Namespaces** — a module is executed once per task (``exec`` into a fresh
  namespace pre-filled with :data:`PRELUDE`), so module globals never leak
  between tasks. The runtime counts each task's resident calls
  (:meth:`ModuleRegistry.acquire_task` / :meth:`~ModuleRegistry.release_task`);
  the task's namespaces are released when its last call ends.
* **Released namespaces** — a task that has one call in flight at a time
  would release its namespaces after every call and execute its module again
  for the next one. So the namespaces of the most recently released tasks
  are kept in a small LRU (``BLOCKX_EXECUTOR_RELEASED_NAMESPACE_CACHE``
  tasks, default 32; 0 drops them at once, the seed's exact rule). Only the
  same ``taskId`` ever takes them back (:meth:`~ModuleRegistry.acquire_task`);
  an evicted task's namespaces are dropped, and with them everything its
  module held.
* **Code fetch** — on a compile-cache miss :meth:`~ModuleRegistry.load_callable`
  asks ``source_loader(function_id, digest)`` (the SDK bridge's singleflight
  ``CallWaiting(function_code)``, which may suspend the calling greenlet).
* **Entry resolution** (docs/protocol.md, "Entry point"): ``entrySelector`` when it
  names a top-level ``def``; else the functionId's last segment (after the last
  ``/`` or ``.``); else ``def _`` (or ``_ = f``); else the first public ``def``.

Audited calls (``ExecuteCall.audit`` set) get a separate namespace built by
``restricted_namespace_factory`` when one is installed (the audit subsystem
provides it). Without one they run in the ordinary namespace, kept apart from
unaudited calls of the same task, and a warning is logged once.

Only the scheduler thread uses a registry; it takes no locks.
"""

from __future__ import annotations

import ast
import builtins
import datetime as _datetime
import json
import logging
import os
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any, Final

import blockx.chain
import blockx.db
import blockx.function
import blockx.http
from blockx.audit.entry import entry_from_defs, top_level_entries

from .compiled_module import CompiledModule, module_filename
from .errors import NoEntryFunctionError, UserCodeSyntaxError
from .local_reads import (
    DEFAULT_LOCAL_READ_CACHE,
    DEFAULT_LOCAL_READ_CACHE_BYTES,
    LOCAL_READ_CACHE_BYTES_ENV,
    LOCAL_READ_CACHE_ENV,
    TaskReads,
)

__all__ = [
    "CODE_CACHE_ENV",
    "DEFAULT_CODE_CACHE_MAX_ENTRIES",
    "DEFAULT_RELEASED_NAMESPACE_CACHE",
    "PRELUDE",
    "RELEASED_NAMESPACE_CACHE_ENV",
    "CompiledModule",
    "ModuleRegistry",
    "code_cache_max_entries_from_env",
    "local_read_cache_from_env",
    "module_filename",
    "released_namespace_cache_from_env",
    "resolve_entry_name",
]

_log = logging.getLogger("blockx.executor")

CODE_CACHE_ENV: Final = "BLOCKX_EXECUTOR_CODE_CACHE_MAX_ENTRIES"
DEFAULT_CODE_CACHE_MAX_ENTRIES: Final = 512
RELEASED_NAMESPACE_CACHE_ENV: Final = "BLOCKX_EXECUTOR_RELEASED_NAMESPACE_CACHE"
DEFAULT_RELEASED_NAMESPACE_CACHE: Final = 32

#: Names every user module sees without an import. Other parts of BlockX add
#: their SDK names here (``PRELUDE["Table"] = ...``) before the executor runs calls.
PRELUDE: dict[str, Any] = {
    "json": json,
    "Decimal": Decimal,
    "datetime": _datetime.datetime,
    "date": _datetime.date,
    "function": blockx.function,
    "Table": blockx.db.Table,
    "ChainState": blockx.chain.ChainState,
    "Http": blockx.http.Http,
}

#: The namespace key that ties a module's globals to its compiled source.
DIGEST_GLOBAL: Final = "__blockx_digest__"


def _non_negative_int_from_env(name: str, default: int, environ: Mapping[str, str] | None) -> int:
    env = os.environ if environ is None else environ
    text = env.get(name)
    if text is None or not text.strip():
        return default
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        _log.warning("%s=%r is not a non-negative integer; using %d", name, text, default)
        return default
    return value


def code_cache_max_entries_from_env(environ: Mapping[str, str] | None = None) -> int:
    """``BLOCKX_EXECUTOR_CODE_CACHE_MAX_ENTRIES`` (default 512; 0 = unlimited)."""
    return _non_negative_int_from_env(CODE_CACHE_ENV, DEFAULT_CODE_CACHE_MAX_ENTRIES, environ)


def released_namespace_cache_from_env(environ: Mapping[str, str] | None = None) -> int:
    """``BLOCKX_EXECUTOR_RELEASED_NAMESPACE_CACHE`` (default 32 tasks; 0 = keep none)."""
    return _non_negative_int_from_env(
        RELEASED_NAMESPACE_CACHE_ENV, DEFAULT_RELEASED_NAMESPACE_CACHE, environ
    )


def local_read_cache_from_env(environ: Mapping[str, str] | None = None) -> tuple[int, int]:
    """``(max_entries, max_bytes)`` of each task's immutable-read cache:
    ``BLOCKX_EXECUTOR_LOCAL_READ_CACHE`` (default 4096 answers; 0 = off) and
    ``BLOCKX_EXECUTOR_LOCAL_READ_CACHE_BYTES`` (default 8 MiB; 0 = off)."""
    return (
        _non_negative_int_from_env(LOCAL_READ_CACHE_ENV, DEFAULT_LOCAL_READ_CACHE, environ),
        _non_negative_int_from_env(
            LOCAL_READ_CACHE_BYTES_ENV, DEFAULT_LOCAL_READ_CACHE_BYTES, environ
        ),
    )


def resolve_entry_name(
    top_level_defs: tuple[str, ...],
    underscore_alias: bool,
    entry_selector: str,
    function_id: str,
) -> str | None:
    """The entry function's name by the protocol's rules, or None when nothing fits."""
    if entry_selector and (
        entry_selector in top_level_defs or (entry_selector == "_" and underscore_alias)
    ):
        return entry_selector
    return entry_from_defs(top_level_defs, underscore_alias, function_id)


class _CompileFailure:
    """A digest whose source does not compile (cached like a success)."""

    __slots__ = ("error",)

    def __init__(self, error: SyntaxError) -> None:
        self.error = error


class _LoadedModule:
    """A module executed for one task: its namespace and resolved entries."""

    __slots__ = ("compiled", "entries", "namespace")

    def __init__(self, compiled: CompiledModule, namespace: dict[str, Any]) -> None:
        self.compiled = compiled
        self.namespace = namespace
        self.entries: dict[tuple[str, str], Callable[..., Any]] = {}


class _TaskModules:
    """One task's namespaces and immutable reads (None: the read cache is off);
    ``calls`` counts its resident calls."""

    __slots__ = ("calls", "modules", "reads", "restricted_modules")

    def __init__(self, reads: TaskReads | None) -> None:
        self.calls = 0
        self.modules: dict[str, _LoadedModule] = {}
        self.restricted_modules: dict[str, _LoadedModule] = {}
        self.reads = reads

    def __repr__(self) -> str:
        return (
            f"_TaskModules(calls={self.calls}, modules={len(self.modules)}, "
            f"restricted={len(self.restricted_modules)})"
        )


class ModuleRegistry:
    """Compile LRU by digest plus per-task namespaces (see the module doc).

    ``max_entries`` bounds the compile cache (None: from the environment, 0 =
    unlimited); ``released_namespace_cache`` bounds how many released tasks
    keep their namespaces (None: from the environment, 0 = none);
    ``local_read_cache`` is ``(max_entries, max_bytes)`` of each task's
    :class:`~blockx.executor.local_reads.TaskReads` (None: from the environment;
    a 0: no read cache).
    """

    def __init__(
        self,
        *,
        max_entries: int | None = None,
        prelude: Mapping[str, Any] | None = None,
        restricted_namespace_factory: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        released_namespace_cache: int | None = None,
        local_read_cache: tuple[int, int] | None = None,
    ) -> None:
        self.max_entries = code_cache_max_entries_from_env() if max_entries is None else max_entries
        if self.max_entries < 0:
            raise ValueError(f"max_entries must be >= 0 (0 = unlimited), got {self.max_entries}")
        if released_namespace_cache is None:
            released_namespace_cache = released_namespace_cache_from_env()
        if released_namespace_cache < 0:
            raise ValueError(
                f"released_namespace_cache must be >= 0 (0 = none), got {released_namespace_cache}"
            )
        self.released_namespace_cache = released_namespace_cache
        if local_read_cache is None:
            local_read_cache = local_read_cache_from_env()
        #: (max_entries, max_bytes) of each task's immutable-read cache; a 0: off.
        self.local_read_cache = local_read_cache
        # The module-level PRELUDE dict itself unless overridden, so later additions count.
        self.prelude: Mapping[str, Any] = PRELUDE if prelude is None else prelude
        self.restricted_namespace_factory = restricted_namespace_factory
        self._code: OrderedDict[str, CompiledModule | _CompileFailure] = OrderedDict()
        self._alive: weakref.WeakValueDictionary[str, CompiledModule] = (
            weakref.WeakValueDictionary()
        )
        self._tasks: dict[str, _TaskModules] = {}  # tasks with resident calls
        # Released tasks whose namespaces are kept, least recently released first.
        self._released: OrderedDict[str, _TaskModules] = OrderedDict()
        self._warned_unrestricted = False
        self.compiles = 0
        self.cache_hits = 0
        self.cache_misses = 0
        self.evictions = 0
        self.module_execs = 0
        self.namespace_reuses = 0  # released tasks taken back with their namespaces
        self.released_evictions = 0

    def __repr__(self) -> str:
        limit = self.max_entries or "unlimited"
        return (
            f"ModuleRegistry(code={len(self._code)}/{limit}, tasks={len(self._tasks)}, "
            f"released={len(self._released)}/{self.released_namespace_cache})"
        )

    # --- task lifetime ---------------------------------------------------------------

    def acquire_task(self, task_id: str) -> TaskReads | None:
        """A call of ``task_id`` became resident (the task takes back its released
        namespaces, if they are still kept); returns the task's immutable-read cache
        (None when it is off)."""
        task = self._tasks.get(task_id)
        if task is None:
            task = self._released.pop(task_id, None)
            if task is None:
                task = _TaskModules(self._new_reads())
            else:
                self.namespace_reuses += 1
            self._tasks[task_id] = task
        task.calls += 1
        return task.reads

    def _new_reads(self) -> TaskReads | None:
        entries, nbytes = self.local_read_cache
        return TaskReads(entries, nbytes) if entries and nbytes else None

    def release_task(self, task_id: str) -> None:
        """A call of ``task_id`` ended; after the last one the task's namespaces are
        kept among the released (evicting the least recently released) or dropped."""
        task = self._tasks.get(task_id)
        if task is None:
            return
        task.calls -= 1
        if task.calls <= 0:
            del self._tasks[task_id]
            limit = self.released_namespace_cache
            if limit and (task.modules or task.restricted_modules):
                released = self._released
                released[task_id] = task
                if len(released) > limit:
                    released.popitem(last=False)
                    self.released_evictions += 1

    def task_count(self) -> int:
        """Tasks with resident calls."""
        return len(self._tasks)

    def released_task_count(self) -> int:
        """Released tasks whose namespaces are still kept."""
        return len(self._released)

    def has_namespace(self, task_id: str, digest: str) -> bool:
        """Whether ``task_id`` holds an executed ``digest`` (resident or kept after release)."""
        task = self._tasks.get(task_id) or self._released.get(task_id)
        return task is not None and (digest in task.modules or digest in task.restricted_modules)

    def drop_released(self) -> None:
        """Drop every kept namespace of released tasks (their memory goes with them)."""
        self._released.clear()

    # --- compile cache ---------------------------------------------------------------

    def cached(self, digest: str) -> CompiledModule | None:
        """The compiled module for ``digest`` if cached (refreshes its LRU position)."""
        entry = self._code.get(digest)
        if entry is None:
            return None
        self._code.move_to_end(digest)
        return entry if isinstance(entry, CompiledModule) else None

    def compile_source(self, function_id: str, digest: str, source: str) -> CompiledModule:
        """Compile and cache ``source`` under ``digest``.

        Raises :class:`UserCodeSyntaxError` (also cached, so a broken module is
        parsed once). The caller vouches that ``source`` matches ``digest``.
        """
        entry = self._code.get(digest)
        if entry is None:
            entry = self._compile(function_id, digest, source)
            self._store(digest, entry)
        else:
            self._code.move_to_end(digest)
        if isinstance(entry, _CompileFailure):
            raise UserCodeSyntaxError(entry.error)
        return entry

    def _compile(
        self, function_id: str, digest: str, source: str
    ) -> CompiledModule | _CompileFailure:
        self.compiles += 1
        filename = module_filename(function_id)
        try:
            tree = ast.parse(source, filename, "exec")
            code = compile(tree, filename, "exec", dont_inherit=True)
        except SyntaxError as exc:
            return _CompileFailure(exc)
        except ValueError as bad:  # e.g. a NUL byte in the source (own name: compiled,
            # a name has one type)
            return _CompileFailure(SyntaxError(str(bad), (filename, 1, 1, "", 1, 1)))
        defs, alias = top_level_entries(tree)
        lines = source.splitlines(keepends=True)
        if lines and not lines[-1].endswith("\n"):
            lines[-1] += "\n"
        compiled = CompiledModule(
            code=code,
            digest=digest,
            function_id=function_id,
            lines=lines,
            top_level_defs=defs,
            underscore_alias=alias,
        )
        compiled.register_lines()
        self._alive[digest] = compiled
        return compiled

    def _store(self, digest: str, entry: CompiledModule | _CompileFailure) -> None:
        code = self._code
        code[digest] = entry
        code.move_to_end(digest)
        if self.max_entries:
            while len(code) > self.max_entries:
                code.popitem(last=False)
                self.evictions += 1

    def refresh_linecache(self, module_globals: Mapping[str, Any]) -> None:
        """Point :mod:`linecache` at the source of the module owning ``module_globals``.

        Two digests of one functionId share a filename; call this before
        formatting a traceback so each frame shows its own version's lines.
        """
        digest = module_globals.get(DIGEST_GLOBAL)
        if type(digest) is str:
            compiled = self._alive.get(digest)
            if compiled is not None:
                compiled.register_lines()

    # --- loading ---------------------------------------------------------------------

    def load_callable(
        self,
        task_id: str,
        function_id: str,
        digest: str,
        entry_selector: str,
        *,
        source_loader: Callable[[str, str], str],
        restricted: bool = False,
    ) -> Callable[..., Any]:
        """The entry function of ``digest`` in ``task_id``'s namespace.

        On a compile-cache miss ``source_loader(function_id, digest)`` is called
        (it may suspend the calling greenlet and raises on a failed fetch). The
        module body runs once per task; an exception from it propagates as the
        user's error. Raises :class:`UserCodeSyntaxError` or
        :class:`NoEntryFunctionError` for a module that cannot serve the call.
        """
        task = self._tasks.get(task_id)
        if task is None:  # a caller that did not acquire the task: keep it for this call only
            task = _TaskModules(None)
        modules = task.restricted_modules if restricted else task.modules
        loaded = modules.get(digest)
        if loaded is None:
            loaded = self._load_module(modules, function_id, digest, restricted, source_loader)
        key = (entry_selector, function_id)
        entry = loaded.entries.get(key)
        if entry is None:
            entry = self._resolve_entry(loaded, entry_selector, function_id)
            loaded.entries[key] = entry
        return entry

    def _load_module(
        self,
        modules: dict[str, _LoadedModule],
        function_id: str,
        digest: str,
        restricted: bool,
        source_loader: Callable[[str, str], str],
    ) -> _LoadedModule:
        entry = self._code.get(digest)
        if entry is None:
            entry = self._alive.get(digest)  # evicted, but still held by a live task
            if entry is not None:
                self._store(digest, entry)
        if entry is None:
            self.cache_misses += 1
            source = source_loader(function_id, digest)
            entry = self._code.get(digest)  # another call may have compiled it meanwhile
            if entry is None:
                entry = self._compile(function_id, digest, source)
                self._store(digest, entry)
        else:
            self.cache_hits += 1
            self._code.move_to_end(digest)
        if isinstance(entry, _CompileFailure):
            raise UserCodeSyntaxError(entry.error)
        existing = modules.get(digest)  # a fetch may have suspended while another call loaded it
        if existing is not None:
            return existing
        namespace = self._new_namespace(entry, restricted)
        self.module_execs += 1
        exec(entry.code, namespace)
        loaded = modules.get(digest)
        if loaded is None:
            loaded = modules[digest] = _LoadedModule(entry, namespace)
        return loaded

    def _new_namespace(self, compiled: CompiledModule, restricted: bool) -> dict[str, Any]:
        namespace: dict[str, Any] = dict(self.prelude)
        namespace["__name__"] = compiled.function_id
        namespace["__file__"] = compiled.filename
        namespace["__builtins__"] = builtins
        namespace[DIGEST_GLOBAL] = compiled.digest
        if restricted:
            factory = self.restricted_namespace_factory
            if factory is not None:
                return factory(namespace)
            if not self._warned_unrestricted:
                self._warned_unrestricted = True
                _log.warning(
                    "audited call runs without a restricted namespace: "
                    "no restricted_namespace_factory is installed"
                )
        return namespace

    @staticmethod
    def _resolve_entry(
        loaded: _LoadedModule, entry_selector: str, function_id: str
    ) -> Callable[..., Any]:
        compiled = loaded.compiled
        name = resolve_entry_name(
            compiled.top_level_defs, compiled.underscore_alias, entry_selector, function_id
        )
        if name is None:
            raise NoEntryFunctionError(
                f"no entry function in {compiled.filename}: define `def _(...)` "
                f"(or a def named after the function id, or pass entrySelector)"
            )
        entry: Any = loaded.namespace.get(name)
        if not callable(entry):
            raise NoEntryFunctionError(
                f"entry {name!r} of {compiled.filename} is {type(entry).__name__}, not a function"
            )
        function: Callable[..., Any] = entry
        return function

    def stats(self) -> dict[str, int]:
        return {
            "code_entries": len(self._code),
            "tasks": len(self._tasks),
            "compiles": self.compiles,
            "cache_hits": self.cache_hits,
            "cache_misses": self.cache_misses,
            "evictions": self.evictions,
            "module_execs": self.module_execs,
            "released_tasks": len(self._released),
            "namespace_reuses": self.namespace_reuses,
            "released_evictions": self.released_evictions,
        }
