"""The dispatch actor's modules import one way: the orchestrator composes its parts.

``blockx.worker.actor.orchestrator`` builds its parts (waits, attempt ends, tasks,
the tick, snapshot sync) and hands each what it needs; no part imports the
orchestrator, and the modules of ``blockx/worker/actor/`` form no import cycle,
counting imports made only for the type checker. The parts are plain classes:
no mypyc trait markers.
"""

from __future__ import annotations

import ast
from pathlib import Path

ACTOR = Path(__file__).resolve().parents[3] / "src" / "blockx" / "worker" / "actor"
PACKAGE = "blockx.worker.actor"


def actor_imports(directory: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (TYPE_CHECKING included)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(directory.glob("*.py")):
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                if node.module.startswith(PACKAGE + "."):
                    found.add(node.module.removeprefix(PACKAGE + "."))
                elif node.module == PACKAGE:
                    found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.Import):
                found.update(
                    alias.name.removeprefix(PACKAGE + ".")
                    for alias in node.names
                    if alias.name.startswith(PACKAGE + ".")
                )
        graph[path.stem] = found
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import cycle, each as the path that closes it."""
    found: list[list[str]] = []

    def visit(module: str, path: list[str]) -> None:
        for imported in sorted(graph.get(module, ())):
            if imported in path:
                found.append([*path[path.index(imported) :], imported])
            else:
                visit(imported, [*path, imported])

    for module in sorted(graph):
        visit(module, [module])
    return found


def test_no_import_cycle_among_the_actor_modules() -> None:
    assert cycles(actor_imports(ACTOR)) == []


def test_no_part_imports_the_orchestrator() -> None:
    graph = actor_imports(ACTOR)
    assert [name for name, imported in graph.items() if "orchestrator" in imported] == []


def test_the_actor_uses_no_mypyc_trait_markers() -> None:
    users = [p.name for p in sorted(ACTOR.glob("*.py")) if "mypyc_markers" in p.read_text()]
    assert users == []


def test_the_scan_finds_a_cycle_through_a_type_checking_import(tmp_path: Path) -> None:
    (tmp_path / "orchestrator.py").write_text(f"from {PACKAGE}.waits import Waits\n")
    (tmp_path / "waits.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        f"    from {PACKAGE}.orchestrator import OrchestratorStats\n"
    )
    assert cycles(actor_imports(tmp_path))[0] == ["orchestrator", "waits", "orchestrator"]
