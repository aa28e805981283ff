"""Entry resolution: which top-level ``def`` of a module a call runs.

The seed's rule, in order: the ``def`` named after the functionId's last
segment (after the last ``/`` or ``.``); else ``def _`` or an alias
``_ = some_def``; else the first public ``def``. The executor applies the same
rule (plus ``entrySelector``) in ``blockx.executor.module_registry``; the
auditor reports the result so the worker can show it before any dispatch.
"""

from __future__ import annotations

import ast

__all__ = ["entry_from_defs", "function_id_segment", "resolve_entry_name", "top_level_entries"]


def function_id_segment(function_id: str) -> str:
    """The functionId's last segment: ``tenant/pkg.adder`` → ``adder``."""
    return function_id.rsplit("/", 1)[-1].rsplit(".", 1)[-1]


def top_level_entries(tree: ast.Module) -> tuple[tuple[str, ...], bool]:
    """The module's top-level ``def`` names in order, and whether ``_ = name`` aliases one."""
    defs: list[str] = []
    alias = False
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            if node.name not in defs:
                defs.append(node.name)
        elif (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id == "_"
            and isinstance(node.value, ast.Name)
        ):
            alias = True
    return tuple(defs), alias


def entry_from_defs(defs: tuple[str, ...], alias: bool, function_id: str) -> str | None:
    """The rule applied to :func:`top_level_entries`' result."""
    segment = function_id_segment(function_id)
    if segment and segment in defs:
        return segment
    if "_" in defs or alias:
        return "_"
    for name in defs:
        if not name.startswith("_"):
            return name
    return None


def resolve_entry_name(source_or_tree: str | ast.Module, function_id: str) -> str | None:
    """The entry function's name for ``function_id``, or None when nothing fits.

    ``source_or_tree`` is the module's source (parsed here; a :class:`SyntaxError`
    propagates) or its already parsed :class:`ast.Module`.
    """
    tree = ast.parse(source_or_tree) if isinstance(source_or_tree, str) else source_or_tree
    defs, alias = top_level_entries(tree)
    return entry_from_defs(defs, alias, function_id)
