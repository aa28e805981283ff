"""Task files: what ``blockx run`` and ``blockx validate`` read, checked before anything runs.

Theory of operation
-------------------
A task file is YAML (or JSON when its name ends in ``.json``)::

    task_id: quickstart                 # optional (default: task-<12 hex>)
    instance: tenant-a                  # optional fairness key
    functions:
      wallet_value: {path: functions/wallet_value.py}     # relative to this file
      double: {source: "def _(x):\\n    return 2 * x\\n"}
    calls:                              # or  calls_file: calls.jsonl  (streamed)
      - {function: wallet_value, args: {wallet: alice}}
    policy: {max_attempts: 3, failure: continue, call_budget_ms: 5000}
    audit: false
    io: {data_dir: .data}               # merged over the environment's IO configuration

:func:`load_task_file` reads and checks it all (reading every function
source) and returns a :class:`TaskFile`, or raises :class:`SpecError` whose
``problems`` each name the file, the field path and what is wrong::

    task.yaml: policy.max_attempts: expected a positive integer, got 'three' (line 9)
    task.yaml: calls[3].function: 'addr' is not a function of this task (functions: adder, pricer)
    calls.jsonl: line 17: not valid JSON: unexpected character at column 12

A ``calls_file`` is JSON Lines, one ``{"function": ..., "args": ...}`` per
line (blank lines are skipped). It is never loaded whole:
:meth:`TaskFile.scan_calls_file` checks it line by line (and counts its
calls), :meth:`TaskFile.iter_calls_file` yields :class:`Call` objects line by
line for the worker's stream path.

Function sources are compiled by :meth:`TaskFile.code_problems` (the worker's
own check, :func:`blockx.worker.code.function_code`): a syntax error or a
module without an entry ``def`` is reported with the source file and line.
``blockx validate`` fails on such a problem; ``blockx run`` reports it and runs
(the calls of that function fail, the others run — under ``failure:
continue`` the task goes on).

Line numbers of user code: the executor compiles a function under the name
``<blockx:ID>``; :meth:`TaskFile.user_locations` rewrites those names in
messages and stack traces to the real file (for an inline ``source`` written
as a YAML ``|`` block, the task file and the line inside it).
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Final

__all__ = [
    "CodeProblem",
    "FunctionSource",
    "SpecError",
    "TaskFile",
    "load_task_file",
]

#: Top-level fields of a task file.
TOP_FIELDS: Final = (
    "task_id",
    "instance",
    "functions",
    "calls",
    "calls_file",
    "policy",
    "audit",
    "io",
)
POLICY_FIELDS: Final = (
    "max_attempts",
    "failure",
    "call_budget_ms",
    "base_backoff_ms",
    "max_output_bytes",
    "debug",
    "deadline_ms",
)
CALL_FIELDS: Final = ("function", "args")
FAILURE_POLICIES: Final = ("fast_fail", "continue")
#: IO knobs that are paths: relative ones are taken relative to the task file.
IO_PATH_KNOBS: Final = ((None, "data_dir"), ("blockdb", "sqlite_path"))

#: Task ids: what the worker, the logs and the IO scopes can carry verbatim.
_TASK_ID_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}")
_FUNCTION_ID_RE: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:/@-]{0,199}")
#: The name the executor compiles a function under (blockx.worker.code.module_filename).
_MODULE_NAME_RE: Final = re.compile(r"<blockx:([^>\n]+)>")
#: Problems listed before "... and N more" (per file).
MAX_PROBLEMS: Final = 20


class SpecError(ValueError):
    """A task file (or its calls file) is wrong; each line of the message names one problem."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


@dataclass(frozen=True, slots=True)
class FunctionSource:
    """One function of a task file: its source and where the source came from."""

    function_id: str
    source: str
    #: The ``.py`` file (``{path: ...}``), or None for an inline ``source``.
    path: Path | None
    #: How messages name the origin: the file as given, or ``task.yaml (functions.ID.source)``.
    origin: str
    #: Added to a line of the source to get the line in ``origin``'s file (inline ``|`` blocks).
    line_offset: int = 0
    #: The file a line of the source is in (the .py file, or the task file for a ``|`` block).
    line_file: str | None = None

    def locate(self, lineno: int) -> tuple[str, int]:
        """``(file, line)`` of line ``lineno`` of the source, for messages."""
        if self.line_file is None:
            return self.origin, lineno
        return self.line_file, lineno + self.line_offset


