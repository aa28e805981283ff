"""A YAML 1.2 core-schema loader for task files (PyYAML's parser, 1.2's plain scalars).

Theory of operation
-------------------
PyYAML parses YAML well but resolves plain (unquoted) scalars by YAML 1.1's
rules: ``NO``/``yes``/``on``/``off`` become booleans, ``010`` is octal 8,
``1:30`` is the base-60 number 90, ``2024-06-01`` a date. Task files carry
country codes, padded ids and times, so those rules surprise. YAML 1.2's *core
schema* (yaml.org/spec/1.2.2, "10.3 Core Schema") resolves only:

* null -- ``null``, ``Null``, ``NULL``, ``~`` and the empty value;
* bool -- ``true``/``True``/``TRUE``, ``false``/``False``/``FALSE``;
* int -- ``[-+]?[0-9]+`` in decimal (``010`` is 10), ``0o[0-7]+``,
  ``0x[0-9a-fA-F]+``;
* float -- ``[-+]?(\\.[0-9]+|[0-9]+(\\.[0-9]*)?)([eE][-+]?[0-9]+)?``,
  ``[-+]?.inf`` (any of its three spellings) and ``.nan``;

everything else is a string (``NO``, ``yes``, ``1:30``, ``2024-06-01``,
``1_000``). :class:`Yaml12Loader` is PyYAML's safe loader (the C one when
built) with exactly those implicit resolvers, and an int constructor that reads
them by 1.2's rules (PyYAML's own would read ``010`` as octal). The merge key
``<<`` is kept (a 1.1 extension task files may already use). Explicit tags
(``!!str 10``) work as before.

The parser is PyYAML's, so marks (line numbers) and the node tree that
:mod:`blockx.cli.taskfile_checks` walks for line numbers and duplicate keys
are unchanged. Nothing here reads a file.
"""

from __future__ import annotations

import re
import sys
from typing import Any, ClassVar, Final

__all__ = ["Yaml12Loader", "load"]


class _LazyPattern:
    """A pattern compiled at its first use (PyYAML's own, see :func:`_import_yaml`)."""

    __slots__ = ("_args", "_compile", "_pattern")

    def __init__(self, compile_: Any, pattern: Any, flags: int) -> None:
        self._compile = compile_
        self._args = (pattern, flags)
        self._pattern: re.Pattern[Any] | None = None

    def __getattr__(self, name: str) -> Any:
        pattern = self._pattern
        if pattern is None:
            pattern = self._pattern = self._compile(*self._args)
        return getattr(pattern, name)

    def __repr__(self) -> str:
        return f"_LazyPattern({self._args[0]!r})"


def _import_yaml() -> Any:
    """``import yaml``, PyYAML's module-level patterns compiled at their first use.

    Importing PyYAML compiles ~9 regular expressions (its reader's non-printable
    character class, its YAML 1.1 resolvers, the timestamp): ~10 ms of every ``blockx
    run``, ``validate`` and ``submit``, for patterns our C loader with its own 1.2
    resolvers never uses (its Python reader and 1.1 resolver are not involved). While
    it is imported, ``re.compile`` called from a ``yaml`` module returns a
    :class:`_LazyPattern` (``match``, ``search``, ... compile it then); any other caller,
    another thread's included, gets the real one, which is back in place after.
    """
    if "yaml" in sys.modules:
        return sys.modules["yaml"]
    compile_ = re.compile

    def lazy_compile(pattern: Any, flags: int = 0) -> Any:
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller == "yaml" or caller.startswith("yaml."):
            return _LazyPattern(compile_, pattern, flags)
        return compile_(pattern, flags)

    re.compile = lazy_compile
    try:
        import yaml  # type: ignore[import-untyped,unused-ignore]
    finally:
        re.compile = compile_
    return yaml


yaml = _import_yaml()

_NULL: Final = re.compile(r"^(?:~|null|Null|NULL|)$")
_BOOL: Final = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_INT: Final = re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$")
_FLOAT: Final = re.compile(
    r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
)
_MERGE: Final = re.compile(r"^(?:<<)$")

_BASE: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class Yaml12Loader(_BASE):  # type: ignore[misc,valid-type,unused-ignore]
    """PyYAML's safe loader resolving plain scalars by the YAML 1.2 core schema."""

    # A class of its own: add_implicit_resolver would otherwise copy the 1.1 table.
    yaml_implicit_resolvers: ClassVar[dict[str | None, list[tuple[str, Any]]]] = {}

    def __repr__(self) -> str:
        return "Yaml12Loader(core schema)"


def _construct_int(loader: Any, node: Any) -> int:
    """An int by 1.2's rules: decimal (``010`` is 10), ``0o`` octal, ``0x`` hex."""
    text = str(loader.construct_scalar(node)).replace("_", "")
    sign = -1 if text.startswith("-") else 1
    digits = text.lstrip("+-")
    if digits[:2] in ("0o", "0O"):
        return sign * int(digits[2:], 8)
    if digits[:2] in ("0x", "0X"):
        return sign * int(digits[2:], 16)
    if digits[:2] in ("0b", "0B"):  # only through an explicit !!int tag
        return sign * int(digits[2:], 2)
    return sign * int(digits, 10)


for _tag, _pattern, _first in (
    ("tag:yaml.org,2002:null", _NULL, ["~", "n", "N", ""]),
    ("tag:yaml.org,2002:bool", _BOOL, list("tTfF")),
    ("tag:yaml.org,2002:int", _INT, list("-+0123456789")),
    ("tag:yaml.org,2002:float", _FLOAT, list("-+.0123456789")),
    ("tag:yaml.org,2002:merge", _MERGE, ["<"]),
):
    Yaml12Loader.add_implicit_resolver(_tag, _pattern, _first)
Yaml12Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)


def load(text: str) -> Any:
    """The data of one YAML document, by the 1.2 core schema (tests and tools)."""
    return yaml.load(text, Loader=Yaml12Loader)  # a safe loader
