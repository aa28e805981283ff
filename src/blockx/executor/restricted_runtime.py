"""The restricted runtime: the namespace audited user modules run in.

Theory of operation
-------------------
When ``ExecuteCall.audit`` is set the worker has audited the source
(:mod:`blockx.audit`), and the module registry executes it in the namespace
:func:`restricted_namespace` builds (the registry's
``restricted_namespace_factory``) instead of the ordinary one:

* ``__builtins__`` is a fresh copy of :data:`SAFE_BUILTINS` — the names of
  ``blockx.audit.tables.SAFE_BUILTIN_NAMES`` and nothing else — plus the
  facade importer as ``__import__`` (what the ``import`` statement calls).
* Imports return **facades** (:class:`ModuleFacade`): read-only objects that
  expose exactly the members ``tables.MODULES`` lists, never a real module. A
  facade has no ``__dict__``, no ``__name__`` (so ``from json import decoder``
  cannot fall back to ``sys.modules``) and no other attribute but
  ``__class__``; it cannot be written to.
* Every **function** a facade or the builtins hand out is *sealed*
  (:func:`seal`): wrapped in an opaque C-level callable that exposes no
  ``__globals__``, ``__closure__``, ``__code__``, ``__wrapped__`` or
  ``__self__``. So ``json.loads.__globals__`` or ``print.__self__`` (the
  ``builtins`` module) lead nowhere even if an attribute got past the auditor.
  Classes (``int``, ``Decimal``, ``datetime``, the exceptions) are exposed as
  they are — ``isinstance`` and ``except`` need the real types — and are C
  types or exception classes without Python methods (the reachability test
  checks that no Python function is reachable).
* ``blockx.function.call`` is bound straight to the current call's provider
  (``provider.subcall``, the SDK bridge's sub-call); the SDK classes of
  ``tables.OBJECT_FACADES`` (``Table``, ``ChainState``) return object
  facades exposing only their listed methods; a listed class whose methods are
  all static methods (``Http``) is itself a facade of those functions.
* The prelude (``json``, ``Decimal``, ``datetime``, ``date``, ``function``,
  ``Table``, ``ChainState``, ``Http``) is rebuilt from the facades; the ordinary
  prelude's other names are not carried over.
* C code of exposed types imports helpers through the caller's
  ``__import__`` (``datetime.strptime`` needs ``_strptime``); for the names in
  ``tables.INTERNAL_IMPORTS`` the importer imports the real module (CPython's
  ``PyImport_Import`` then reads it from ``sys.modules``) and returns an
  empty facade, so user code never holds it.

What this layer does not do: CPython cannot hide an object's type, so a dunder
walk (``().__class__.__base__.__subclasses__()``) reaches every class from any
object; tracebacks of caught exceptions hold frames. Only the auditor, which
refuses every ``_``-prefixed attribute and the frame/code attributes, stops
those; the sandbox is the boundary when both fail (``docs/security.md``).

Facades are built lazily (the first import of a module), once per process,
and shared: they are immutable.
"""

from __future__ import annotations

import builtins
import functools
import importlib
import inspect
import logging
import sys
import threading
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Final

from blockx.audit import tables
from blockx.function import FunctionCallOutsideExecutorError
from blockx.sdk.runtime import current_provider

__all__ = [
    "SAFE_BUILTINS",
    "ModuleFacade",
    "facade_import",
    "facade_members",
    "module_facade",
    "restricted_namespace",
    "restricted_prelude",
    "seal",
]

_log = logging.getLogger("blockx.executor")

# --- sealing ----------------------------------------------------------------------------

# functools' C LRU wrapper with maxsize 0 calls its function and caches nothing;
# it keeps the function in a C field no attribute reaches.
_LRU_WRAPPER: Any = getattr(functools, "_lru_cache_wrapper", None)
_C_SEAL = isinstance(_LRU_WRAPPER, type) and _LRU_WRAPPER.__module__ == "functools"


def seal(function: Callable[..., Any]) -> Callable[..., Any]:
    """An opaque callable that calls ``function``.

    The result exposes neither ``function`` nor its globals, closure, code or
    ``__self__``; it has an empty ``__dict__`` and the (inert) ``cache_info`` /
    ``cache_clear`` of the C wrapper it is.
    """
    if _C_SEAL:
        sealed: Callable[..., Any] = _LRU_WRAPPER(function, 0, False, None)
        return sealed
    return function  # pragma: no cover - not CPython: the reachability test says so


# --- facades ----------------------------------------------------------------------------


