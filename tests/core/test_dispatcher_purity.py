"""The dispatcher core imports nothing that does IO, reads a clock or a random source."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import blockx.worker.core as core_package

CORE_DIR = pathlib.Path(core_package.__file__).parent

#: Modules the core must never import (nor any submodule of them).
FORBIDDEN = {
    "asyncio",
    "concurrent",
    "datetime",
    "greenlet",
    "http",
    "io",
    "logging",
    "multiprocessing",
    "os",
    "pathlib",
    "random",
    "select",
    "selectors",
    "shutil",
    "signal",
    "socket",
    "ssl",
    "subprocess",
    "sys",
    "tempfile",
    "threading",
    "time",
    "urllib",
    "uvloop",
}
#: Everything the core is allowed to import from outside itself.
ALLOWED = {
    "__future__",
    "collections",
    "dataclasses",
    "enum",
    "hashlib",
    "heapq",
    "itertools",
    "typing",
}


def _imports(path: pathlib.Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_core_modules_import_only_pure_modules() -> None:
    files = sorted(CORE_DIR.glob("*.py"))
    assert len(files) >= 10
    for path in files:
        for name in _imports(path):
            top = name.split(".")[0]
            assert top not in FORBIDDEN, f"{path.name} imports {name}"
            assert top in ALLOWED, f"{path.name} imports {name}, which is not on the allow-list"


def test_importing_the_core_pulls_in_no_io_machinery() -> None:
    script = (
        "import sys; before = set(sys.modules); import blockx.worker.core; "
        "new = set(sys.modules) - before; "
        "print(' '.join(sorted(m for m in new if m.split('.')[0] in "
        "{'asyncio', 'socket', 'threading', 'random', 'greenlet', 'selectors', 'subprocess'})))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == ""
