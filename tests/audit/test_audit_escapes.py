"""The escape corpus, first layer: known Python sandbox escapes the auditor refuses.

Each case is a real escape technique written as a user function; the test
proves the auditor rejects it and names the rule that stops it. The second
layer (the same techniques run straight in the restricted runtime, auditor
bypassed) is ``tests/executor/restricted/test_restricted_escapes.py``.
"""

from __future__ import annotations

from textwrap import dedent, indent

import pytest

from blockx.audit import Auditor, Verdict
from blockx.audit import tables as audit_tables


def fn(body: str, prefix: str = "") -> str:
    """A module whose entry ``_(p)`` runs ``body``."""
    return dedent(prefix) + "def _(p):\n" + indent(dedent(body).strip("\n"), "    ") + "\n"


ESCAPES: list[tuple[str, str, str]] = [
    # --- dunder walks ------------------------------------------------------------------
    ("subclasses_walk", fn("return ().__class__.__base__.__subclasses__()"), "attr.underscore"),
    (
        "function_globals",
        fn("def f():\n    pass\nreturn f.__globals__['__builtins__']"),
        "attr.underscore",
    ),
    ("builtins_name", fn("return __builtins__['eval']('1')"), "name.underscore"),
    ("import_dunder", fn("return __import__('os').system('id')"), "name.underscore"),
    ("loader_and_spec", fn("return __loader__, __spec__"), "name.underscore"),
    ("module_name_global", fn("return __name__"), "name.underscore"),
    ("dict_attribute", fn("return p.__dict__"), "attr.underscore"),
    ("mro_is_public", fn("return int.mro()[-1]"), "attr.forbidden"),
    ("object_subclasses", fn("return object.__subclasses__()"), "name.forbidden"),
    (
        "exception_context",
        fn("try:\n    1 / 0\nexcept Exception as e:\n    return e.__context__"),
        "attr.underscore",
    ),
    (
        "exception_cause",
        fn("try:\n    1 / 0\nexcept Exception as e:\n    return e.__cause__"),
        "attr.underscore",
    ),
    ("reduce_protocol", fn("return p.__reduce_ex__(2)"), "attr.underscore"),
    ("datetime_instance_class", fn("return datetime.now().__class__"), "attr.underscore"),
    ("super_trick", fn("return super().__self__"), "name.forbidden"),
    # --- frames: generators, coroutines, tracebacks -----------------------------------
    (
        "generator_frame",
        fn("g = (x for x in [1])\nreturn g.gi_frame.f_back.f_globals"),
        "attr.forbidden",
    ),
    ("generator_code", fn("g = (x for x in [1])\nreturn g.gi_code"), "attr.forbidden"),
    ("generator_function", fn("def g():\n    yield 1\nreturn g()"), "syntax.node"),
    ("yield_from", fn("def g():\n    yield from [1]\nreturn g()"), "syntax.node"),
    (
        "coroutine_frame",
        "async def c():\n    pass\ndef _(p):\n    return c().cr_frame\n",
        "syntax.node",
    ),
    ("coroutine_frame_attr", fn("c = p\nreturn c.cr_frame"), "attr.forbidden"),
    ("await_expression", "async def _(p):\n    await p\n", "syntax.node"),
    (
        "traceback_dunder",
        fn("try:\n    1 / 0\nexcept Exception as e:\n    return e.__traceback__.tb_frame"),
        "attr.underscore",
    ),
    ("traceback_frame_attr", fn("tb = p\nreturn tb.tb_frame.f_globals"), "attr.forbidden"),
    ("frame_back", fn("frame = p\nreturn frame.f_back"), "attr.forbidden"),
    ("frame_locals", fn("frame = p\nreturn frame.f_locals"), "attr.forbidden"),
    # --- format / format_map / string.Formatter ---------------------------------------
    ("format_attribute", fn("return '{0.__class__}'.format(p)"), "format.template"),
    ("format_globals", fn("return '{0.__init__.__globals__}'.format(p)"), "format.template"),
    ("format_item", fn("return '{0[key]}'.format(p)"), "format.template"),
    ("format_nested_spec", fn("return '{0:{1.__class__}}'.format(1, p)"), "format.template"),
    ("format_map_attribute", fn("return '{x.__class__}'.format_map({'x': p})"), "format.template"),
    ("format_variable_template", fn("t = '{0.__class__}'\nreturn t.format(p)"), "format.template"),
    (
        "format_built_template",
        fn("return ('{0.' + '_' * 2 + 'class__}').format(p)"),
        "format.template",
    ),
    ("format_unbound", fn("return str.format('{0.__class__}', p)"), "format.template"),
    ("format_builtin", fn("return format(p, 'x')"), "name.forbidden"),
    (
        "string_formatter",
        fn(
            "return Formatter().get_field('0.__class__', [p], {})", "from string import Formatter\n"
        ),
        "import.module",
    ),
    ("string_module", fn("return string.Formatter()", "import string\n"), "import.module"),
    # --- getattr with built names, vars, dir, globals ----------------------------------
    ("getattr_built_name", fn("return getattr(p, '_' + '_class__')"), "name.forbidden"),
    ("setattr", fn("setattr(p, 'x', 1)"), "name.forbidden"),
    ("delattr", fn("delattr(p, 'x')"), "name.forbidden"),
    ("hasattr_probe", fn("return hasattr(p, '__globals__')"), "name.forbidden"),
    ("vars", fn("return vars(p)"), "name.forbidden"),
    ("dir", fn("return dir()"), "name.forbidden"),
    ("globals", fn("return globals()"), "name.forbidden"),
    ("locals", fn("return locals()"), "name.forbidden"),
    # --- code execution and code objects -----------------------------------------------
    ("eval", fn("return eval('1')"), "name.forbidden"),
    ("exec", fn("exec('x = 1')"), "name.forbidden"),
    ("compile", fn("return compile('1', 'f', 'eval')"), "name.forbidden"),
    ("code_object_type", fn("def f():\n    pass\nreturn type(f.__code__)"), "attr.underscore"),
    ("code_object_type_name", fn("def f():\n    pass\nreturn type(f)"), "name.forbidden"),
    ("code_bytes", fn("c = p\nreturn c.co_code"), "attr.forbidden"),
    ("type_three_args", fn("return type('X', (), {})"), "name.forbidden"),
    # --- modules that re-export sys/os, and friends ------------------------------------
    ("import_os", fn("return os.system('id')", "import os\n"), "import.module"),
    ("import_sys", fn("return sys.modules", "import sys\n"), "import.module"),
    ("import_builtins", fn("return builtins.eval", "import builtins\n"), "import.module"),
    (
        "import_importlib",
        fn("return importlib.import_module('os')", "import importlib\n"),
        "import.module",
    ),
    ("import_inspect", fn("return inspect.currentframe()", "import inspect\n"), "import.module"),
    ("import_pickle", fn("return pickle.loads(p)", "import pickle\n"), "import.module"),
    ("import_gc", fn("return gc.get_objects()", "import gc\n"), "import.module"),
    ("import_ctypes", fn("return ctypes.CDLL(None)", "import ctypes\n"), "import.module"),
    (
        "import_operator",
        fn("return attrgetter('__class__')(p)", "from operator import attrgetter\n"),
        "import.module",
    ),
    ("json_codecs_sys", fn("return json.codecs.sys", "import json\n"), "import.member"),
    ("prelude_json_codecs", fn("return json.codecs"), "import.member"),
    ("datetime_sys", fn("return datetime.sys", "import datetime\n"), "import.member"),
    ("typing_sys", fn("return typing.sys", "import typing\n"), "import.member"),
    ("decimal_sys", fn("return decimal.sys", "import decimal\n"), "import.member"),
    ("re_internals", fn("return re.sre_compile", "import re\n"), "import.member"),
    ("from_json_decoder", fn("return decoder", "from json import decoder\n"), "import.member"),
    (
        "from_functools_lru_cache",
        fn("return lru_cache", "from functools import lru_cache\n"),
        "import.member",
    ),
    (
        "from_collections_namedtuple",
        fn("return namedtuple", "from collections import namedtuple\n"),
        "import.member",
    ),
    (
        "decimal_getcontext",
        fn("return getcontext()", "from decimal import getcontext\n"),
        "import.member",
    ),
    ("star_import", fn("return dumps", "from json import *\n"), "import.star"),
    ("relative_import", fn("return x", "from . import x\n"), "import.relative"),
    ("import_alias_dunder", fn("return j", "import json as __j\nj = __j\n"), "name.underscore"),
    ("future_braces", fn("return 1", "from __future__ import barry_as_FLUFL\n"), "import.member"),
    # --- match class patterns ----------------------------------------------------------
    (
        "match_object_class",
        fn("match p:\n    case object(__class__=c):\n        return c"),
        "match.class",
    ),
    (
        "match_dunder_keyword",
        fn("match p:\n    case int(__class__=c):\n        return c"),
        "attr.underscore",
    ),
    (
        "match_unlisted_class",
        fn("match p:\n    case Exception(args=a):\n        return a"),
        "match.class",
    ),
    # --- Unicode-normalised identifiers (NFKC, as the tokenizer does) -------------------
    ("unicode_eval", fn("return ｅｖａｌ('1')"), "name.forbidden"),
    ("unicode_dunder_attribute", fn("return p._＿class__"), "attr.underscore"),
    ("unicode_dunder_name", fn("return _＿builtins__"), "name.underscore"),
    ("unicode_getattr", fn("return ｇｅｔａｔｔｒ(p, 'x')"), "name.forbidden"),
    # --- builtins that reach builtins: help, license, exit, breakpoint -----------------
    ("help", fn("help()"), "name.forbidden"),
    ("license", fn("return license._Printer__filenames"), "name.forbidden"),
    ("credits", fn("return credits"), "name.forbidden"),
    ("exit", fn("exit(0)"), "name.forbidden"),
    ("quit", fn("quit()"), "name.forbidden"),
    ("breakpoint", fn("breakpoint()"), "name.forbidden"),
    ("input", fn("return input()"), "name.forbidden"),
    ("open", fn("return open('/etc/passwd').read()"), "name.forbidden"),
    ("memoryview", fn("return memoryview(b'x')"), "name.forbidden"),
    ("unknown_builtin", fn("return aiter"), "name.forbidden"),
    ("unknown_name", fn("return __debug__ or copyright"), "name.underscore"),
    ("undefined_module_name", fn("return sys.modules"), "name.unknown"),
    # --- classes, decorators, metaclasses ----------------------------------------------
    (
        "init_subclass",
        "class A:\n    def __init_subclass__(cls):\n        pass\ndef _(p):\n    return A\n",
        "syntax.node",
    ),
    (
        "metaclass",
        "class M(type):\n    pass\nclass A(metaclass=M):\n    pass\ndef _(p):\n    return A\n",
        "syntax.node",
    ),
    ("decorator", "def d(f):\n    return f\n@d\ndef _(p):\n    return p\n", "syntax.decorator"),
    # --- f-strings, walrus, lambdas, closures ------------------------------------------
    ("fstring_repr_dunder", fn("return f'{p.__class__!r}'"), "attr.underscore"),
    ("fstring_spec_dunder", fn("return f'{p:{p.__doc__}}'"), "attr.underscore"),
    ("walrus_dunder", fn("return [(c := x.__class__) for x in [p]]"), "attr.underscore"),
    ("walrus_private_name", fn("return (_x := 1)"), "name.underscore"),
    (
        "lambda_closure",
        fn("f = lambda: p\nreturn f.__closure__[0].cell_contents"),
        "attr.underscore",
    ),
    ("cell_contents", fn("c = p\nreturn c.cell_contents"), "attr.forbidden"),
    (
        "attribute_error_obj",
        fn("try:\n    p.missing\nexcept AttributeError as e:\n    return e.obj"),
        "attr.forbidden",
    ),
    (
        "lambda_default_import",
        fn("f = lambda x=__import__('os'): x\nreturn f()"),
        "name.underscore",
    ),
    ("lambda_default_builtins", fn("f = lambda b=__builtins__: b\nreturn f()"), "name.underscore"),
    # --- scope and mutation tricks ------------------------------------------------------
    ("global_statement", "x = 1\ndef _(p):\n    global x\n    x = p\n", "syntax.node"),
    (
        "nonlocal_statement",
        fn("x = 1\ndef f():\n    nonlocal x\n    x = 2\nreturn f()"),
        "syntax.node",
    ),
    ("assign_attribute_on_parameter", fn("p.x = 1"), "attr.assign"),
    ("assign_attribute_on_module", fn("json.loads = p"), "attr.assign"),
    ("assign_attribute_on_global", "state = {}\ndef _(p):\n    state.x = 1\n", "attr.assign"),
    (
        "assign_attribute_at_module_level",
        "x = {}\nx.y = 1\ndef _(p):\n    return x\n",
        "attr.assign",
    ),
    ("delete_attribute", fn("del json.dumps"), "attr.assign"),
    ("assign_nested_attribute", fn("d = {}\nd.x.y = 1"), "attr.assign"),
    ("keyword_dunder", fn("return dict(__class__=1)"), "name.underscore"),
    ("private_local", fn("_secret = 1\nreturn _secret"), "name.underscore"),
    # --- swallowing cancellation --------------------------------------------------------
    ("bare_except", fn("try:\n    return 1\nexcept:\n    return 2"), "except.bare"),
    ("finally_return", fn("try:\n    return 1\nfinally:\n    return 2"), "finally.control_flow"),
    (
        "finally_break",
        fn("for x in p:\n    try:\n        pass\n    finally:\n        break"),
        "finally.control_flow",
    ),
    ("with_exit", fn("with open('x') as f:\n    return f"), "syntax.node"),
    ("except_star", fn("try:\n    pass\nexcept* ValueError:\n    pass"), "syntax.node"),
    # --- the parser and the limits ------------------------------------------------------
    (
        "deep_parentheses",
        "x = " + "(" * 300 + "1" + ")" * 300 + "\ndef _(p):\n    return x\n",
        "syntax.error",
    ),
    (
        "deep_unary_parser_crash",
        "x = " + "-" * 100_000 + "1\ndef _(p):\n    return x\n",
        "limit.parser",
    ),
    ("deep_ast", "x = 1" + "+1" * 2000 + "\ndef _(p):\n    return x\n", "limit.depth"),
    ("deep_attribute_chain", "x = p" + ".a" * 100_000 + "\n", "limit.parser"),
    ("huge_source", "x = 1\n" * 60_000 + "def _(p):\n    return x\n", "limit.source_size"),
    ("nul_byte", "def _(p):\n    return 1\x00\n", "syntax.error"),
    ("return_outside_function", "return 1\ndef _(p):\n    return 1\n", "syntax.error"),
]


