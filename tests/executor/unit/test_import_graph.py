"""The executor's modules import one another without a cycle, ``TYPE_CHECKING`` included.

Every import statement counts: at module level, under ``if TYPE_CHECKING:`` and
inside functions (a late import is still an edge a reader has to follow). The
graph is read from the sources, so it holds for the compiled build too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import blockx.executor

PACKAGE = "blockx.executor"
SOURCES = Path(blockx.executor.__file__).resolve().parent


def executor_import_graph(directory: Path) -> dict[str, set[str]]:
    """Module name (``runtime``) -> the executor modules it imports, anywhere in it."""
    modules = {path.stem for path in directory.glob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name in modules:
        tree = ast.parse((directory / f"{name}.py").read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                if node.level == 1:
                    base = node.module
                elif node.level == 0 and node.module and node.module.startswith(PACKAGE):
                    base = node.module[len(PACKAGE) + 1 :] or None
                else:
                    continue
                if base is None:  # from . import x / from blockx.executor import x
                    targets = [alias.name for alias in node.names]
                else:
                    targets = [base.split(".")[0]]
            elif isinstance(node, ast.Import):
                targets = [
                    alias.name[len(PACKAGE) + 1 :].split(".")[0]
                    for alias in node.names
                    if alias.name.startswith(PACKAGE + ".")
                ]
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (``[a, b, ..., a]``), or None."""
    visiting: list[str] = []
    done: set[str] = set()

    def visit(node: str) -> list[str] | None:
        if node in visiting:
            return [*visiting[visiting.index(node) :], node]
        if node in done:
            return None
        visiting.append(node)
        for target in sorted(graph[node]):
            cycle = visit(target)
            if cycle is not None:
                return cycle
        visiting.pop()
        done.add(node)
        return None

    for start in sorted(graph):
        cycle = visit(start)
        if cycle is not None:
            return cycle
    return None


def test_the_executor_has_no_import_cycle() -> None:
    graph = executor_import_graph(SOURCES)
    assert {"runtime", "context", "sdk_bridge", "greenlet_pool"} <= graph.keys()
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_the_shared_call_types_import_nothing_that_imports_them() -> None:
    graph = executor_import_graph(SOURCES)
    assert graph["markers"] == set()
    assert graph["context"] == {"errors"}
    assert "runtime" not in graph["call_runner"] | graph["inbound_frames"]


def test_a_cycle_is_found() -> None:
    # The checker itself can fail: the cycle the executor had (issue 17).
    graph = {
        "context": {"sdk_bridge"},
        "sdk_bridge": {"context", "greenlet_pool"},
        "greenlet_pool": {"context"},
    }
    assert find_cycle(graph) == ["context", "sdk_bridge", "context"]
