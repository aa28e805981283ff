"""The escape corpus, second layer: the restricted runtime with the auditor bypassed.

Each snippet is executed straight in a restricted namespace — as if a bug let
it past the auditor — and must fail with the stated exception, never reach a
real module, ``sys``, ``os``, the ``builtins`` module or a function's globals.
The first layer (the auditor refusing the same techniques) is
``tests/audit/test_audit_escapes.py``.
"""

from __future__ import annotations

import pytest
from restricted_helpers import provider_installed, run_restricted

from blockx.audit import tables as audit_tables
from blockx.executor.restricted_runtime import SAFE_BUILTINS, facade_members, module_facade

RUNTIME_ESCAPES: list[tuple[str, str, type[BaseException]]] = [
    # --- imports of modules that are or re-export sys/os ------------------------------
    ("import_os", "import os", ImportError),
    ("import_sys", "import sys", ImportError),
    ("import_builtins", "import builtins", ImportError),
    ("import_importlib", "import importlib", ImportError),
    ("import_inspect", "import inspect", ImportError),
    ("import_gc", "import gc", ImportError),
    ("import_ctypes", "import ctypes", ImportError),
    ("import_pickle", "import pickle", ImportError),
    ("import_string_formatter", "from string import Formatter", ImportError),
    ("import_operator_attrgetter", "from operator import attrgetter", ImportError),
    ("import_submodule_json_decoder", "import json.decoder", ImportError),
    ("relative_import", "from . import x", ImportError),
    ("dunder_import_call", "__import__('os')", ImportError),
    ("dunder_import_level", "__import__('json', None, None, ('loads',), 1)", ImportError),
    # `from m import x` falls back to sys.modules[f"{m.__name__}.x"] when m has no x:
    # facades have no __name__, so the fallback cannot run.
    ("from_json_import_decoder", "from json import decoder", ImportError),
    ("from_json_import_codecs", "from json import codecs", ImportError),
    ("from_datetime_import_sys", "from datetime import sys", ImportError),
    # C code's helper imports (datetime.strptime → _strptime) give user code nothing
    ("internal_import_time", "__import__('time').sleep", AttributeError),
    ("internal_import_strptime", "import _strptime\n_strptime._strptime_datetime", AttributeError),
    # --- facade members that do not exist ----------------------------------------------
    ("json_codecs_sys", "import json\njson.codecs.sys", AttributeError),
    ("datetime_sys", "import datetime\ndatetime.sys", AttributeError),
    ("decimal_sys", "import decimal\ndecimal.sys", AttributeError),
    ("typing_sys", "import typing\ntyping.sys", AttributeError),
    ("re_internals", "import re\nre.sre_compile", AttributeError),
    ("functools_lru_cache", "import functools\nfunctools.lru_cache", AttributeError),
    ("collections_namedtuple", "import collections\ncollections.namedtuple", AttributeError),
    ("decimal_getcontext", "import decimal\ndecimal.getcontext", AttributeError),
    # --- dunder walks on facades -------------------------------------------------------
    ("facade_dict", "import json\njson.__dict__", AttributeError),
    ("facade_reduce", "import json\njson.__reduce_ex__(2)", AttributeError),
    ("facade_name", "import json\njson.__name__", AttributeError),
    ("facade_spec", "import json\njson.__spec__", AttributeError),
    ("facade_loader", "import json\njson.__loader__", AttributeError),
    ("facade_getattribute", "import json\njson.__getattribute__", AttributeError),
    ("facade_slots", "import json\njson._facade_members", AttributeError),
    ("prelude_function_dict", "function.__dict__", AttributeError),
    ("typing_hint_dict", "import typing\ntyping.Any.__dict__", AttributeError),
    ("typing_hint_origin", "import typing\ntyping.List[int].__origin__", AttributeError),
    # --- sealed functions: no globals, closure, code, wrapped function or __self__ ------
    ("print_self_is_not_builtins", "print.__self__", AttributeError),
    ("len_self_is_not_builtins", "len.__self__", AttributeError),
    ("loads_globals", "json.loads.__globals__", AttributeError),
    ("loads_code", "json.loads.__code__", AttributeError),
    ("loads_closure", "json.loads.__closure__", AttributeError),
    ("loads_wrapped", "json.loads.__wrapped__", AttributeError),
    ("call_closure", "function.call.__closure__", AttributeError),
    ("call_globals", "function.call.__globals__", AttributeError),
    ("import_function_globals", "__builtins__['__import__'].__globals__", AttributeError),
    ("table_factory_closure", "Table.__closure__", AttributeError),
    ("statistics_globals", "import statistics\nstatistics.mean.__globals__", AttributeError),
    ("reduce_qualname", "json.loads.__reduce__()", AttributeError),
    # --- builtins that are not there ---------------------------------------------------
    ("eval", "eval('1')", NameError),
    ("exec", "exec('1')", NameError),
    ("compile", "compile('1', 'f', 'eval')", NameError),
    ("open", "open('/etc/passwd')", NameError),
    ("getattr", "getattr(1, '__class__')", NameError),
    ("setattr", "setattr(json, 'x', 1)", NameError),
    ("vars", "vars()", NameError),
    ("dir", "dir()", NameError),
    ("globals", "globals()", NameError),
    ("locals", "locals()", NameError),
    ("type", "type(1)", NameError),
    ("object", "object", NameError),
    ("super", "super", NameError),
    ("help", "help()", NameError),
    ("license", "license()", NameError),
    ("exit", "exit()", NameError),
    ("quit", "quit()", NameError),
    ("breakpoint", "breakpoint()", NameError),
    ("input", "input()", NameError),
    ("memoryview", "memoryview(b'x')", NameError),
    ("build_class", "class A:\n    pass", NameError),
    ("builtins_eval", "__builtins__['eval']", KeyError),
    ("builtins_open", "__builtins__['open']", KeyError),
    # --- facades are read-only ---------------------------------------------------------
    ("facade_write", "json.loads = print", AttributeError),
    ("facade_delete", "del json.dumps", AttributeError),
    ("facade_write_submodule", "import blockx\nblockx.function = 1", AttributeError),
    ("typing_hint_write", "import typing\ntyping.Any.x = 1", AttributeError),
    # --- SDK object facades ------------------------------------------------------------
    ("table_private_method", "Table('prices')._read", AttributeError),
    ("table_dict", "Table('prices').__dict__", AttributeError),
    ("table_generator_method", "Table('prices').iter_scan", AttributeError),
    ("chain_private", "ChainState('eth')._error", AttributeError),
    ("table_method_self", "Table('prices').get_row.__self__", AttributeError),
]