@dataclass(frozen=True, slots=True)
class CodeProblem:
    """A function that cannot run: it does not compile, or it has no entry ``def``."""

    function_id: str
    #: ``functions/bad.py:2:12: SyntaxError: '(' was never closed``
    message: str
    #: The offending line and a caret, when known.
    excerpt: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskFile:
    """A checked task file (see the module docstring)."""

    path: Path
    #: How messages name the task file: the path as given.
    label: str
    task_id: str | None
    instance: str | None
    functions: dict[str, FunctionSource]
    #: Inline calls (a one-shot task), or None when the task streams ``calls_file``.
    calls: list[Any] | None
    calls_file: Path | None
    #: ``TaskPolicy`` keyword arguments (checked).
    policy: dict[str, Any]
    audit: bool | None
    #: The ``io`` section, relative paths resolved against the task file's directory.
    io: dict[str, Any] = field(default_factory=dict)

    @property
    def is_stream(self) -> bool:
        return self.calls_file is not None

    @property
    def calls_label(self) -> str:
        """How messages name the calls file."""
        if self.calls_file is None:
            return self.label
        return _display(self.calls_file)

    # --- calls files ---------------------------------------------------------------------------

    def scan_calls_file(self, *, max_problems: int = MAX_PROBLEMS) -> int:
        """Check every line of ``calls_file`` (streaming) and return how many calls it holds.

        Raises :class:`SpecError` listing the first ``max_problems`` bad lines
        (and how many more there are).
        """
        assert self.calls_file is not None
        label = self.calls_label
        problems: list[str] = []
        more = 0
        count = 0
        known = self.functions
        try:
            handle = open(self.calls_file, "rb")
        except OSError as exc:
            raise SpecError(
                [f"{label}: cannot read the calls file: {exc.strerror or exc}"]
            ) from None
        with handle:
            for lineno, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    _parse_call_line(line, lineno, label, known)
                except SpecError as exc:
                    if len(problems) < max_problems:
                        problems.extend(exc.problems)
                    else:
                        more += 1
                    continue
                count += 1
        if more:
            problems.append(f"{label}: … and {more} more bad line(s)")
        if problems:
            raise SpecError(problems)
        return count

    def iter_calls_file(self) -> Iterator[Any]:
        """The calls of ``calls_file`` as :class:`~blockx.worker.api.Call` objects, line by line.

        A bad line (the file changed since it was scanned) raises :class:`SpecError`.
        """
        from blockx.worker.api import Call

        assert self.calls_file is not None
        label = self.calls_label
        known = self.functions
        with open(self.calls_file, "rb") as handle:
            for lineno, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                function_id, args = _parse_call_line(line, lineno, label, known)
                yield Call(function_id, args)

    # --- code ------------------------------------------------------------------------------------

    def code_problems(self) -> list[CodeProblem]:
        """Functions that do not compile or have no entry ``def`` (the worker's own check)."""
        from blockx.worker.code import function_code

        problems: list[CodeProblem] = []
        for fid, fn in self.functions.items():
            error = function_code(fid, fn.source).error
            if error is None:
                continue
            if error.lineno:
                file, line = fn.locate(error.lineno)
                where = f"{file}:{line}" + (f":{error.offset}" if error.offset else "")
                text = self.user_locations(error.message)
                text = re.sub(r"\s*\([^()]*, line \d+(, column \d+)?\)$", "", text)
                message = f"{where}: {text} (function {fid!r})"
                excerpt = None
                if error.stack:
                    lines = [ln for ln in error.stack.splitlines()[1:] if ln.strip()]
                    excerpt = "\n".join(ln for ln in lines if not ln.startswith("SyntaxError"))
                problems.append(CodeProblem(fid, message, excerpt or None))
            else:
                text = self.user_locations(error.message)
                problems.append(CodeProblem(fid, f"{fn.origin}: {text} (function {fid!r})"))
        return problems

    def user_locations(self, text: str) -> str:
        """``text`` with the executor's module names (``<blockx:ID>``, line N) made real files."""
        if "<blockx:" not in text:
            return text

        def stack_line(match: re.Match[str]) -> str:
            fn = self.functions.get(match.group(1))
            if fn is None:
                return match.group(0)
            file, line = fn.locate(int(match.group(2)))
            return f'File "{file}", line {line}'

        def paren(match: re.Match[str]) -> str:
            fn = self.functions.get(match.group(1))
            if fn is None:
                return match.group(0)
            file, line = fn.locate(int(match.group(2)))
            return f"({file}, line {line}"

        def bare(match: re.Match[str]) -> str:
            fn = self.functions.get(match.group(1))
            return fn.origin if fn is not None else match.group(0)

        text = re.sub(r'File "<blockx:([^>\n]+)>", line (\d+)', stack_line, text)
        text = re.sub(r"\(<blockx:([^>\n]+)>, line (\d+)", paren, text)
        return _MODULE_NAME_RE.sub(bare, text)

    # --- the Worker's task -----------------------------------------------------------------------

    def policy_object(self) -> Any:
        from blockx.worker.api import TaskPolicy

        return TaskPolicy(**self.policy)

    def to_task(self, calls: Any = None) -> Any:
        """The :class:`~blockx.worker.api.Task` to run (``calls`` overrides the file's)."""
        from blockx.worker.api import Call, Task, TaskPolicy

        if calls is None:
            calls = self.iter_calls_file() if self.is_stream else self.calls
            if not self.is_stream:
                calls = [Call(c[0], c[1]) for c in calls or ()]
        kwargs: dict[str, Any] = {
            "functions": {fid: fn.source for fid, fn in self.functions.items()},
            "calls": calls,
            "instance": self.instance,
        }
        if self.task_id is not None:
            kwargs["task_id"] = self.task_id
        policy_kwargs = dict(self.policy)
        if self.audit is not None:
            # The audit gate: a Task (or TaskPolicy) field once it is wired; until then the
            # flag is checked and has no effect (docs/taskspec.md says so).
            if "audit" in {f.name for f in fields(Task)}:
                kwargs["audit"] = self.audit
            elif "audit" in {f.name for f in fields(TaskPolicy)}:
                policy_kwargs["audit"] = self.audit
        kwargs["policy"] = TaskPolicy(**policy_kwargs)
        return Task(**kwargs)


