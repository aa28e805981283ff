"""The package's import graph: no cycle, and the layers import one way (docs/architecture.md).

Every module under ``src/blockx`` is parsed with :mod:`ast`; every import counts,
wherever it sits: at the top, inside ``if TYPE_CHECKING:``, inside a function (a
lazy import is still a dependency: it only hides the cycle from the interpreter).
``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else to
``pkg``. Importing ``a.b.c`` also runs ``a/__init__`` and ``a/b/__init__``; those
implicit edges are left out (a package's ``__init__`` re-exporting its own
submodules is not a cycle anyone has to untangle).

The layers (docs/architecture.md):

* ``blockx.executor`` imports nothing from ``blockx.worker`` or ``blockx.cli``;
* ``blockx.worker.core`` imports only itself and ``blockx.wire`` (and the
  standard library: ``tests/core/test_dispatcher_purity.py`` narrows that);
* ``blockx.worker.pool`` imports nothing from ``worker.link``, ``worker.actor``,
  ``worker.app``; ``worker.link`` nothing from ``worker.actor``, ``worker.app``;
  ``worker.actor`` nothing from ``worker.app``;
* nothing under ``blockx.worker`` or ``blockx.executor`` imports ``blockx.cli``;
* ``blockx.wire`` imports nothing else of ``blockx`` (both sides share it);
* the client of ``blockx serve`` (``blockx.client``, ``blockx.cli.remote``) imports
  nothing of the worker, the executor or the server (a client machine needs HTTP only);
* ``blockx.worker.config_model`` (the configuration model) imports neither
  schema's module (``worker.config``, ``worker.io.config``) nor
  ``worker.config_layers``, which resolves both together; the two schemas'
  modules import neither each other nor ``config_layers``.
"""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Iterable, Mapping

import blockx

SRC = pathlib.Path(blockx.__file__).parent.parent

#: (importer prefix, forbidden imported prefixes): a module named ``prefix`` or under it.
LAYER_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("blockx.executor", ("blockx.worker", "blockx.cli")),
    ("blockx.worker", ("blockx.cli",)),
    ("blockx.cluster", ("blockx.cli", "blockx.serve")),
    ("blockx.wire", ("blockx.worker", "blockx.executor", "blockx.cli", "blockx.audit")),
    (
        "blockx.worker.pool",
        ("blockx.worker.link", "blockx.worker.actor", "blockx.worker.app"),
    ),
    ("blockx.worker.link", ("blockx.worker.actor", "blockx.worker.app")),
    ("blockx.client", ("blockx.worker", "blockx.executor", "blockx.serve")),
    ("blockx.cli.remote", ("blockx.worker", "blockx.executor", "blockx.serve")),
    ("blockx.worker.actor", ("blockx.worker.app",)),
    # the configuration model is given its schemas; their modules import it, never the reverse
    (
        "blockx.worker.config_model",
        ("blockx.worker.config", "blockx.worker.config_layers", "blockx.worker.io"),
    ),
    ("blockx.worker.config", ("blockx.worker.config_layers", "blockx.worker.io")),
    ("blockx.worker.io.config", ("blockx.worker.config", "blockx.worker.config_layers")),
)
#: ``blockx.worker.core`` may import only these parts of ``blockx``.
CORE = "blockx.worker.core"
CORE_MAY_IMPORT = ("blockx.worker.core", "blockx.wire")


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, pathlib.Path]:
    return {_module_name(p): p for p in sorted((SRC / "blockx").rglob("*.py"))}


def _imports(module: str, path: pathlib.Path, known: Iterable[str]) -> set[str]:
    """The ``blockx`` modules ``module`` imports, anywhere in its body."""
    modules = set(known)
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                if not is_package:
                    base = base[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in modules else target)
    out = set()
    for name in found:
        # ``import a.b.c`` names a.b.c; a name that is not a module is its nearest module.
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name.startswith("blockx") and name != module:
            out.add(name)
    return out


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def strongly_connected(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Tarjan's components with more than one module (a cycle each), iteratively."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = [(root, sorted(graph[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, pending = work[-1]
            if pending:
                nxt = pending.pop()
                if nxt not in graph:
                    continue
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph[nxt])))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return components


def one_cycle(graph: Mapping[str, set[str]], component: list[str]) -> list[str]:
    """A shortest cycle through the component's first module, for the message."""
    members = set(component)
    start = component[0]
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & members):
                if nxt == start:
                    return [*paths[node], start]
                if nxt not in paths:
                    paths[nxt] = [*paths[node], nxt]
                    following.append(nxt)
        frontier = following
    return component


def _describe(graph: Mapping[str, set[str]], components: list[list[str]]) -> str:
    lines = []
    for component in components:
        lines.append(f"cycle among {len(component)} modules: {', '.join(component)}")
        lines.append("    e.g. " + " -> ".join(one_cycle(graph, component)))
    return "\n".join(lines)


def test_the_graph_sees_every_kind_of_import() -> None:
    graph = import_graph()
    assert len(graph) > 100
    # top-level ``from x import y`` (y a module), relative imports, lazy imports in a function
    assert "blockx.worker.pool.process_tree" in graph["blockx.worker.pool.manager"]
    assert "blockx.executor.cli" in graph["blockx.executor.__main__"]
    assert "blockx.executor.runtime" in graph["blockx.executor.__main__"]  # inside _run_contained
    # ``if TYPE_CHECKING:`` only
    assert "blockx.worker.config" in graph["blockx.worker.pool.spawner"]


def test_strongly_connected_finds_a_planted_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert strongly_connected(graph) == [["a", "b", "c"]]
    assert one_cycle(graph, ["a", "b", "c"]) == ["a", "b", "c", "a"]


def test_no_import_cycle() -> None:
    graph = import_graph()
    components = strongly_connected(graph)
    report = _describe(graph, components)
    print(report or "no import cycle")
    assert not components, "import cycles:\n" + report


def test_layers_import_one_way() -> None:
    graph = import_graph()
    wrong = []
    for module, imported in sorted(graph.items()):
        for target in sorted(imported):
            for importer, forbidden in LAYER_RULES:
                if _under(module, importer) and any(_under(target, f) for f in forbidden):
                    wrong.append(f"{module} imports {target}")
            if _under(module, CORE) and not any(_under(target, ok) for ok in CORE_MAY_IMPORT):
                wrong.append(f"{module} imports {target} (the core imports only core and wire)")
    assert not wrong, "\n".join(wrong)
