"""CompiledModule: one digest's code object, kept interpreted.

The module registry (:mod:`.module_registry`) is compiled by mypyc where the
install can; it tracks the compiled modules it hands out with weak references
(``weakref.WeakValueDictionary``), which a class compiled by mypyc does not
support. So the class lives here, in a module that stays interpreted
(``setup.py``'s ``NATIVE_MODULES`` leaves it out).
"""

from __future__ import annotations

import linecache
from typing import Any

__all__ = ["CompiledModule", "module_filename"]


def module_filename(function_id: str) -> str:
    """The ``co_filename`` of a user module: ``<blockx:{functionId}>``."""
    return f"<blockx:{function_id}>"


class CompiledModule:
    """One digest's code object, its source lines and its top-level ``def`` names."""

    __slots__ = (
        "__weakref__",
        "code",
        "digest",
        "filename",
        "function_id",
        "lines",
        "top_level_defs",
        "underscore_alias",
    )

    def __init__(
        self,
        *,
        code: Any,
        digest: str,
        function_id: str,
        lines: list[str],
        top_level_defs: tuple[str, ...],
        underscore_alias: bool,
    ) -> None:
        self.code = code
        self.digest = digest
        self.function_id = function_id
        self.filename = module_filename(function_id)
        self.lines = lines
        self.top_level_defs = top_level_defs
        self.underscore_alias = underscore_alias

    def register_lines(self) -> None:
        """Make :mod:`linecache` (hence tracebacks) show this digest's source."""
        size = sum(len(line) for line in self.lines)
        linecache.cache[self.filename] = (size, None, self.lines, self.filename)

    def __repr__(self) -> str:
        return (
            f"CompiledModule({self.function_id!r}, {self.digest[:19]}…, defs={self.top_level_defs})"
        )