def audit_supported() -> bool:
    """Whether the worker's Task API has an audit switch yet."""
    from blockx.worker.api import Task, TaskPolicy

    return "audit" in {f.name for f in fields(Task)} | {f.name for f in fields(TaskPolicy)}


# --- reading ---------------------------------------------------------------------------------


def _display(path: Path) -> str:
    """A path as messages show it: relative to the working directory when inside it."""
    try:
        rel = os.path.relpath(path)
    except ValueError:  # pragma: no cover - another drive (Windows)
        return str(path)
    return str(path) if rel.startswith("..") else rel


def _describe(value: Any) -> str:
    """A value as error messages quote it (short)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _field(path: tuple[Any, ...]) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _suggest(word: str, choices: Any) -> str:
    close = difflib.get_close_matches(str(word), list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


class _Lines:
    """Line numbers of the fields of a YAML document (from its node tree)."""

    def __init__(self, node: Any) -> None:
        self._node = node

    def line(self, path: tuple[Any, ...]) -> int | None:
        """The line of the field at ``path``, or of its deepest ancestor found."""
        import yaml  # type: ignore[import-untyped,unused-ignore]

        node = self._node
        for part in path:
            if isinstance(node, yaml.MappingNode):
                for key, value in node.value:
                    if getattr(key, "value", None) == part:
                        node = value
                        break
                else:
                    break
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
                if not 0 <= part < len(node.value):
                    break
                node = node.value[part]
            else:
                break
        return int(node.start_mark.line) + 1 if node is not None else None

    def node(self, path: tuple[Any, ...]) -> Any:
        import yaml  # type: ignore[import-untyped,unused-ignore]

        node = self._node
        for part in path:
            if isinstance(node, yaml.MappingNode):
                for key, value in node.value:
                    if getattr(key, "value", None) == part:
                        node = value
                        break
                else:
                    return None
            else:
                return None
        return node


class _NoLines:
    def line(self, path: tuple[Any, ...]) -> int | None:
        return None

    def node(self, path: tuple[Any, ...]) -> Any:
        return None


def _parse_document(text: str, label: str, is_json: bool) -> tuple[Any, Any]:
    """(data, line finder) of a task file's text; SpecError on a parse error."""
    if is_json:
        try:
            return json.loads(text, object_pairs_hook=_no_duplicate_keys), _NoLines()
        except json.JSONDecodeError as exc:
            raise SpecError(
                [f"{label}: line {exc.lineno}, column {exc.colno}: not valid JSON: {exc.msg}"]
            ) from None
        except _DuplicateKey as exc:
            raise SpecError(
                [f"{label}: duplicate key {exc.key!r} (the last one would win)"]
            ) from None
    import yaml  # type: ignore[import-untyped,unused-ignore]

    loader_cls = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    loader = loader_cls(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        what = exc.problem or exc.context or "malformed"
        context = exc.context_mark
        if exc.problem and exc.context and context is not None and context is not mark:
            what += f" ({exc.context} at line {context.line + 1}, column {context.column + 1})"
        raise SpecError([f"{label}: {where}not valid YAML: {what}"]) from None
    except yaml.YAMLError as exc:
        raise SpecError([f"{label}: not valid YAML: {exc}"]) from None
    finally:
        loader.dispose()
    if node is not None:
        _check_duplicate_keys(node, label)
    return data, _Lines(node)


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _check_duplicate_keys(root: Any, label: str) -> None:
    """A mapping that names a key twice is an error: YAML would keep the last silently."""
    import yaml  # type: ignore[import-untyped,unused-ignore]

    problems: list[str] = []
    stack = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, yaml.MappingNode):
            seen: dict[tuple[str, str], int] = {}
            for key, value in node.value:
                stack.append(value)
                if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                    line = key.start_mark.line + 1
                    first = seen.get((key.tag, key.value))
                    if first is None:
                        seen[(key.tag, key.value)] = line
                    else:
                        problems.append(
                            f"{label}: line {line}: duplicate key {key.value!r} (first at line "
                            f"{first}; the last one would win)"
                        )
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
    if problems:
        raise SpecError(sorted(problems, key=lambda p: int(p.split("line ")[1].split(":")[0])))


