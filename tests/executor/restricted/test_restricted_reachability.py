"""Walk everything reachable from the restricted namespace and fail on any escape hatch.

Roots: every safe builtin, every module facade and its members, the
restricted prelude. From each object the walk follows

* every attribute audited code may read (``dir()`` filtered by the auditor's own
  ``attribute_allowed``);
* the *referent* dunders — ``__self__``, ``__func__``, ``__wrapped__``,
  ``__globals__``, ``__closure__``, ``__code__``, ``__dict__``, ``__builtins__``,
  ``__module__``, ``__objclass__`` — even though the auditor refuses them: the
  runtime must not hand out a function whose globals, closure or ``__self__``
  is one hop from a module;
* the results of calling callables (classes included) with known and generic
  arguments, the items of containers and a few items of iterators, and the
  exceptions calls raise.

It fails on a module object, a frame, a code object, a traceback, a generator
or coroutine (they carry frames), a Python function or method (their globals are
one hop away), a builtin bound to a module, a closure cell, a module's globals
dict, ``object`` or ``type`` (the roots of ``__subclasses__()``), or a real
dangerous builtin (``eval``, ``open``, ``__import__``, …).

Not followed: ``__class__``/``__base__``/``__mro__``/``__subclasses__`` and the
other type-hierarchy dunders, and ``__traceback__``. Every Python object reaches
``object.__subclasses__()`` through them and every exception its frames;
CPython cannot hide them, so the auditor refuses them (and
``test_restricted_escapes`` states that as a test).
"""

from __future__ import annotations

import builtins
import itertools
import sys
import types
from collections import deque
from collections.abc import Iterator
from typing import Any

from restricted_helpers import provider_installed

from blockx.audit import tables as audit_tables
from blockx.audit.checker import attribute_allowed
from blockx.executor.restricted_runtime import (
    SAFE_BUILTINS,
    facade_members,
    module_facade,
    restricted_namespace,
    restricted_prelude,
)

REFERENT_DUNDERS = (
    "__self__",
    "__func__",
    "__wrapped__",
    "__globals__",
    "__closure__",
    "__code__",
    "__dict__",
    "__builtins__",
    "__module__",
    "__objclass__",
)

KNOWN_CALLS: dict[str, tuple[tuple[Any, ...], ...]] = {
    "json.loads": (('{"a": [1, 2.5, null, {"b": "c"}]}',),),
    "json.dumps": (({"a": [1, 2.5, None]},),),
    "re.compile": (("a(?P<x>b)",),),
    "re.match": (("a(b)", "ab"),),
    "re.search": (("b", "ab"),),
    "re.fullmatch": (("ab", "ab"),),
    "re.finditer": (("a", "aa"),),
    "re.sub": (("a", "b", "aa"),),
    "re.split": (("a", "bab"),),
    "datetime.datetime": ((2026, 1, 2, 3, 4, 5),),
    "datetime.date": ((2026, 1, 2),),
    "datetime.time": ((3, 4, 5),),
    "datetime.timedelta": ((1, 2, 3),),
    "decimal.Decimal": (("1.5",),),
    "hashlib.new": (("sha256", b"x"),),
    "base64.b64decode": (("YQ==",),),
    "statistics.linear_regression": (([1, 2, 3], [2, 4, 7]),),
    "statistics.quantiles": (([1, 2, 3, 4],),),
    "statistics.correlation": (([1, 2, 3], [2, 4, 7]),),
    "itertools.groupby": (("aab",),),
    "itertools.tee": (([1, 2],),),
    "functools.partial": ((SAFE_BUILTINS["len"], [1]),),
    "functools.cmp_to_key": ((SAFE_BUILTINS["len"],),),
    "function.call": (("adder", {"left": 1, "right": 2}),),
    "Table": (("prices",),),
    "ChainState": (("eth", 19_000_000),),
}

GENERIC_ARGS: tuple[tuple[Any, ...], ...] = (
    (),
    ("1",),
    (1,),
    (2, 3),
    ("a", "abc"),
    ([1, 2],),
    ({"a": 1},),
    (b"ab",),
    (1.5,),
    ("0x0000000000000000000000000000000000000001",),
)

PRIMITIVES = (bool, int, float, complex, str, bytes, bytearray, type(None))
DANGEROUS = {
    id(getattr(builtins, name)): name
    for name in (
        "eval", "exec", "compile", "open", "getattr", "setattr", "delattr", "vars", "dir",
        "globals", "locals", "__import__", "__build_class__", "breakpoint", "input", "help",
        "memoryview", "type", "object", "super",
    )
    if hasattr(builtins, name)
}  # fmt: skip

MAX_OBJECTS = 200_000
MAX_DEPTH = 5
MAX_CALL_DEPTH = 3


