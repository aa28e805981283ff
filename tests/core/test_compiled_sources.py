"""The modules mypyc compiles avoid what compiles to different behaviour.

mypyc gives a local name one type per function: in

    except Refused as exc: ...
    except Exception as exc: ...

``exc`` is typed ``Refused``; if ``Refused`` is a class mypyc compiled too (an
exception class defined in a compiled module), the second handler raises
``TypeError`` the moment a plain ``Exception`` arrives -- compiled only, and only
on that error path, which tests seldom take (shown on a small module; a class
from an interpreted module, as every exception of ours is today, is not
checked). The rule here is the simple one that needs no knowing which: one
name per exception type in a function.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _native_modules() -> list[Path]:
    setup = (ROOT / "setup.py").read_text()
    block = setup[setup.index("NATIVE_MODULES = [") :]
    block = block[: block.index("]")]
    return [ROOT / "src" / path for path in re.findall(r'"(blockx/[^"]+\.py)"', block)]


def _handlers_sharing_a_name(tree: ast.AST) -> list[str]:
    found = []
    for func in ast.walk(tree):
        if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        types: dict[str, set[str]] = {}
        for node in ast.walk(func):
            if isinstance(node, ast.ExceptHandler) and node.name:
                caught = ast.unparse(node.type) if node.type is not None else "BaseException"
                types.setdefault(node.name, set()).add(caught)
        found += [
            f"{func.name} (line {func.lineno}): '{name}' binds {sorted(caught)}"
            for name, caught in types.items()
            if len(caught) > 1
        ]
    return found


def test_the_native_module_list_is_read() -> None:
    modules = _native_modules()
    assert len(modules) >= 40
    assert all(path.exists() for path in modules), [p for p in modules if not p.exists()]


def test_the_makefile_rebuilds_when_any_compiled_source_changes() -> None:
    # `make setup` compiles again only when a prerequisite of the build's stamp changed: a
    # compiled module outside NATIVE_SOURCES would leave a stale build (run as sources).
    makefile = (ROOT / "Makefile").read_text()
    block = makefile[makefile.index("NATIVE_SOURCES :=") :]
    block = block[: block.index(")\n")]
    patterns = re.findall(r"(src/blockx/\S+\.py)", block)
    uncovered = [
        str(path.relative_to(ROOT))
        for path in _native_modules()
        if not any(path.relative_to(ROOT).match(pattern) for pattern in patterns)
    ]
    assert patterns and uncovered == [], f"add to the Makefile's NATIVE_SOURCES: {uncovered}"


def test_no_compiled_function_binds_one_name_to_two_exception_types() -> None:
    problems = {
        str(path.relative_to(ROOT)): found
        for path in _native_modules()
        if (found := _handlers_sharing_a_name(ast.parse(path.read_text())))
    }
    assert problems == {}, "give each `except ... as NAME` its own name: " + repr(problems)


def test_the_scan_finds_the_pattern() -> None:
    source = (
        "def f():\n"
        "    try:\n        pass\n"
        "    except KeyError as exc:\n        pass\n"
        "    except Exception as exc:\n        pass\n"
        "    try:\n        pass\n"
        "    except (A, B) as fine:\n        pass\n"
    )
    assert _handlers_sharing_a_name(ast.parse(source)) == [
        "f (line 1): 'exc' binds ['Exception', 'KeyError']"
    ]