class _Checker:
    """Collects problems, each naming the file, the field and (YAML) the line."""

    def __init__(self, label: str, lines: Any) -> None:
        self.label = label
        self.lines = lines
        self.problems: list[str] = []
        self.more = 0

    def add(self, path: tuple[Any, ...], what: str) -> None:
        if len(self.problems) >= MAX_PROBLEMS:
            self.more += 1
            return
        line = self.lines.line(path)
        where = f" (line {line})" if line is not None else ""
        name = _field(path)
        self.problems.append(f"{self.label}: {name + ': ' if name else ''}{what}{where}")

    def unknown_fields(self, data: Mapping[Any, Any], path: tuple[Any, ...], known: Any) -> None:
        for key in data:
            if key not in known:
                self.add(
                    (*path, key),
                    f"unknown field{_suggest(key, known)}; expected one of: {', '.join(known)}",
                )

    def raise_if_any(self) -> None:
        if self.more:
            self.problems.append(f"{self.label}: … and {self.more} more problem(s)")
        if self.problems:
            raise SpecError(self.problems)


def _json_problem(value: Any, path: str = "") -> str | None:
    """Why ``value`` is not a JSON value (naming the sub-path), or None."""
    if value is None or isinstance(value, (bool, str)):
        return None
    if isinstance(value, int):
        return None
    if isinstance(value, float):
        return (
            None if math.isfinite(value) else f"{path or 'value'}: {value!r} is not a JSON number"
        )
    if isinstance(value, list):
        for i, item in enumerate(value):
            problem = _json_problem(item, f"{path}[{i}]")
            if problem:
                return problem
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return (
                    f"{path or 'value'}: key {key!r} is not a string (JSON object keys are "
                    "strings; quote it)"
                )
            problem = _json_problem(item, f"{path}.{key}" if path else key)
            if problem:
                return problem
        return None
    kind = type(value).__name__
    hint = " (quote it to pass a string)" if kind in ("date", "datetime") else ""
    return f"{path or 'value'}: a {kind} is not a JSON value{hint}"


