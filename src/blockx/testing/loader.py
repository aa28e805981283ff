"""``load_function``: a BlockX function file as a plain callable, for unit tests.

::

    from blockx.testing import load_function

    price = load_function(
        "functions/token_price.py",
        tables={"prices": [{"key": "ETH", "usd": 3000}]},
    )
    assert price("ETH") == 3000
    assert price.tables.get("prices", "ETH") == {"key": "ETH", "usd": 3000}

The function runs here, in this process, with the executor's prelude
(``Table``, ``ChainState``, ``function``, ``json``, ...) backed by a
:class:`~blockx.testing.environment.TestEnvironment`: in-memory tables, a fake
chain, the other functions given for sub-calls and a virtual clock for
``time.sleep`` (see that module for exactly what is and is not emulated).
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping
from typing import Any, Union

from blockx.function_files import read_function_source

from .clock import VirtualClock
from .environment import DEFAULT_MAX_SUBCALL_DEPTH, BackendAnswer, TestEnvironment
from .fake_chain import ChainAnswers, FakeChain
from .tables import InMemoryTables

__all__ = ["FunctionSource", "LoadedFunction", "load_function"]

#: A function given to :func:`load_function`: source text, a ``.py`` path, or a loaded one.
FunctionSource = Union[str, "os.PathLike[str]", "LoadedFunction"]

_DEFAULT_ID = "function"


class LoadedFunction:
    """A function of a test environment, callable like the plain function it wraps.

    ``f(*args)`` calls the entry function with exactly those arguments;
    ``f.call(args)`` applies the engine's wire rule (a list is spread as
    positional arguments, anything else is the one argument), as a task's
    ``Call(function, args)`` would. Arguments and the output go through the
    wire's JSON (tuples become lists). An exception of the function propagates
    unchanged.

    ``tables``, ``chain``, ``clock`` and ``subcalls`` are the environment's,
    shared with the functions loaded with it.
    """

    __test__ = False
    __slots__ = ("env", "function_id", "path", "source")

    def __init__(
        self, env: TestEnvironment, function_id: str, source: str, path: pathlib.Path | None
    ) -> None:
        self.env = env
        self.function_id = function_id
        self.source = source
        self.path = path

    def __repr__(self) -> str:
        where = f" from {self.path}" if self.path is not None else ""
        return f"<blockx.testing function {self.function_id!r}{where}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.env.run(self.function_id, args, kwargs)

    def call(self, args: Any = None) -> Any:
        """Run with ``args`` as a task's ``Call`` passes them (a list is spread)."""
        return self.env.run(self.function_id, tuple(args) if type(args) is list else (args,), {})

    @property
    def tables(self) -> InMemoryTables:
        return self.env.tables

    @property
    def chain(self) -> FakeChain:
        return self.env.chain

    @property
    def clock(self) -> VirtualClock:
        return self.env.clock

    @property
    def subcalls(self) -> list[tuple[str, Any, bool]]:
        """Every sub-call made: ``(function id, args, answered from the call cache)``."""
        return self.env.subcalls

    def function(self, function_id: str) -> LoadedFunction:
        """Another function of this environment (one given in ``functions=``)."""
        self.env.entry(function_id)  # raises for an unknown id
        source = self.env.sources[function_id]
        return LoadedFunction(self.env, function_id, source, None)


def _function_id_of(path: pathlib.Path | None) -> str:
    return path.stem if path is not None else _DEFAULT_ID


def load_function(
    path_or_source: FunctionSource,
    *,
    tables: Mapping[str, Any] | InMemoryTables | None = None,
    chain: ChainAnswers | FakeChain | None = None,
    functions: Mapping[str, FunctionSource] | None = None,
    audit: bool = False,
    backends: Mapping[str, BackendAnswer] | None = None,
    function_id: str | None = None,
    base_dir: str | os.PathLike[str] | None = None,
    clock: VirtualClock | None = None,
    call_cache: bool = True,
    max_subcall_depth: int = DEFAULT_MAX_SUBCALL_DEPTH,
) -> LoadedFunction:
    """Load a function (a ``.py`` path or source text) into a new test environment.

    * ``tables``: ``{"prices": [row, ...]}`` seeds in-memory tables (rows keyed
      by their ``"key"`` field), or an :class:`InMemoryTables` to share;
    * ``chain``: ``{(method, params): result}`` (or ``{method: result}``), a
      callable ``answer(method, params)``, or a :class:`FakeChain`;
    * ``functions``: ``{function_id: path | source | LoadedFunction}`` — what
      ``function.call(function_id, ...)`` runs (its code, in this environment);
    * ``audit=True``: every function is audited as ``Task(audit=True)`` would
      (:class:`~blockx.testing.environment.AuditRejectedError` at load) and
      runs in the engine's restricted runtime;
    * ``backends``: ``{name: answer(operation, params)}`` for other IO backends;
    * ``function_id``: the id the entry rules see (default: the file's stem, or
      ``"function"`` for source text); ``base_dir``: where relative paths start
      (default: the current directory); ``clock``: a :class:`VirtualClock` to
      share; ``call_cache=False`` runs equal sub-calls every time.

    Every module (this one and those of ``functions``) is compiled and executed
    here, once: raises :class:`~blockx.function_files.FunctionFileError` for a
    missing file, ``UserCodeSyntaxError`` / ``NoEntryFunctionError`` for a
    module that cannot give an entry function, and whatever a module body raises.
    """
    source, path = _source_of(path_or_source, function_id or "", base_dir)
    main_id = function_id or (
        path_or_source.function_id
        if isinstance(path_or_source, LoadedFunction)
        else _function_id_of(path)
    )
    if isinstance(tables, InMemoryTables):
        memory_tables = tables
    else:
        memory_tables = InMemoryTables(tables)
    fake_chain = chain if isinstance(chain, FakeChain) else FakeChain(chain)
    env = TestEnvironment(
        tables=memory_tables,
        chain=fake_chain,
        clock=clock if clock is not None else VirtualClock(),
        backends=backends,
        audit=audit,
        call_cache=call_cache,
        max_subcall_depth=max_subcall_depth,
    )
    env.add_function(main_id, source)
    for child_id, value in (functions or {}).items():
        child_source, _ = _source_of(value, child_id, base_dir)
        env.add_function(child_id, child_source)
    # Compile and execute every module now, so a broken one fails the load, not a call.
    for loaded_id in env.sources:
        env.entry(loaded_id)
    return LoadedFunction(env, main_id, source, path)


def _source_of(
    value: FunctionSource, function_id: str, base_dir: str | os.PathLike[str] | None
) -> tuple[str, pathlib.Path | None]:
    if isinstance(value, LoadedFunction):
        return value.source, value.path
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(
            f"function {function_id or '?'}: expected source text, a .py path or a loaded "
            f"function, got {type(value).__name__}"
        )
    return read_function_source(value, function_id=function_id, base_dir=base_dir)
