"""``blockx validate``: the checks ``blockx run`` makes before it starts, and nothing run.

Theory of operation
-------------------
The task file is loaded and checked, every line of its calls file is scanned,
the configuration is built from the same sources as a run's — the very same
step 1 as ``blockx run`` (:func:`blockx.cli.settings.load_task_and_settings`); a problem
in any of them ends the command with exit status 2, each problem on its own
``blockx: error:`` line of stderr. Then every function source is compiled
(:meth:`blockx.cli.taskfile.TaskFile.code_problems`, the worker's own check): a
function that cannot run is an error here, where ``blockx run`` only warns.
``function.call("name", ...)`` with a literal name the task does not define
is a warning (the call would fail at run time). A valid task prints a
one-line summary on stdout (unless ``--quiet``) and exits 0. No worker,
executor or IO backend is started.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from blockx.cli.console import Console, count_text, indent, print_problems
from blockx.cli.report import EXIT_OK, EXIT_USAGE
from blockx.cli.settings import UsageError, load_task_and_settings
from blockx.cli.taskfile import SpecError, TaskFile

__all__ = ["validate_command"]


def validate_command(
    task: str, *, config: str | None = None, sets: Sequence[str] = (), quiet: bool = False
) -> int:
    """``blockx validate``; returns the exit status (0 valid, 2 not)."""
    console = Console(sys.stderr, tty=False)
    try:
        spec, count, _settings = load_task_and_settings(task, config_file=config, sets=sets)
    except (SpecError, UsageError) as exc:
        print_problems(console, exc.problems)
        return EXIT_USAGE
    problems = spec.code_problems()
    for problem in problems:
        console.print(f"blockx: error: {problem.message}")
        if problem.excerpt:
            console.print(indent(problem.excerpt, "    "))
    warnings = _subcall_warnings(spec)
    for warning in warnings:
        console.print(f"blockx: warning: {warning}")
    if problems:
        return EXIT_USAGE
    if not quiet:
        source = f"streamed from {spec.calls_label}" if spec.is_stream else "inline"
        names = ", ".join(spec.functions)
        print(
            f"{spec.label}: ok — {len(spec.functions)} function(s) ({names}), "
            f"{count_text(count)} call(s) {source}"
        )
    return EXIT_OK


def _subcall_warnings(spec: TaskFile) -> list[str]:
    """``function.call("name", ...)`` with a literal name the task does not define."""
    import ast

    out: list[str] = []
    for fid, fn in spec.functions.items():
        try:
            tree = ast.parse(fn.source)
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "call"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "function"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
                and node.args[0].value not in spec.functions
            ):
                file, line = fn.locate(node.lineno)
                out.append(
                    f"{file}:{line}: function.call({node.args[0].value!r}) names no function "
                    f"of this task (functions: {', '.join(spec.functions)}); in function {fid!r}"
                )
    return out