class ModuleFacade:
    """A read-only view of one module (or SDK object): only its listed members.

    Attribute access returns a member or raises :class:`AttributeError`;
    everything else — ``__dict__``, ``__name__``, ``__spec__``, setting or
    deleting attributes — raises, except ``__class__`` (``isinstance`` and
    ABCs need it; types are reachable from any object anyway, which is why
    the auditor refuses ``_`` attributes). ``dir()`` lists the members.
    """

    __slots__ = ("_facade_label", "_facade_members")

    def __init__(self, label: str, members: Mapping[str, Any]) -> None:
        _LABEL.__set__(self, label)
        _MEMBERS.__set__(self, MappingProxyType(dict(members)))

    def __getattribute__(self, name: str) -> Any:
        members = _MEMBERS.__get__(self)
        try:
            return members[name]
        except (KeyError, TypeError):
            pass
        if name == "__class__":  # what isinstance() and ABCs ask; the type is no secret
            return type(self)
        label = _LABEL.__get__(self)
        raise AttributeError(
            f"{label} has no member {name!r} in restricted code "
            f"(allowed: {', '.join(sorted(members)) or 'none'})"
        )

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{_LABEL.__get__(self)} is read-only")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{_LABEL.__get__(self)} is read-only")

    def __dir__(self) -> list[str]:
        return sorted(_MEMBERS.__get__(self))

    def __repr__(self) -> str:
        return f"<restricted {_LABEL.__get__(self)}>"


_LABEL: Any = ModuleFacade.__dict__["_facade_label"]
_MEMBERS: Any = ModuleFacade.__dict__["_facade_members"]


def facade_members(facade: ModuleFacade) -> Mapping[str, Any]:
    """A facade's members (for the executor and tests; not reachable from user code)."""
    members: Mapping[str, Any] = _MEMBERS.__get__(facade)
    return members


class _TypeHint:
    """An inert stand-in for a ``typing`` name: subscriptable, ``|``-able, nothing else."""

    __slots__ = ("_hint_name",)

    def __init__(self, name: str) -> None:
        _HINT_NAME.__set__(self, name)

    def __getattribute__(self, name: str) -> Any:
        if name == "__class__":
            return type(self)
        raise AttributeError(f"typing.{_HINT_NAME.__get__(self)} is an annotation only")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("typing names are read-only")

    def __getitem__(self, item: Any) -> _TypeHint:
        return self

    def __or__(self, other: Any) -> _TypeHint:
        return self

    __ror__ = __or__

    def __repr__(self) -> str:
        return f"typing.{_HINT_NAME.__get__(self)}"


_HINT_NAME: Any = _TypeHint.__dict__["_hint_name"]


# --- the SDK bridge and the other replaced functions -------------------------------------


def _subcall_call(function_id: str, *args: Any) -> Any:
    """``blockx.function.call`` in restricted code: straight to the call's provider."""
    if not isinstance(function_id, str):
        raise TypeError(f"function.call: function_id must be a str, not {type(function_id)}")
    payload: Any = args[0] if len(args) == 1 else list(args)
    provider = current_provider()
    if provider is None:
        raise FunctionCallOutsideExecutorError(
            f"blockx.function.call({function_id!r}) only works inside a BlockX call"
        )
    return provider.subcall(function_id, payload)


def _restricted_print(*objects: Any, sep: str | None = " ", end: str | None = "\n") -> None:
    """``print`` without ``file``/``flush``: to stdout (a debug call's capture)."""
    builtins.print(*objects, sep=sep, end=end, file=sys.stdout)


def _cast(typ: Any, value: Any) -> Any:
    return value


def _object_factory(cls: type, methods: frozenset[str], label: str) -> Callable[..., Any]:
    """A sealed constructor: builds ``cls(...)`` and returns its object facade."""

    def make(*args: Any, **kwargs: Any) -> ModuleFacade:
        real = cls(*args, **kwargs)
        members: dict[str, Any] = {}
        for name in methods:
            attr = getattr(real, name, None)
            if attr is not None and callable(attr):
                members[name] = seal(attr)
        return ModuleFacade(f"{label} object", members)

    return seal(make)


# --- building facades -------------------------------------------------------------------

_PLAIN_TYPES: Final = (bool, int, float, complex, str, bytes, type(None))
_facades: dict[str, ModuleFacade] = {}
_unavailable: dict[str, str] = {}
_build_lock = threading.RLock()


def _expose(path: str, value: Any) -> tuple[bool, Any]:
    """What a facade holds for the real member ``value`` at ``module.member`` ``path``."""
    methods = tables.OBJECT_FACADES.get(path)
    if methods is not None and isinstance(value, type):
        label = path.rpartition(".")[2]
        if all(isinstance(inspect.getattr_static(value, m, None), staticmethod) for m in methods):
            # A namespace of functions (Http.get_json): a facade of them, no constructor.
            return True, ModuleFacade(label, {m: seal(getattr(value, m)) for m in methods})
        return True, _object_factory(value, methods, label)
    if isinstance(value, type):
        return True, value
    if type(value) in _PLAIN_TYPES:
        return True, value
    for plain in (int, float, str):  # IntFlag members (re.I) and the like: plain values
        if isinstance(value, plain):
            return True, plain(value)
    if callable(value):
        return True, seal(value)
    return False, None


