"""Which functions use ``Table``: a cluster run refuses them on a node-local SQLite store.

A function uses the table store when its source names ``Table`` (the prelude's name,
``blockx.db.Table``: ``Table("t")``, ``from blockx.db import Table``, ``db.Table``).
The check reads the syntax tree only (no code runs); a source that does not parse is
not counted (its calls fail on any node, as on one machine).
"""

from __future__ import annotations

import ast
from collections.abc import Mapping

__all__ = ["functions_using_table", "uses_table"]


def uses_table(source: str) -> bool:
    """Whether ``source`` names ``Table`` anywhere (a name, an attribute, an import)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == "Table":
            return True
        if isinstance(node, ast.Attribute) and node.attr == "Table":
            return True
        if isinstance(node, ast.ImportFrom) and any(a.name == "Table" for a in node.names):
            return True
    return False


def functions_using_table(functions: Mapping[str, str]) -> list[str]:
    """The ids of the functions whose source uses ``Table``, sorted."""
    return sorted(fid for fid, source in functions.items() if uses_table(source))
