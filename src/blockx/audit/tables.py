"""The audit policy as data: what untrusted function code may use.

Theory of operation
-------------------
Everything the auditor (:mod:`blockx.audit.checker`) allows, and everything the
restricted runtime (:mod:`blockx.executor.restricted_runtime`) exposes, is read
from the tables below. Nothing here is code: frozensets of names and dicts of
reasons, so the policy can be reviewed in one place, rendered into
``docs/security.md`` (:mod:`blockx.audit.policy_markdown`, kept in sync by a test) and
fingerprinted into every verdict digest (:func:`policy_fingerprint`): change a
table and every cached verdict is invalidated.

The policy is a *whitelist*: a syntax node, a builtin, a module or a module
member that is not listed is refused. The deny tables (``DENIED_NODES``,
``FORBIDDEN_BUILTINS``, ``FORBIDDEN_ATTRIBUTES``) only give better messages
and document why; removing an entry from them never allows anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

__all__ = [
    "ALLOWED_NODES",
    "DENIED_NODES",
    "FORBIDDEN_ATTRIBUTES",
    "FORBIDDEN_ATTRIBUTE_PREFIXES",
    "FORBIDDEN_BUILTINS",
    "FORMAT_METHODS",
    "INTERNAL_IMPORTS",
    "MATCH_CLASSES",
    "MAX_AST_DEPTH",
    "MAX_AST_NODES",
    "MAX_SOURCE_BYTES",
    "MAX_VIOLATIONS",
    "MODULES",
    "OBJECT_FACADES",
    "POLICY_NAME",
    "POLICY_REVISION",
    "PRELUDE_NAMES",
    "RULES",
    "SAFE_BUILTIN_NAMES",
    "SAFE_EXCEPTION_NAMES",
    "policy_fingerprint",
]

#: The one policy there is; ``ExecuteCall.audit.policy``.
POLICY_NAME: Final = "default"
#: Bump on a change of the checker's *code* (table changes are fingerprinted).
POLICY_REVISION: Final = 1

# --- limits ----------------------------------------------------------------------------

#: Source larger than this (UTF-8 bytes) is refused before it is parsed.
MAX_SOURCE_BYTES: Final = 256 * 1024
#: More AST nodes than this is refused (bounds audit time and compile time).
MAX_AST_NODES: Final = 50_000
#: Deeper ASTs are refused: the checker and CPython's compiler recurse per level.
MAX_AST_DEPTH: Final = 200
#: A verdict reports at most this many violations.
MAX_VIOLATIONS: Final = 50

# --- syntax ----------------------------------------------------------------------------

#: AST node classes (``type(node).__name__``) allowed anywhere. Everything else,
#: including node types of future Python versions, is refused (rule ``syntax.node``).
ALLOWED_NODES: Final = frozenset(
    {
        # module and statements
        "Module",
        "FunctionDef",
        "Return",
        "Delete",
        "Assign",
        "AugAssign",
        "AnnAssign",
        "For",
        "While",
        "If",
        "Raise",
        "Try",
        "Assert",
        "Import",
        "ImportFrom",
        "Expr",
        "Pass",
        "Break",
        "Continue",
        "Match",
        # expressions
        "BoolOp",
        "NamedExpr",
        "BinOp",
        "UnaryOp",
        "Lambda",
        "IfExp",
        "Dict",
        "Set",
        "ListComp",
        "SetComp",
        "DictComp",
        "GeneratorExp",
        "Compare",
        "Call",
        "FormattedValue",
        "JoinedStr",
        "Constant",
        "Attribute",
        "Subscript",
        "Starred",
        "Name",
        "List",
        "Tuple",
        "Slice",
        # expression contexts
        "Load",
        "Store",
        "Del",
        # operators
        "And",
        "Or",
        "Add",
        "Sub",
        "Mult",
        "MatMult",
        "Div",
        "Mod",
        "Pow",
        "LShift",
        "RShift",
        "BitOr",
        "BitXor",
        "BitAnd",
        "FloorDiv",
        "Invert",
        "Not",
        "UAdd",
        "USub",
        "Eq",
        "NotEq",
        "Lt",
        "LtE",
        "Gt",
        "GtE",
        "Is",
        "IsNot",
        "In",
        "NotIn",
        # helpers
        "comprehension",
        "ExceptHandler",
        "arguments",
        "arg",
        "keyword",
        "alias",
        "match_case",
        # match patterns (class patterns further limited by MATCH_CLASSES)
        "MatchValue",
        "MatchSingleton",
        "MatchSequence",
        "MatchMapping",
        "MatchClass",
        "MatchStar",
        "MatchAs",
        "MatchOr",
    }
)

#: Why some well-known node types are refused (messages only; see ALLOWED_NODES).
DENIED_NODES: Final[Mapping[str, str]] = MappingProxyType(
    {
        "ClassDef": "class definitions bring metaclasses, __init_subclass__ and dunder methods",
        "AsyncFunctionDef": "coroutines expose frames (cr_frame) and are not run by the executor",
        "Await": "coroutines are not run by the executor",
        "AsyncFor": "coroutines are not run by the executor",
        "AsyncWith": "coroutines are not run by the executor",
        "Yield": "generator functions expose frames (gi_frame)",
        "YieldFrom": "generator functions expose frames (gi_frame)",
        "With": "no context manager is available, and __exit__ can swallow cancellation",
        "Global": "module state is changed through dicts and lists, not rebinding",
        "Nonlocal": "closures are read-only",
        "TryStar": "exception groups are not supported",
        "TypeAlias": "type statements are not supported",
    }
)

#: Class patterns (``case int(x):``) may only name these (rule ``match.class``).
MATCH_CLASSES: Final = frozenset(
    {
        "bool",
        "bytes",
        "date",
        "datetime",
        "Decimal",
        "dict",
        "float",
        "frozenset",
        "int",
        "list",
        "set",
        "str",
        "tuple",
    }
)

# --- names -----------------------------------------------------------------------------

#: Exception classes in the restricted builtins (catchable and raisable).
SAFE_EXCEPTION_NAMES: Final = frozenset(
    {
        "ArithmeticError",
        "AssertionError",
        "AttributeError",
        "Exception",
        "ImportError",
        "IndexError",
        "KeyError",
        "LookupError",
        "ModuleNotFoundError",
        "NameError",
        "NotImplementedError",
        "OverflowError",
        "RuntimeError",
        "StopIteration",
        "TypeError",
        "UnicodeDecodeError",
        "UnicodeEncodeError",
        "UnicodeError",
        "ValueError",
        "ZeroDivisionError",
    }
)

#: Builtins user code may name (the restricted runtime's SAFE_BUILTINS).
SAFE_BUILTIN_NAMES: Final = (
    frozenset(
        {
            "abs",
            "all",
            "any",
            "bin",
            "bool",
            "bytearray",
            "bytes",
            "callable",
            "chr",
            "complex",
            "dict",
            "divmod",
            "enumerate",
            "filter",
            "float",
            "frozenset",
            "hash",
            "hex",
            "int",
            "isinstance",
            "issubclass",
            "iter",
            "len",
            "list",
            "map",
            "max",
            "min",
            "next",
            "oct",
            "ord",
            "pow",
            "print",
            "range",
            "repr",
            "reversed",
            "round",
            "set",
            "slice",
            "sorted",
            "str",
            "sum",
            "tuple",
            "zip",
        }
    )
    | SAFE_EXCEPTION_NAMES
)

#: Builtins that are refused by name, and why (rule ``name.forbidden``). A local
#: variable may still use such a name (``open = row["open"]``); only the builtin
#: is unavailable.
FORBIDDEN_BUILTINS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "eval": "runs arbitrary code",
        "exec": "runs arbitrary code",
        "compile": "builds code objects",
        "open": "file access",
        "input": "reads the executor's stdin",
        "breakpoint": "starts a debugger",
        "help": "pydoc reaches every module",
        "getattr": "attribute access by a computed name",
        "setattr": "attribute assignment by a computed name",
        "delattr": "attribute deletion by a computed name",
        "hasattr": "attribute probing by a computed name",
        "vars": "exposes __dict__",
        "dir": "enumerates private attributes",
        "globals": "exposes the module namespace",
        "locals": "exposes frame locals",
        "type": "type(x) reaches the class hierarchy; type(n, b, d) builds classes",
        "object": "the root of object.__subclasses__()",
        "super": "walks the class hierarchy",
        "classmethod": "no classes in restricted code",
        "staticmethod": "no classes in restricted code",
        "property": "no classes in restricted code",
        "memoryview": "raw buffer access",
        "id": "exposes object addresses",
        "format": "calls __format__ with a caller-chosen spec; use f-strings",
        "exit": "ends the executor process (site builtin)",
        "quit": "ends the executor process (site builtin)",
        "license": "site builtin with a reference to builtins",
        "credits": "site builtin with a reference to builtins",
        "copyright": "site builtin with a reference to builtins",
        "aiter": "coroutines are not run by the executor",
        "anext": "coroutines are not run by the executor",
    }
)

#: Names predefined in every user module (no import needed), and where they come
#: from: ``(module, member)``; member None is the module itself. A name whose
#: module is missing from this installation is simply not predefined.
PRELUDE_NAMES: Final[Mapping[str, tuple[str, str | None]]] = MappingProxyType(
    {
        "json": ("json", None),
        "Decimal": ("decimal", "Decimal"),
        "datetime": ("datetime", "datetime"),
        "date": ("datetime", "date"),
        "function": ("blockx.function", None),
        "Table": ("blockx.db", "Table"),
        "ChainState": ("blockx.chain", "ChainState"),
        "Http": ("blockx.http", "Http"),
    }
)

# --- attributes ------------------------------------------------------------------------

#: Attribute names refused outright, and why (rule ``attr.forbidden``). Names
#: starting with ``_`` are refused by rule ``attr.underscore`` anyway.
FORBIDDEN_ATTRIBUTES: Final[Mapping[str, str]] = MappingProxyType(
    {
        "mro": "reaches object and so object.__subclasses__()",
        "obj": "AttributeError.obj: the object a failed lookup was on, maybe a library internal",
        "cell_contents": "reads closure cells",
        "f_back": "frame walking",
        "f_globals": "frame walking",
        "f_locals": "frame walking",
        "f_builtins": "frame walking",
        "f_code": "frame walking",
        "gi_frame": "generator frames",
        "gi_code": "generator code objects",
        "cr_frame": "coroutine frames",
        "ag_frame": "async generator frames",
        "tb_frame": "traceback frames",
        "tb_next": "traceback walking",
        "co_code": "code objects",
        "func_globals": "function globals (Python 2 spelling)",
    }
)

#: Attribute name prefixes refused (rule ``attr.forbidden``): the interpreter's
#: frame, code, generator, coroutine and traceback internals.
FORBIDDEN_ATTRIBUTE_PREFIXES: Final = ("f_", "gi_", "cr_", "ag_", "tb_", "co_", "func_", "im_")

#: ``str`` methods that look attributes up by a name inside the template
#: (``"{0.__class__}".format(x)``). Allowed only on a string literal whose
#: template has plain field names (rule ``format.template``).
FORMAT_METHODS: Final = frozenset({"format", "format_map"})

# --- modules ---------------------------------------------------------------------------

_MATH: Final = frozenset(
    {
        "acos", "acosh", "asin", "asinh", "atan", "atan2", "atanh", "cbrt", "ceil", "comb",
        "copysign", "cos", "cosh", "degrees", "dist", "e", "erf", "erfc", "exp", "exp2",
        "expm1", "fabs", "factorial", "floor", "fmod", "frexp", "fsum", "gamma", "gcd",
        "hypot", "inf", "isclose", "isfinite", "isinf", "isnan", "isqrt", "lcm", "ldexp",
        "lgamma", "log", "log10", "log1p", "log2", "modf", "nan", "nextafter", "perm", "pi",
        "pow", "prod", "radians", "remainder", "sin", "sinh", "sqrt", "tan", "tanh", "tau",
        "trunc", "ulp",
    }
)  # fmt: skip

#: Importable modules and the members each exposes (rules ``import.module`` and
#: ``import.member``). The runtime builds a read-only facade with exactly these
#: members (those that exist in this Python); a member that is itself a key here
#: (``blockx`` → ``function``) is that module's facade. ``import m`` and
#: ``from m import member`` are the only import forms.
MODULES: Final[Mapping[str, frozenset[str]]] = MappingProxyType(
    {
        "__future__": frozenset({"annotations"}),
        "base64": frozenset(
            {
                "b16decode",
                "b16encode",
                "b32decode",
                "b32encode",
                "b64decode",
                "b64encode",
                "b85decode",
                "b85encode",
                "standard_b64decode",
                "standard_b64encode",
                "urlsafe_b64decode",
                "urlsafe_b64encode",
            }
        ),
        "blockx": frozenset({"chain", "db", "function", "http"}),
        "blockx.chain": frozenset(
            {
                "ChainState",
                "ChainStateError",
                "ContractRevertError",
                "decode_log",
                "decode_result",
                "encode_call",
            }
        ),
        "blockx.db": frozenset({"Table"}),
        "blockx.function": frozenset({"call"}),
        "blockx.http": frozenset({"Http", "HttpError", "get_json", "post_json"}),
        "collections": frozenset({"OrderedDict", "defaultdict", "deque"}),
        "datetime": frozenset(
            {"MAXYEAR", "MINYEAR", "date", "datetime", "time", "timedelta", "timezone", "tzinfo"}
        ),
        "decimal": frozenset(
            {
                "Clamped",
                "Decimal",
                "DecimalException",
                "DivisionByZero",
                "FloatOperation",
                "Inexact",
                "InvalidOperation",
                "Overflow",
                "ROUND_05UP",
                "ROUND_CEILING",
                "ROUND_DOWN",
                "ROUND_FLOOR",
                "ROUND_HALF_DOWN",
                "ROUND_HALF_EVEN",
                "ROUND_HALF_UP",
                "ROUND_UP",
                "Rounded",
                "Subnormal",
                "Underflow",
            }
        ),
        "functools": frozenset({"cmp_to_key", "partial", "reduce"}),
        "hashlib": frozenset(
            {
                "blake2b",
                "blake2s",
                "md5",
                "new",
                "sha1",
                "sha224",
                "sha256",
                "sha384",
                "sha3_224",
                "sha3_256",
                "sha3_384",
                "sha3_512",
                "sha512",
            }
        ),
        "itertools": frozenset(
            {
                "accumulate",
                "batched",
                "chain",
                "combinations",
                "combinations_with_replacement",
                "compress",
                "count",
                "cycle",
                "dropwhile",
                "filterfalse",
                "groupby",
                "islice",
                "pairwise",
                "permutations",
                "product",
                "repeat",
                "starmap",
                "takewhile",
                "tee",
                "zip_longest",
            }
        ),
        "json": frozenset({"dumps", "loads"}),
        "math": _MATH,
        "re": frozenset(
            {
                "A",
                "ASCII",
                "DOTALL",
                "I",
                "IGNORECASE",
                "M",
                "MULTILINE",
                "S",
                "VERBOSE",
                "X",
                "compile",
                "escape",
                "findall",
                "finditer",
                "fullmatch",
                "match",
                "search",
                "split",
                "sub",
                "subn",
            }
        ),
        "statistics": frozenset(
            {
                "StatisticsError",
                "correlation",
                "covariance",
                "fmean",
                "geometric_mean",
                "harmonic_mean",
                "linear_regression",
                "mean",
                "median",
                "median_grouped",
                "median_high",
                "median_low",
                "mode",
                "multimode",
                "pstdev",
                "pvariance",
                "quantiles",
                "stdev",
                "variance",
            }
        ),
        "typing": frozenset(
            {
                "Any",
                "Callable",
                "Dict",
                "Final",
                "FrozenSet",
                "Iterable",
                "Iterator",
                "List",
                "Literal",
                "Mapping",
                "MutableMapping",
                "Optional",
                "Sequence",
                "Set",
                "TYPE_CHECKING",
                "Tuple",
                "Union",
                "cast",
            }
        ),
    }
)

#: Modules that C code of exposed types imports *through the calling frame's*
#: ``__import__`` (``datetime.strptime`` → ``_strptime``, ``strftime`` →
#: ``time``). CPython's ``PyImport_Import`` calls ``__import__`` only for its
#: side effect and then reads ``sys.modules``, so the restricted importer
#: imports these and returns an empty facade: C code gets the real module,
#: user code (``__import__("time")``) gets nothing. Not importable by user code.
INTERNAL_IMPORTS: Final = frozenset({"_strptime", "time"})

#: SDK classes whose *instances* the runtime wraps in a read-only facade that
#: exposes only these methods (``module.Class`` → method names). Calling the
#: class facade builds the real object and returns its facade. Generator
#: methods (``Table.iter_scan``) are left out: a generator carries its frame;
#: page with ``scan(after=...)`` instead.
OBJECT_FACADES: Final[Mapping[str, frozenset[str]]] = MappingProxyType(
    {
        "blockx.db.Table": frozenset(
            {"delete_rows", "get_row", "get_rows", "scan", "upsert_row", "upsert_rows"}
        ),
        "blockx.chain.ChainState": frozenset(
            {
                "call",
                "call_function",
                "get_address_balance",
                "get_address_code",
                "get_address_nonce",
                "get_block",
                "get_block_number",
                "get_logs",
                "get_storage_at",
                "request",
            }
        ),
        # Static methods only: the class itself is exposed as a facade of them (no instances).
        "blockx.http.Http": frozenset({"get_json", "post_json"}),
    }
)

# --- rules -----------------------------------------------------------------------------

#: Every rule id a violation may carry, and what it means.
RULES: Final[Mapping[str, str]] = MappingProxyType(
    {
        "syntax.error": "the source does not parse",
        "syntax.node": "a syntax construct outside ALLOWED_NODES",
        "syntax.decorator": "decorators are not allowed",
        "limit.source_size": f"source larger than {MAX_SOURCE_BYTES} UTF-8 bytes",
        "limit.parser": "the parser gave up (nesting too deep for CPython's parser)",
        "limit.depth": f"AST deeper than {MAX_AST_DEPTH} levels",
        "limit.nodes": f"more than {MAX_AST_NODES} AST nodes",
        "name.underscore": "an identifier starting with '_' (other than '_' itself)",
        "name.forbidden": "a builtin from FORBIDDEN_BUILTINS",
        "name.unknown": "a name that is neither bound in the module nor a safe builtin",
        "attr.underscore": "an attribute starting with '_'",
        "attr.forbidden": "an attribute from FORBIDDEN_ATTRIBUTES or with a forbidden prefix",
        "attr.assign": "attribute assignment or deletion on anything but an assigned local",
        "format.template": "str.format/format_map other than on a literal with plain fields",
        "import.module": "an import of a module outside MODULES",
        "import.member": "a module member outside MODULES[module]",
        "import.star": "from m import *",
        "import.relative": "relative imports",
        "except.bare": "a bare 'except:' (it would catch cancellation)",
        "finally.control_flow": "return/break/continue in 'finally' (swallows cancellation)",
        "match.class": "a class pattern naming a class outside MATCH_CLASSES",
        "entry.missing": "no entry function: define `def _(...)` or a public def",
        "audit.internal": "the checker failed on this source (a bug): refused, fail-closed",
    }
)


def _table_items() -> list[tuple[str, object]]:
    return [
        ("ALLOWED_NODES", sorted(ALLOWED_NODES)),
        ("DENIED_NODES", sorted(DENIED_NODES.items())),
        ("MATCH_CLASSES", sorted(MATCH_CLASSES)),
        ("SAFE_BUILTIN_NAMES", sorted(SAFE_BUILTIN_NAMES)),
        ("FORBIDDEN_BUILTINS", sorted(FORBIDDEN_BUILTINS.items())),
        ("PRELUDE_NAMES", sorted(PRELUDE_NAMES.items())),
        ("FORBIDDEN_ATTRIBUTES", sorted(FORBIDDEN_ATTRIBUTES.items())),
        ("FORBIDDEN_ATTRIBUTE_PREFIXES", list(FORBIDDEN_ATTRIBUTE_PREFIXES)),
        ("FORMAT_METHODS", sorted(FORMAT_METHODS)),
        ("MODULES", sorted((k, sorted(v)) for k, v in MODULES.items())),
        ("OBJECT_FACADES", sorted((k, sorted(v)) for k, v in OBJECT_FACADES.items())),
        ("INTERNAL_IMPORTS", sorted(INTERNAL_IMPORTS)),
        ("RULES", sorted(RULES)),
        (
            "LIMITS",
            [MAX_SOURCE_BYTES, MAX_AST_NODES, MAX_AST_DEPTH, MAX_VIOLATIONS, POLICY_REVISION],
        ),
    ]


def policy_fingerprint() -> str:
    """A short hash of every table: part of each verdict digest."""
    import hashlib  # here: every executor imports these tables, few ever hash them

    text = repr(_table_items()).encode("utf-8")
    return hashlib.sha256(text).hexdigest()[:16]