def _special_members(name: str) -> dict[str, Any] | None:
    if name == "blockx.function":
        return {"call": seal(_subcall_call)}
    if name == "__future__":
        return {"annotations": True}
    if name == "typing":
        members: dict[str, Any] = {}
        for member in tables.MODULES["typing"]:
            if member == "TYPE_CHECKING":
                members[member] = False
            elif member == "cast":
                members[member] = seal(_cast)
            else:
                members[member] = _TypeHint(member)
        return members
    return None


def _build(name: str) -> ModuleFacade:
    allowed = tables.MODULES[name]
    members = _special_members(name)
    if members is None:
        members = {}
        real: Any = None
        for member in sorted(allowed):
            sub = f"{name}.{member}"
            if sub in tables.MODULES:
                try:
                    members[member] = module_facade(sub)
                except ImportError:
                    pass  # an optional SDK module not installed here
                continue
            if real is None:
                real = importlib.import_module(name)
            if not hasattr(real, member):
                continue  # e.g. a member of a newer Python
            ok, value = _expose(sub, getattr(real, member))
            if ok:
                members[member] = value
            else:
                _log.warning("restricted runtime: %s is not exposable; left out", sub)
    return ModuleFacade(f"module {name}", members)


def module_facade(name: str) -> ModuleFacade:
    """The facade of whitelisted module ``name`` (built once; raises ImportError)."""
    facade = _facades.get(name)
    if facade is not None:
        return facade
    if name not in tables.MODULES:
        raise ModuleNotFoundError(f"import of {name!r} is not allowed in restricted code")
    with _build_lock:
        facade = _facades.get(name)
        if facade is not None:
            return facade
        reason = _unavailable.get(name)
        if reason is None:
            try:
                facade = _build(name)
            except ImportError as exc:
                reason = _unavailable[name] = f"{name} is not available here: {exc}"
            else:
                _facades[name] = facade
                return facade
    raise ModuleNotFoundError(reason)


_EMPTY_FACADE: Final = ModuleFacade("internal module", {})


def facade_import(
    name: str,
    globals: Mapping[str, Any] | None = None,
    locals: Mapping[str, Any] | None = None,
    fromlist: Any = (),
    level: int = 0,
) -> ModuleFacade:
    """``__import__`` for restricted code: facades of whitelisted modules only."""
    if level:
        raise ImportError("relative imports are not allowed in restricted code")
    if not isinstance(name, str):
        raise ImportError("module names must be str")
    if name in tables.INTERNAL_IMPORTS:
        # C code of an exposed type (datetime.strptime, strftime) importing a helper:
        # PyImport_Import discards this result and reads sys.modules.
        importlib.import_module(name)
        return _EMPTY_FACADE
    facade = module_facade(name)
    if fromlist:
        return facade
    return module_facade(name.partition(".")[0])


# --- builtins and namespaces ------------------------------------------------------------


def _build_safe_builtins() -> dict[str, Any]:
    safe: dict[str, Any] = {}
    for name in sorted(tables.SAFE_BUILTIN_NAMES):
        value: Any = _restricted_print if name == "print" else getattr(builtins, name)
        safe[name] = value if isinstance(value, type) else seal(value)
    safe["__import__"] = seal(facade_import)
    return safe


#: The restricted builtins (read-only; each namespace gets its own copy).
SAFE_BUILTINS: Final[Mapping[str, Any]] = MappingProxyType(_build_safe_builtins())

_prelude: dict[str, Any] | None = None


def restricted_prelude() -> Mapping[str, Any]:
    """The predefined names of restricted modules (``tables.PRELUDE_NAMES``)."""
    global _prelude
    prelude = _prelude
    if prelude is None:
        prelude = {}
        for name, (module, member) in tables.PRELUDE_NAMES.items():
            try:
                facade = module_facade(module)
            except ImportError:
                continue
            if member is None:
                prelude[name] = facade
            elif member in facade_members(facade):
                prelude[name] = facade_members(facade)[member]
        _prelude = prelude
    return MappingProxyType(prelude)


def _is_module_metadata(key: str, value: Any) -> bool:
    return (
        type(value) is str and key.startswith("__") and key.endswith("__") and key != "__builtins__"
    )


def restricted_namespace(namespace: Mapping[str, Any]) -> dict[str, Any]:
    """The ``restricted_namespace_factory`` of ``ModuleRegistry``.

    Takes the ordinary namespace the registry prepared and returns a fresh one
    holding only its string metadata (``__name__``, ``__file__``, the digest
    key), the restricted prelude and a copy of :data:`SAFE_BUILTINS`.
    """
    restricted = {key: value for key, value in namespace.items() if _is_module_metadata(key, value)}
    restricted.update(restricted_prelude())
    restricted["__builtins__"] = dict(SAFE_BUILTINS)
    return restricted