@pytest.fixture(scope="module")
def auditor() -> Auditor:
    return Auditor()


@pytest.mark.parametrize(
    ("source", "rule"),
    [pytest.param(source, rule, id=name) for name, source, rule in ESCAPES],
)
def test_the_auditor_refuses_the_escape(auditor: Auditor, source: str, rule: str) -> None:
    verdict = auditor.audit(source, "tenant/escape")
    assert isinstance(verdict, Verdict)
    assert not verdict.accepted
    rules = [v.rule for v in verdict.violations]
    assert rule in rules, verdict.violations
    assert all(r in audit_tables.RULES for r in rules)
    assert all(v.line >= 1 and v.col >= 1 for v in verdict.violations)
    assert verdict.error_message().startswith("audit rejected tenant/escape: [")


def test_the_corpus_is_large_and_names_are_unique() -> None:
    names = [name for name, _, _ in ESCAPES]
    assert len(names) == len(set(names))
    assert len(names) >= 30


def test_every_rule_of_the_policy_is_exercised() -> None:
    exercised = {rule for _, _, rule in ESCAPES} | {
        "entry.missing",  # test_audit_rules: TestEntryResolution
        "limit.nodes",  # test_audit_rules: TestVerdicts.test_too_many_nodes
        "audit.internal",  # test_audit_rules: TestNeverRaises.test_a_checker_bug_fails_closed
    }
    assert exercised == set(audit_tables.RULES)