def classify(obj: Any) -> str | None:
    """Why ``obj`` must not be reachable, or None."""
    if id(obj) in DANGEROUS and obj is getattr(builtins, DANGEROUS[id(obj)], None):
        return f"the real builtin {DANGEROUS[id(obj)]}"
    if obj is object or obj is type:
        return "object/type: the roots of __subclasses__()"
    if isinstance(obj, types.ModuleType):
        return f"module {obj.__name__}"
    if isinstance(obj, (types.FrameType, types.CodeType, types.TracebackType)):
        return type(obj).__name__
    if isinstance(obj, (types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType)):
        return f"{type(obj).__name__} (carries a frame)"
    if isinstance(obj, (types.FunctionType, types.MethodType)):
        return f"Python function {getattr(obj, '__qualname__', obj)!r} (globals one hop away)"
    if isinstance(obj, types.CellType):
        return "a closure cell"
    if isinstance(obj, types.BuiltinFunctionType) and isinstance(
        getattr(obj, "__self__", None), types.ModuleType
    ):
        return f"builtin {obj.__name__} bound to module {obj.__self__.__name__}"
    if isinstance(obj, dict) and (
        "__builtins__" in obj or any(obj is m.__dict__ for m in list(sys.modules.values()))
    ):
        return "a module's globals"
    return None


def public_names(obj: Any) -> list[str]:
    try:
        names = dir(obj)
    except Exception:
        return []
    return [n for n in names if isinstance(n, str) and attribute_allowed(n)]


def call_results(path: str, obj: Any) -> Iterator[tuple[str, Any]]:
    for args in (*KNOWN_CALLS.get(path, ()), *GENERIC_ARGS):
        try:
            result = obj(*args)
        except Exception as exc:
            yield f"{path}(…) raised", exc
            continue
        yield f"{path}{args!r}"[:120], result


def walk(roots: dict[str, Any], max_objects: int = MAX_OBJECTS) -> tuple[list[str], int, set[str]]:
    problems: list[str] = []
    seen: set[int] = set()
    keep: list[Any] = []  # ids stay unique while the objects live
    primitive_types: set[type] = set()
    type_names: set[str] = set()
    queue: deque[tuple[str, Any, int]] = deque((path, obj, 0) for path, obj in roots.items())
    while queue and len(seen) < max_objects:
        path, obj, depth = queue.popleft()
        if id(obj) in seen:
            continue
        if isinstance(obj, (*PRIMITIVES, BaseException)):  # one of each type is enough
            if type(obj) in primitive_types:
                continue
            primitive_types.add(type(obj))
        seen.add(id(obj))
        keep.append(obj)
        type_names.add(type(obj).__name__)
        problem = classify(obj)
        if problem is not None:
            problems.append(f"{path}: {problem}")
            continue
        if depth >= MAX_DEPTH:
            continue

        def push(sub: str, value: Any, obj_depth: int = depth) -> None:
            queue.append((sub, value, obj_depth + 1))

        for name in public_names(obj):
            try:
                value = getattr(obj, name)
            except Exception:
                continue
            push(f"{path}.{name}", value)
        for name in REFERENT_DUNDERS:
            try:
                value = getattr(obj, name)
            except Exception:
                continue
            push(f"{path}.{name}", value)
        if isinstance(obj, (list, tuple, set, frozenset)):
            for i, item in enumerate(itertools.islice(obj, 20)):
                push(f"{path}[{i}]", item)
        elif isinstance(obj, (dict, types.MappingProxyType)):
            for key, value in itertools.islice(obj.items(), 60):
                push(f"{path}[{key!r}]", value)
                push(f"{path}.key", key)
        elif isinstance(obj, Iterator) and not isinstance(obj, PRIMITIVES):
            try:
                items = list(itertools.islice(obj, 3))
            except Exception:
                items = []
            for i, item in enumerate(items):
                push(f"{path}<{i}>", item)
        if callable(obj) and depth <= MAX_CALL_DEPTH and obj is not SAFE_BUILTINS["print"]:
            for sub, result in call_results(path, obj):
                push(sub, result)
    return problems, len(seen), type_names


def roots() -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name, value in SAFE_BUILTINS.items():
        found[f"builtins.{name}"] = value
    for module in audit_tables.MODULES:
        try:
            facade = module_facade(module)
        except ImportError:
            continue
        found[f"import {module}"] = facade
        for member, value in facade_members(facade).items():
            found[f"{module}.{member}"] = value
    for name, value in restricted_prelude().items():
        found[name] = value
    namespace = restricted_namespace({"__name__": "t/fn"})
    for name, value in namespace.items():  # the namespace is the module's globals itself
        found[f"namespace[{name!r}]"] = value
    return found


def test_nothing_reachable_from_the_restricted_namespace_is_an_escape_hatch() -> None:
    with provider_installed() as provider:
        problems, count, reached = walk(roots())
    assert problems == [], "\n".join(problems[:40])
    assert 2_000 < count < MAX_OBJECTS  # the walk went somewhere, and to the end
    # what facade functions return was walked too
    assert {
        "Pattern",
        "Match",
        "Decimal",
        "datetime",
        "timedelta",
        "LinearRegression",
        "HASH",
        "deque",
        "groupby",
        "ModuleFacade",
        "_TypeHint",
        "partial",
        "StatisticsError",
    } <= reached, sorted(reached)
    assert any(r[0] == "subcall" for r in provider.requests)  # function.call was called
    assert any(r[1] == "rpc" for r in provider.requests if r[0] == "read")  # ChainState too


def test_the_walk_detects_what_it_is_for() -> None:
    import json

    leaky = {"json": json, "loads": json.loads, "print": print}
    problems, _, _ = walk({"leaky": leaky}, max_objects=500)
    text = "\n".join(problems)
    assert "module json" in text
    assert "Python function" in text
    assert "bound to module builtins" in text
