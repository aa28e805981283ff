"""blockx.worker.link's imports point one way: no cycle, not even for type checking.

The executor adapter is composed of parts it holds (inbound handlers, sends, eras),
not a class assembled from mixins; each part imports what it needs and nothing
imports back up (``state`` holds the connection; the connection knows only the
executor id it attached as).
"""

from __future__ import annotations

import ast
from pathlib import Path

import blockx.worker.link

LINK = Path(blockx.worker.link.__file__).resolve().parent
PACKAGE = "blockx.worker.link"


def link_imports(root: Path) -> dict[str, set[str]]:
    """Module name -> the link modules it imports (any import statement: run time,
    ``TYPE_CHECKING`` or inside a function)."""
    modules = {path.stem for path in root.glob("*.py") if path.stem != "__init__"}
    graph: dict[str, set[str]] = {}
    for name in modules:
        found: set[str] = set()
        for node in ast.walk(ast.parse((root / f"{name}.py").read_text())):
            if isinstance(node, ast.ImportFrom):
                target = node.module or ""
                if node.level == 1:
                    target = f"{PACKAGE}.{target}" if target else PACKAGE
                if target == PACKAGE:
                    found |= {alias.name for alias in node.names} & modules
                elif target.startswith(PACKAGE + "."):
                    found.add(target[len(PACKAGE) + 1 :].split(".")[0])
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith(PACKAGE + "."):
                        found.add(alias.name[len(PACKAGE) + 1 :].split(".")[0])
        graph[name] = found - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group: list[str] = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_link_modules_import_each_other_in_one_direction_only() -> None:
    graph = link_imports(LINK)
    assert {"adapter", "connection", "state", "handlers", "outbound", "eras"} <= set(graph)
    assert cycles(graph) == []
    assert "state" not in graph["connection"]


def test_the_cycle_finder_sees_a_type_checking_cycle(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text(f"from {PACKAGE}.b import B\n")
    (tmp_path / "b.py").write_text(
        f"from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from {PACKAGE}.a import A\n"
    )
    (tmp_path / "c.py").write_text(f"from {PACKAGE} import a\n")
    graph = link_imports(tmp_path)
    assert graph == {"a": {"b"}, "b": {"a"}, "c": {"a"}}
    assert cycles(graph) == [["a", "b"]]


def test_no_link_module_uses_the_trait_markers() -> None:
    """The adapter holds its parts: no mixin traits, no stubs standing in for the host."""
    for path in sorted(LINK.glob("*.py")):
        text = path.read_text()
        assert "mypyc_markers" not in text, path.name
        assert "NotImplementedError" not in text, path.name