@pytest.mark.parametrize(
    ("snippet", "error"),
    [pytest.param(snippet, error, id=name) for name, snippet, error in RUNTIME_ESCAPES],
)
def test_the_runtime_blocks_the_escape(snippet: str, error: type[BaseException]) -> None:
    with provider_installed(), pytest.raises(error):
        run_restricted(snippet)


def test_the_runtime_corpus_is_large_and_names_are_unique() -> None:
    names = [name for name, _, _ in RUNTIME_ESCAPES]
    assert len(names) == len(set(names)) and len(names) >= 30


def test_percent_formatting_looks_up_items_never_attributes() -> None:
    namespace = run_restricted(
        "ok = '%(a)s-%(b)r' % {'a': 1, 'b': 'x'}\n"
        "try:\n"
        "    '%(__class__)s' % {}\n"
        "    missing = False\n"
        "except KeyError:\n"
        "    missing = True\n"
    )
    assert namespace["ok"] == "1-'x'"
    assert namespace["missing"] is True


def test_the_builtins_are_exactly_the_whitelist() -> None:
    namespace = run_restricted("")
    assert set(namespace["__builtins__"]) == set(audit_tables.SAFE_BUILTIN_NAMES) | {"__import__"}
    assert namespace["__builtins__"] is not SAFE_BUILTINS
    namespace["__builtins__"]["len"] = None  # a module's own copy: nothing shared changes
    assert SAFE_BUILTINS["len"] is not None
    with pytest.raises(TypeError):
        SAFE_BUILTINS["eval"] = eval  # type: ignore[index]


def test_facades_expose_exactly_the_listed_members() -> None:
    for name, members in audit_tables.MODULES.items():
        facade = module_facade(name)
        exposed = set(facade_members(facade))
        assert exposed <= set(members), name
        assert sorted(exposed) == dir(facade)


def test_the_runtime_alone_cannot_hide_types_so_the_auditor_must() -> None:
    """The layering, stated as a test: every object reaches object.__subclasses__()
    through its type, and CPython gives no way to hide an object's type. So the
    auditor refuses every '_' attribute, and the sandbox is the last line."""
    namespace = run_restricted("subclasses = ().__class__.__base__.__subclasses__()\n")
    assert len(namespace["subclasses"]) > 100
