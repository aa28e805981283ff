"""The test environment: one task's world, run in process (the :class:`TestProvider`).

Theory of operation
-------------------
A :class:`TestEnvironment` is what one task sees in the engine: its functions,
its tables, its chain, its call cache — here all in this process. Its
:class:`TestProvider` is the :class:`blockx.sdk.Provider` installed (with
:func:`blockx.sdk.runtime.set_provider`) while one of its functions runs, so the
prelude's ``Table``, ``ChainState`` and ``function`` — the executor's own
objects, unchanged — reach

* ``blockdb`` reads and writes → :class:`~blockx.testing.tables.InMemoryTables`;
* ``rpc`` reads → :class:`~blockx.testing.fake_chain.FakeChain`;
* other backends → ``backends[name](operation, params)`` when the test gave one;
* sub-calls → another function of the environment, run right here (same
  tables, chain and clock);
* ``sleep`` (and ``time.sleep``) → the :class:`~blockx.testing.clock.VirtualClock`.

Modules are loaded by the executor's own
:class:`~blockx.executor.module_registry.ModuleRegistry` (its ``PRELUDE``, its
entry rules, its filenames for tracebacks), each executed once per environment
as the engine executes it once per task. With ``audit=True`` every function is
first checked by the engine's auditor (a rejection raises
:class:`AuditRejectedError` at load) and then runs in the restricted namespace
of :mod:`blockx.executor.restricted_runtime`.

What travels over the wire in the engine travels through its encoder here:
arguments and outputs are round-tripped through ``blockx.wire`` JSON (tuples
become lists; a value JSON cannot hold raises ``NotSerializableError``, as the
call would fail with ``output_not_serializable``).

Sub-calls follow the worker's rules: the wire rule for arguments (a list is
spread, anything else is the one argument), a successful output cached per
environment by ``(function, args)`` (the task's call cache: an equal sub-call
runs once), a cycle refused with ``SubcallCycleDetectedError``, a chain deeper
than ``max_subcall_depth`` (8, the worker's default) with
``SubcallDepthExceededError``, and a child's exception raised in the parent as
``SubcallFailedError`` (kind ``user_error``; the original is its ``__cause__``).

Not emulated: budgets and deadlines, retries, concurrency between calls.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from typing import Any, Final

from blockx.executor.errors import (
    SubcallCycleDetectedError,
    SubcallDepthExceededError,
    SubcallFailedError,
    chain_subcall_error,
)
from blockx.executor.module_registry import ModuleRegistry
from blockx.sdk.runtime import reset_provider, set_provider
from blockx.wire import dumps_wire, keys, loads_wire

from .clock import VirtualClock, install_sleep_patch, reset_active_clock, set_active_clock
from .fake_chain import FakeChain, UnansweredRequestError
from .tables import InMemoryTables

__all__ = [
    "DEFAULT_MAX_SUBCALL_DEPTH",
    "AuditRejectedError",
    "BackendAnswer",
    "TestEnvironment",
    "TestProvider",
]

DEFAULT_MAX_SUBCALL_DEPTH: Final = 8
_TASK_ID: Final = "blockx-testing"

#: ``backends={"prices": answer}``: ``answer(operation, params)`` → the result.
BackendAnswer = Callable[[str, Any], Any]


class AuditRejectedError(ValueError):
    """``audit=True`` and the auditor refused the function (the engine's ``audit_rejected``)."""


def _wire(value: Any) -> Any:
    """``value`` as the other side of the wire receives it."""
    return loads_wire(dumps_wire(value))


def _digest(source: str) -> str:
    return "sha256:" + hashlib.sha256(source.encode("utf-8")).hexdigest()


class TestProvider:
    """The :class:`blockx.sdk.Provider` of a :class:`TestEnvironment` (see the module doc)."""

    __test__ = False  # not a pytest test class
    __slots__ = ("_env",)

    def __init__(self, env: TestEnvironment) -> None:
        self._env = env

    def __repr__(self) -> str:
        return f"TestProvider({self._env!r})"

    def read_req(
        self,
        backend: str,
        operation: str,
        params: Mapping[str, Any],
        *,
        cache_key: str | None = None,
    ) -> Any:
        return self._env.io(keys.IO_READ, backend, operation, params)

    def write_req(self, backend: str, operation: str, params: Mapping[str, Any]) -> Any:
        return self._env.io(keys.IO_WRITE, backend, operation, params)

    def capability_req(
        self,
        backend: str,
        operation: str,
        params: Mapping[str, Any],
        *,
        cache_key: str = "",
    ) -> Any:
        return self._env.io(keys.IO_CAPABILITY, backend, operation, params)

    def subcall(self, function_id: str, args: Any) -> Any:
        return self._env.subcall(function_id, args)

    def sleep(self, seconds: float) -> None:
        self._env.clock.sleep(seconds)


class _Frame:
    """One running call of the environment: its function and call key."""

    __slots__ = ("call_key", "function_id")

    def __init__(self, function_id: str, call_key: str) -> None:
        self.function_id = function_id
        self.call_key = call_key


class TestEnvironment:
    """Functions, tables, chain, clock and call cache shared by the calls of one test."""

    __test__ = False  # not a pytest test class

    def __init__(
        self,
        *,
        tables: InMemoryTables,
        chain: FakeChain,
        clock: VirtualClock,
        backends: Mapping[str, BackendAnswer] | None = None,
        audit: bool = False,
        call_cache: bool = True,
        max_subcall_depth: int = DEFAULT_MAX_SUBCALL_DEPTH,
    ) -> None:
        self.tables = tables
        self.chain = chain
        self.clock = clock
        self.backends: dict[str, BackendAnswer] = dict(backends or {})
        self.audit = audit
        self.call_cache_enabled = call_cache
        self.max_subcall_depth = max_subcall_depth
        #: function id -> source
        self.sources: dict[str, str] = {}
        #: (function id, args JSON) -> output of a successful sub-call
        self.call_cache: dict[tuple[str, str], Any] = {}
        #: every sub-call made, in order: (function id, args, answered from the cache)
        self.subcalls: list[tuple[str, Any, bool]] = []
        self.provider = TestProvider(self)
        self._stack: list[_Frame] = []
        factory: Callable[[dict[str, Any]], dict[str, Any]] | None = None
        if audit:
            from blockx.executor.restricted_runtime import restricted_namespace

            factory = restricted_namespace
        self._registry = ModuleRegistry(
            restricted_namespace_factory=factory,
            released_namespace_cache=0,
            local_read_cache=(0, 0),
        )
        self._registry.acquire_task(_TASK_ID)  # held for the environment's life

    def __repr__(self) -> str:
        return (
            f"TestEnvironment(functions={sorted(self.sources)}, {self.tables!r}, "
            f"{self.chain!r}, {self.clock!r}, audit={self.audit})"
        )

    # --- functions ------------------------------------------------------------------------------

    def add_function(self, function_id: str, source: str) -> None:
        """Make ``function_id`` callable (audited first when the environment audits)."""
        if not isinstance(function_id, str) or not function_id:
            raise ValueError(f"a function id must be a non-empty str, got {function_id!r}")
        known = self.sources.get(function_id)
        if known is not None and known != source:
            raise ValueError(f"function {function_id!r} is already loaded with other source")
        if self.audit:
            from blockx.audit.auditor import audit_source

            verdict = audit_source(source, function_id)
            if not verdict.accepted:
                raise AuditRejectedError(verdict.error_message())
        self.sources[function_id] = source

    def entry(self, function_id: str) -> Callable[..., Any]:
        """The entry function of ``function_id`` (its module executed on first use)."""
        source = self.sources.get(function_id)
        if source is None:
            raise UnansweredRequestError(
                f"no function {function_id!r} in this test: pass "
                f"functions={{{function_id!r}: 'path/to/{function_id}.py'}} to load_function "
                f"(loaded: {', '.join(sorted(self.sources)) or 'none'})"
            )
        with self.installed():
            return self._registry.load_callable(
                _TASK_ID,
                function_id,
                _digest(source),
                "",
                source_loader=lambda _fid, _digest: source,
                restricted=self.audit,
            )

    # --- running --------------------------------------------------------------------------------

    def installed(self) -> _Installed:
        """A context manager: this environment's provider and clock are current inside it."""
        return _Installed(self)

    def run(self, function_id: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        """Call ``function_id(*args, **kwargs)`` at the top level; its output off the wire."""
        args = _wire(list(args))
        kwargs = _wire(dict(kwargs))
        # The call key of the ExecuteCall args these arguments are (the wire rule, reversed).
        payload: Any = args[0] if len(args) == 1 and type(args[0]) is not list else args
        call_key = f"{function_id}:{dumps_wire([payload, kwargs] if kwargs else payload).decode()}"
        entry = self.entry(function_id)
        with self.installed():
            self._stack.append(_Frame(function_id, call_key))
            try:
                output = entry(*args, **kwargs)
            finally:
                self._stack.pop()
        return _wire(output)

    def subcall(self, function_id: str, payload: Any) -> Any:
        """A sub-call from the running function (the worker's rules: see the module doc)."""
        if not isinstance(function_id, str):
            raise TypeError(f"function.call: function_id must be a str, not {type(function_id)}")
        caller = self._stack[-1].function_id if self._stack else "<test>"
        args = _wire(payload)
        call_key = f"{function_id}:{dumps_wire(args).decode()}"
        try:
            if any(frame.call_key == call_key for frame in self._stack):
                raise SubcallCycleDetectedError(
                    keys.ERR_SUBCALL_CYCLE_DETECTED,
                    f"{function_id}({args!r}) is already running in this call chain",
                )
            if len(self._stack) > self.max_subcall_depth:
                raise SubcallDepthExceededError(
                    keys.ERR_SUBCALL_DEPTH_EXCEEDED,
                    f"sub-call chain deeper than {self.max_subcall_depth}",
                )
            cache_key = (function_id, call_key)
            if self.call_cache_enabled and cache_key in self.call_cache:
                self.subcalls.append((function_id, args, True))
                return _wire(self.call_cache[cache_key])
            self.subcalls.append((function_id, args, False))
            output = self._run_child(function_id, args, call_key)
        except (SubcallFailedError, SubcallDepthExceededError, SubcallCycleDetectedError) as failed:
            chain_subcall_error(failed, caller, function_id)
            raise
        if self.call_cache_enabled:
            self.call_cache[cache_key] = output
        return _wire(output)

    def _run_child(self, function_id: str, args: Any, call_key: str) -> Any:
        try:
            entry = self.entry(function_id)
        except UnansweredRequestError as exc:
            raise SubcallFailedError(keys.ERR_USER_ERROR, exc.message, False) from None
        except Exception as exc:  # the child's module does not load: its call fails
            message = f"{type(exc).__name__}: {exc}"
            raise SubcallFailedError(keys.ERR_USER_ERROR, message, False) from exc
        self._stack.append(_Frame(function_id, call_key))
        try:
            output = entry(*args) if type(args) is list else entry(args)
            return _wire(output)
        except Exception as exc:
            # As the executor reports a failed call: its errorKind, "Type: message".
            kind = getattr(exc, "error_kind", keys.ERR_USER_ERROR)
            message = f"{type(exc).__name__}: {exc}"
            retryable = bool(getattr(exc, "retryable", False))
            raise SubcallFailedError(str(kind), message, retryable) from exc
        finally:
            self._stack.pop()

    # --- IO -------------------------------------------------------------------------------------

    def io(self, io_kind: str, backend: str, operation: str, params: Any) -> Any:
        """One IO request of the running function; its answer off the wire."""
        if backend == "blockdb" and io_kind != keys.IO_CAPABILITY:
            return self.tables.request(io_kind, operation, params)
        if backend == "rpc" and io_kind == keys.IO_READ and isinstance(params, Mapping):
            chain = str(params.get("chain", ""))
            rpc_params = params.get("params") or []
            return _wire(self.chain.request(chain, operation, _wire(list(rpc_params))))
        answer = self.backends.get(backend)
        if answer is None:
            raise UnansweredRequestError(
                f"no {backend!r} backend in this test ({io_kind} {operation}): pass "
                f"backends={{{backend!r}: lambda operation, params: ...}} to load_function"
            )
        return _wire(answer(operation, _wire(params) if isinstance(params, Mapping) else params))


class _Installed:
    """Sets the environment's provider and clock for the current context (re-entrant)."""

    __slots__ = ("_env", "_tokens")

    def __init__(self, env: TestEnvironment) -> None:
        self._env = env
        self._tokens: list[Any] = []

    def __enter__(self) -> None:
        install_sleep_patch()
        self._tokens = [set_provider(self._env.provider), set_active_clock(self._env.clock)]

    def __exit__(self, *_exc: object) -> None:
        provider_token, clock_token = self._tokens
        reset_active_clock(clock_token)
        reset_provider(provider_token)