def _positive_int(value: Any, *, minimum: int) -> bool:
    return type(value) is int and value >= minimum


def _check_policy(check: _Checker, policy: Any) -> dict[str, Any]:
    if policy is None:
        return {}
    if not isinstance(policy, Mapping):
        check.add(("policy",), f"expected a mapping of policy fields, got {_describe(policy)}")
        return {}
    check.unknown_fields(policy, ("policy",), POLICY_FIELDS)
    out: dict[str, Any] = {}
    ints = {
        "max_attempts": (1, "a positive integer"),
        "call_budget_ms": (0, "a non-negative integer (ms; 0 = unlimited)"),
        "base_backoff_ms": (0, "a non-negative integer (ms)"),
        "max_output_bytes": (1, "a positive integer (bytes)"),
        "deadline_ms": (1, "a positive integer (ms, the whole task's wall-clock limit)"),
    }
    for name, (minimum, expected) in ints.items():
        if name not in policy or policy[name] is None:
            continue
        value = policy[name]
        if not _positive_int(value, minimum=minimum):
            check.add(("policy", name), f"expected {expected}, got {_describe(value)}")
        else:
            out[name] = value
    if "failure" in policy:
        value = policy["failure"]
        if value not in FAILURE_POLICIES:
            check.add(
                ("policy", "failure"),
                f"expected fast_fail or continue, got {_describe(value)}"
                + (_suggest(value, FAILURE_POLICIES) if isinstance(value, str) else ""),
            )
        else:
            out["failure"] = value
    if "debug" in policy:
        value = policy["debug"]
        if type(value) is not bool:
            check.add(("policy", "debug"), f"expected true or false, got {_describe(value)}")
        else:
            out["debug"] = value
    if not check.problems:
        from blockx.worker.api import TaskPolicy, TaskSpecError

        try:
            TaskPolicy(**out)
        except TaskSpecError as exc:
            check.add(("policy",), str(exc).removeprefix("policy: "))
    return out


def _read_source(check: _Checker, base: Path, fid: str, raw: str) -> tuple[Path, str] | None:
    path = Path(os.path.expanduser(raw))
    if not path.is_absolute():
        path = base / path
    shown = _display(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        check.add(("functions", fid, "path"), f"file not found: {shown}")
        return None
    except IsADirectoryError:
        check.add(("functions", fid, "path"), f"{shown} is a directory, not a .py file")
        return None
    except OSError as exc:
        check.add(("functions", fid, "path"), f"cannot read {shown}: {exc.strerror or exc}")
        return None
    try:
        return path, data.decode("utf-8")
    except UnicodeDecodeError as exc:
        check.add(
            ("functions", fid, "path"),
            f"{shown} is not UTF-8 text (byte {exc.start}: {exc.reason})",
        )
        return None


def _check_functions(
    check: _Checker, functions: Any, base: Path, task_file: Path
) -> dict[str, FunctionSource]:
    out: dict[str, FunctionSource] = {}
    if functions is None:
        check.add(("functions",), "missing: a task needs at least one function")
        return out
    if not isinstance(functions, Mapping) or not functions:
        check.add(
            ("functions",),
            "expected a mapping {function_id: {path: FILE} or {source: CODE}}, got "
            + ("an empty mapping" if isinstance(functions, Mapping) else _describe(functions)),
        )
        return out
    for fid, spec in functions.items():
        if not isinstance(fid, str) or not _FUNCTION_ID_RE.fullmatch(fid):
            check.add(
                ("functions", fid),
                f"{_describe(fid)} is not a valid function id (letters, digits and _ . : / @ -, "
                "at most 200)",
            )
            continue
        if isinstance(spec, str):
            check.add(
                ("functions", fid),
                f"expected {{path: FILE}} or {{source: CODE}}, got a string (write "
                f"`{fid}: {{path: {spec if len(spec) < 40 else '...'}}}`)",
            )
            continue
        if not isinstance(spec, Mapping):
            check.add(
                ("functions", fid),
                f"expected {{path: FILE}} or {{source: CODE}}, got {_describe(spec)}",
            )
            continue
        check.unknown_fields(spec, ("functions", fid), ("path", "source"))
        has_path, has_source = "path" in spec, "source" in spec
        if has_path == has_source:
            check.add(
                ("functions", fid),
                "give exactly one of path (a .py file) or source (the code)"
                if has_path
                else "missing: path (a .py file, relative to the task file) or source (the code)",
            )
            continue
        if has_path:
            raw = spec["path"]
            if not isinstance(raw, str) or not raw.strip():
                check.add(("functions", fid, "path"), f"expected a file path, got {_describe(raw)}")
                continue
            read = _read_source(check, base, fid, raw)
            if read is None:
                continue
            path, source = read
            out[fid] = FunctionSource(fid, source, path, _display(path))
        else:
            source = spec["source"]
            if not isinstance(source, str) or not source.strip():
                check.add(
                    ("functions", fid, "source"),
                    f"expected the function's Python code, got {_describe(source)}",
                )
                continue
            origin = f"{_display(task_file)} (functions.{fid}.source)"
            node = check.lines.node(("functions", fid, "source"))
            if node is not None and getattr(node, "style", None) == "|":
                line_file = _display(task_file)
                out[fid] = FunctionSource(
                    fid, source, None, origin, int(node.start_mark.line) + 1, line_file
                )
            else:
                out[fid] = FunctionSource(fid, source, None, origin)
    return out


def _check_call(
    check: _Checker, call: Any, path: tuple[Any, ...], known: Mapping[str, Any]
) -> tuple[str, Any] | None:
    if not isinstance(call, Mapping):
        check.add(path, f"expected a mapping {{function: ID, args: ...}}, got {_describe(call)}")
        return None
    check.unknown_fields(call, path, CALL_FIELDS)
    fid = call.get("function")
    if fid is None:
        check.add((*path, "function"), "missing: the id of one of the task's functions")
        return None
    if not isinstance(fid, str):
        check.add((*path, "function"), f"expected a function id, got {_describe(fid)}")
        return None
    if known and fid not in known:
        check.add(
            (*path, "function"),
            f"{fid!r} is not a function of this task (functions: {', '.join(known)})"
            + _suggest(fid, known),
        )
        return None
    args = call.get("args", [])
    problem = _json_problem(args, "args")
    if problem:
        sub, _, what = problem.partition(": ")
        check.add((*path, *sub.split(".")), what)
        return None
    return fid, args


def _parse_call_line(
    line: bytes, lineno: int, label: str, known: Mapping[str, Any]
) -> tuple[str, Any]:
    """One JSONL line -> (function id, args); SpecError naming the line."""
    from blockx.wire import loads_wire

    try:
        call = loads_wire(line)
    except ValueError:
        try:
            json.loads(line)
            problem = "not valid JSON"
        except json.JSONDecodeError as exc:
            problem = f"not valid JSON: {exc.msg} at column {exc.colno}"
        except UnicodeDecodeError:
            problem = "not UTF-8 text"
        raise SpecError([f"{label}: line {lineno}: {problem}"]) from None
    if type(call) is dict and type(call.get("function")) is str and call["function"] in known:
        if len(call) == 2 and "args" in call:
            return call["function"], call["args"]
        if len(call) == 1:
            return call["function"], []
    check = _Checker(f"{label}: line {lineno}", _NoLines())
    _check_call(check, call, (), known)
    check.raise_if_any()
    return call["function"], call.get("args", [])  # pragma: no cover - caught above


def _resolve_io(check: _Checker, io: Any, base: Path) -> dict[str, Any]:
    if io is None:
        return {}
    if not isinstance(io, Mapping):
        check.add(("io",), f"expected a mapping of IO knobs, got {_describe(io)}")
        return {}
    resolved: dict[str, Any] = {}
    for key, value in io.items():
        resolved[key] = dict(value) if isinstance(value, Mapping) else value
    for section, name in IO_PATH_KNOBS:
        table = resolved if section is None else resolved.get(section)
        if isinstance(table, dict) and isinstance(table.get(name), str) and table[name].strip():
            raw = os.path.expanduser(table[name])
            table[name] = raw if os.path.isabs(raw) else str(base / raw)
    from blockx.worker.io.config import IOConfigError, load_io_config

    try:
        load_io_config(resolved, env={})
    except IOConfigError as exc:
        for problem in exc.problems:
            path = tuple(problem.split(":", 1)[0].split("=", 1)[0].split("."))
            line = check.lines.line(path)
            where = f" (line {line})" if line is not None else ""
            check.problems.append(f"{check.label}: {problem}{where}")
    return resolved


def load_task_file(path: str | os.PathLike[str]) -> TaskFile:
    """Read and check a task file (see the module docstring). Raises :class:`SpecError`."""
    given = Path(path)
    label = os.fspath(path)
    try:
        raw = given.read_bytes()
    except FileNotFoundError:
        raise SpecError([f"{label}: no such task file"]) from None
    except IsADirectoryError:
        raise SpecError([f"{label}: is a directory, not a task file"]) from None
    except OSError as exc:
        raise SpecError([f"{label}: cannot read the task file: {exc.strerror or exc}"]) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError([f"{label}: not UTF-8 text (byte {exc.start})"]) from None
    data, lines = _parse_document(text, label, given.suffix.lower() == ".json")
    check = _Checker(label, lines)
    if not isinstance(data, Mapping):
        what = "an empty file" if data is None else _describe(data)
        raise SpecError(
            [f"{label}: expected a mapping of task fields (functions, calls, ...), got {what}"]
        )
    check.unknown_fields(data, (), TOP_FIELDS)
    base = given.resolve().parent

    task_id = data.get("task_id")
    if task_id is not None and (not isinstance(task_id, str) or not _TASK_ID_RE.fullmatch(task_id)):
        check.add(
            ("task_id",),
            f"expected letters, digits and . _ : @ - (at most 128), got {_describe(task_id)}",
        )
        task_id = None
    instance = data.get("instance")
    if instance is not None and (not isinstance(instance, str) or not instance.strip()):
        check.add(("instance",), f"expected a non-empty string, got {_describe(instance)}")
        instance = None

    functions = _check_functions(check, data.get("functions"), base, given)
    raw_functions = data.get("functions")
    declared: Mapping[Any, Any] = raw_functions if isinstance(raw_functions, Mapping) else {}

    calls: list[Any] | None = None
    calls_file: Path | None = None
    has_calls, has_file = "calls" in data, "calls_file" in data
    if has_calls and has_file:
        check.add((), "give either calls (inline) or calls_file (JSON Lines), not both")
    elif not has_calls and not has_file:
        check.add((), "missing: calls (a list of {function, args}) or calls_file (JSON Lines)")
    elif has_calls:
        raw_calls = data["calls"]
        if not isinstance(raw_calls, list):
            check.add(
                ("calls",), f"expected a list of {{function, args}}, got {_describe(raw_calls)}"
            )
        else:
            calls = []
            names = {fid: None for fid in declared if isinstance(fid, str)}
            for i, call in enumerate(raw_calls):
                checked = _check_call(check, call, ("calls", i), names)
                if checked is not None:
                    calls.append(checked)
    else:
        raw_file = data["calls_file"]
        if not isinstance(raw_file, str) or not raw_file.strip():
            check.add(("calls_file",), f"expected a file path, got {_describe(raw_file)}")
        else:
            candidate = Path(os.path.expanduser(raw_file))
            if not candidate.is_absolute():
                candidate = base / candidate
            if not candidate.is_file():
                what = "is not a file" if candidate.exists() else "file not found"
                check.add(("calls_file",), f"{what}: {_display(candidate)}")
            else:
                calls_file = candidate

    policy = _check_policy(check, data.get("policy"))
    audit = data.get("audit")
    if audit is not None and type(audit) is not bool:
        check.add(("audit",), f"expected true or false, got {_describe(audit)}")
        audit = None
    io = _resolve_io(check, data.get("io"), base)
    check.raise_if_any()
    return TaskFile(
        path=given,
        label=label,
        task_id=task_id,
        instance=instance,
        functions=functions,
        calls=calls,
        calls_file=calls_file,
        policy=policy,
        audit=audit,
        io=io,
    )
