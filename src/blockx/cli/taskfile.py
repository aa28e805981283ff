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
:meth:`TaskFile.scan_calls_file` checks it (and counts its calls),
:meth:`TaskFile.iter_calls_file` yields :class:`Call` objects for the worker's
stream path; both read and decode it a chunk of lines at a time
(:mod:`blockx.cli.calls_file`), a bad line still reported with its number.
``blockx run``'s scan keeps the calls it decoded when the file is no larger than
:data:`~blockx.cli.calls_file.KEEP_CHECKED_BYTES` (4 MiB), and the run streams
those: such a file is read and decoded once.

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

This module owns the task model (:class:`TaskFile`, :class:`FunctionSource`,
:class:`CodeProblem`), the top-level fields, the function sources (read from
disk or inline) and :func:`load_task_file`, which ties the checks together.
Parsing the document (line numbers, duplicate keys), collecting problems and
checking the ``policy``, ``calls`` and ``io`` sections and a calls file's
lines are :mod:`blockx.cli.taskfile_checks`'s; :class:`SpecError` is defined
there and re-exported here, the public import path.
"""

from __future__ import annotations

import os
import re
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Final

# blockx.cli.taskfile stays the import path of the public names now defined in taskfile_checks
# (SpecError, MAX_PROBLEMS and the field tuples): the ``X as X`` form re-exports them.
from blockx.cli.calls_file import (
    KEEP_CHECKED_BYTES,
    CallChunk,
    check_chunk,
    iter_call_chunks,
    iter_chunks,
)
from blockx.cli.taskfile_checks import CALL_FIELDS as CALL_FIELDS
from blockx.cli.taskfile_checks import FAILURE_POLICIES as FAILURE_POLICIES
from blockx.cli.taskfile_checks import IO_PATH_KNOBS as IO_PATH_KNOBS
from blockx.cli.taskfile_checks import MAX_ARGS_BYTES as MAX_ARGS_BYTES
from blockx.cli.taskfile_checks import MAX_PROBLEMS as MAX_PROBLEMS
from blockx.cli.taskfile_checks import POLICY_FIELDS as POLICY_FIELDS
from blockx.cli.taskfile_checks import (
    Checker,
    SpecError,
    check_call,
    check_policy,
    describe,
    parse_document,
    resolve_io,
)

__all__ = [
    "CodeProblem",
    "FunctionSource",
    "SpecError",
    "TaskFile",
    "check_task_fields",
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

#: The fields of one function of ``functions`` (exactly one of them).
FUNCTION_FIELDS: Final = ("path", "source")

#: Task ids: what the worker, the logs and the IO scopes can carry verbatim.
_TASK_ID_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}")
_FUNCTION_ID_RE: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:/@-]{0,199}")
#: The two patterns under public names (``blockx serve``'s OpenAPI document states them).
TASK_ID_RE: Final = _TASK_ID_RE
FUNCTION_ID_RE: Final = _FUNCTION_ID_RE
#: The name the executor compiles a function under (blockx.worker.code.module_filename).
_MODULE_NAME_RE: Final = re.compile(r"<blockx:([^>\n]+)>")

#: Reads a function's ``{path: FILE}``: ``(checker, base dir, function id, the path as
#: given) -> (the file, its source)``, or None with a problem added.
ReadPath = Callable[[Checker, Path, str, str], "tuple[Path, str] | None"]
#: Checks inline calls: ``(checker, the calls (a list), the task's function ids) -> the
#: good calls as (function id, args)``, problems added to the checker.
CheckCalls = Callable[[Checker, list[Any], dict[str, None]], list[Any]]


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


class CheckedCalls:
    """The calls of a calls file a scan decoded and checked, kept for the run that
    follows (``chunks``, one :data:`~blockx.cli.calls_file.CallChunk` per chunk of lines)
    when the file is no larger than :data:`~blockx.cli.calls_file.KEEP_CHECKED_BYTES`;
    None when nothing is kept. Taken once."""

    __slots__ = ("chunks",)

    def __init__(self) -> None:
        self.chunks: deque[CallChunk] | None = None

    def take(self) -> deque[CallChunk] | None:
        chunks, self.chunks = self.chunks, None
        return chunks


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
    #: The calls a :meth:`scan_calls_file` with ``keep`` decoded, until the run takes them.
    checked: CheckedCalls = field(
        init=False, default_factory=CheckedCalls, compare=False, repr=False
    )

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

    def scan_calls_file(self, *, max_problems: int = MAX_PROBLEMS, keep: bool = False) -> int:
        """Check every line of ``calls_file`` (streaming, a chunk of lines at a time:
        :mod:`blockx.cli.calls_file`) and return how many calls it holds.

        With ``keep`` (``blockx run``), a file of at most
        :data:`~blockx.cli.calls_file.KEEP_CHECKED_BYTES` has its decoded calls kept in
        :attr:`checked`: the run's :meth:`iter_call_batches` / :meth:`iter_calls_file`
        stream those, and the file is read once.

        Raises :class:`SpecError` listing the first ``max_problems`` bad lines
        (and how many more there are).
        """
        assert self.calls_file is not None
        label = self.calls_label
        problems: list[str] = []
        more = 0
        count = 0
        known = self.functions
        kept: list[CallChunk] | None = [] if keep else None
        kept_bytes = 0
        try:
            handle = open(self.calls_file, "rb")
        except OSError as exc:
            raise SpecError(
                [f"{label}: cannot read the calls file: {exc.strerror or exc}"]
            ) from None
        with handle:
            for first, chunk in iter_chunks(handle):
                if kept is not None:
                    kept_bytes += len(chunk)
                    if kept_bytes > KEEP_CHECKED_BYTES:
                        kept = None  # too large to hold: the run reads the file again
                good, bad = check_chunk(chunk, first, label, known, problems, max_problems, kept)
                count += good
                more += bad
        if more:
            problems.append(f"{label}: … and {more} more bad line(s)")
        if problems:
            raise SpecError(problems)
        if kept is not None:
            self.checked.chunks = deque(kept)
        return count

    def iter_calls_file(self) -> Iterator[Any]:
        """The calls of ``calls_file`` as :class:`~blockx.worker.api.Call` objects (read and
        decoded a chunk of lines at a time: :mod:`blockx.cli.calls_file`).

        A bad line (the file changed since it was scanned) raises :class:`SpecError`.
        The calls a scan kept (:attr:`checked`) are the file as it was checked.
        """
        from blockx.worker.api import Call

        for calls in self._call_chunks():
            for function_id, args in calls:
                yield Call(function_id, args)

    def iter_call_batches(self) -> Iterator[Any]:
        """The calls of ``calls_file`` as :class:`~blockx.worker.api.CallBatch` items, one
        per chunk of lines: the same calls as :meth:`iter_calls_file`, which the worker
        takes a chunk at a time (``blockx run``'s local path).

        A bad line (the file changed since it was scanned) raises :class:`SpecError`
        once the calls of the lines before it have been yielded. The calls a scan kept
        (:attr:`checked`) are the file as it was checked.
        """
        from blockx.worker.api import CallBatch

        for calls in self._call_chunks():
            yield CallBatch(calls)

    def _call_chunks(self) -> Iterator[CallChunk]:
        """The calls a scan kept, each chunk let go as it is taken; else the file's, read
        and decoded a chunk at a time."""
        kept = self.checked.take()
        if kept is not None:
            while kept:
                yield kept.popleft()
            return
        assert self.calls_file is not None
        with open(self.calls_file, "rb") as handle:
            yield from iter_call_chunks(handle, self.calls_label, self.functions)

    # --- code ------------------------------------------------------------------------------------

    def code_problems(self) -> list[CodeProblem]:
        """Functions that do not compile or have no entry ``def`` (the worker's own check)
        and, with ``audit: true``, those the audit gate refuses (the worker's own auditor:
        their calls would fail as ``audit_rejected``)."""
        from blockx.worker.code import function_code

        problems: list[CodeProblem] = []
        for fid, fn in self.functions.items():
            code = function_code(fid, fn.source)
            error = code.error
            if error is None:
                if self.audit:
                    refused = self._audit_problem(fn, code.digest)
                    if refused is not None:
                        problems.append(refused)
                continue
            if error.lineno:
                file, line = fn.locate(error.lineno)
                where = f"{file}:{line}" + (f":{error.offset}" if error.offset else "")
                text = self.user_locations(error.message)
                # The compiler's "(FILE, line N, column M)": FILE may hold parentheses
                # (an inline source's origin, ``task.json (functions.ID.source)``).
                text = re.sub(r"\s*\((?:[^()]|\([^()]*\))*, line \d+(, column \d+)?\)$", "", text)
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

    def _audit_problem(self, fn: FunctionSource, digest: str) -> CodeProblem | None:
        """The audit gate's verdict on ``fn`` as a problem (None: accepted)."""
        from blockx.worker.audit_gate import AuditGate

        verdict = AuditGate().verdict(fn.function_id, fn.source, digest)
        if verdict.accepted:
            return None
        lines = fn.source.splitlines()
        messages: list[str] = []
        excerpt: list[str] = []
        for violation in verdict.violations:
            file, line = fn.locate(violation.line)
            messages.append(
                f"{file}:{line}:{violation.col}: audit: [{violation.rule}] {violation.message}"
            )
            if 0 < violation.line <= len(lines):
                text = lines[violation.line - 1]
                excerpt.append(text)
                excerpt.append(" " * max(violation.col - 1, 0) + "^")
        if not messages:
            messages.append(f"{fn.origin}: audit: {verdict.error_message()}")
        first, *rest = messages
        message = f"{first} (function {fn.function_id!r} is refused by audit: true)"
        if rest:
            message += "\n" + "\n".join(rest)
        return CodeProblem(fn.function_id, message, "\n".join(excerpt) or None)

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
            "function_paths": False,  # sources already: paths were read when the file loaded
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


def _first_bad_char(value: Any, allowed: str) -> str:
    """``: 'é' (character 3) is not allowed`` for the first character of ``value`` outside
    ``allowed`` (ASCII letters and digits, and those), or ``""``."""
    if not isinstance(value, str):
        return ""
    for i, char in enumerate(value):
        if not (char.isascii() and (char.isalnum() or char in allowed)):
            return f": {char!r} (character {i + 1}) is not allowed"
    return ""


def _display(path: Path) -> str:
    """A path as messages show it: relative to the working directory when inside it."""
    try:
        rel = os.path.relpath(path)
    except ValueError:  # pragma: no cover - another drive (Windows)
        return str(path)
    return str(path) if rel.startswith("..") else rel


def _read_source(check: Checker, base: Path, fid: str, raw: str) -> tuple[Path, str] | None:
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
    check: Checker, functions: Any, base: Path, task_file: Path, read_path: ReadPath
) -> dict[str, FunctionSource]:
    out: dict[str, FunctionSource] = {}
    if functions is None:
        check.add(("functions",), "missing: a task needs at least one function")
        return out
    if not isinstance(functions, Mapping) or not functions:
        check.add(
            ("functions",),
            "expected a mapping {function_id: {path: FILE} or {source: CODE}}, got "
            + ("an empty mapping" if isinstance(functions, Mapping) else describe(functions)),
        )
        return out
    for fid, spec in functions.items():
        if not isinstance(fid, str) or not _FUNCTION_ID_RE.fullmatch(fid):
            check.add(
                ("functions", fid),
                f"{describe(fid)} is not a valid function id (ASCII letters A-Z a-z, digits and "
                f"_ . : / @ -, at most 200){_first_bad_char(fid, '_.:/@-')}",
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
                f"expected {{path: FILE}} or {{source: CODE}}, got {describe(spec)}",
            )
            continue
        check.unknown_fields(spec, ("functions", fid), FUNCTION_FIELDS)
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
                check.add(("functions", fid, "path"), f"expected a file path, got {describe(raw)}")
                continue
            read = read_path(check, base, fid, raw)
            if read is None:
                continue
            path, source = read
            out[fid] = FunctionSource(fid, source, path, _display(path))
        else:
            source = spec["source"]
            if not isinstance(source, str) or not source.strip():
                check.add(
                    ("functions", fid, "source"),
                    f"expected the function's Python code, got {describe(source)}",
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
    data, lines = parse_document(text, label, given.suffix.lower() == ".json")
    check = Checker(label, lines)
    if not isinstance(data, Mapping):
        what = "an empty file" if data is None else describe(data)
        raise SpecError(
            [f"{label}: expected a mapping of task fields (functions, calls, ...), got {what}"]
        )
    # Arguments over the frame limit need a large file (or YAML aliases).
    check_size = len(raw) > MAX_ARGS_BYTES // 2 or b"*" in raw
    task = check_task_fields(
        check, data, base=given.resolve().parent, task_file=given, check_size=check_size
    )
    check.raise_if_any()
    return task


def check_task_fields(
    check: Checker,
    data: Mapping[Any, Any],
    *,
    base: Path,
    task_file: Path,
    check_size: bool,
    top_fields: tuple[str, ...] = TOP_FIELDS,
    read_path: ReadPath | None = None,
    calls_and_io: bool = True,
    check_calls: CheckCalls | None = None,
) -> TaskFile:
    """Check a task document's fields (parsed already: a mapping); the problems go to
    ``check`` (nothing raised: the caller calls ``check.raise_if_any()``) and the good
    parts make the returned :class:`TaskFile`.

    What :func:`load_task_file` runs after parsing, and what ``blockx serve`` runs on a
    submitted task (:mod:`blockx.serve.documents`) with its own rules: ``top_fields``
    (the fields known), ``read_path`` (how a ``{path: FILE}`` is read; default: relative
    to ``base``), ``calls_and_io`` False (the caller checks ``calls_file``, ``io`` and
    whether calls are given; inline ``calls`` are still checked here), ``check_calls``
    (checks the inline calls, a list, instead of :func:`check_call` on each).
    ``check_size``: measure each call's encoded arguments (:data:`MAX_ARGS_BYTES`).
    """
    check.unknown_fields(data, (), top_fields)

    task_id = data.get("task_id")
    if task_id is not None and (not isinstance(task_id, str) or not _TASK_ID_RE.fullmatch(task_id)):
        check.add(
            ("task_id",),
            "expected ASCII letters A-Z a-z, digits and . _ : @ - (at most 128), got "
            f"{describe(task_id)}{_first_bad_char(task_id, '._:@-')}",
        )
        task_id = None
    instance = data.get("instance")
    if instance is not None and (not isinstance(instance, str) or not instance.strip()):
        check.add(("instance",), f"expected a non-empty string, got {describe(instance)}")
        instance = None

    functions = _check_functions(
        check, data.get("functions"), base, task_file, read_path or _read_source
    )
    raw_functions = data.get("functions")
    declared: Mapping[Any, Any] = raw_functions if isinstance(raw_functions, Mapping) else {}

    calls: list[Any] | None = None
    calls_file: Path | None = None
    has_calls, has_file = "calls" in data, "calls_file" in data and calls_and_io
    if has_calls and has_file:
        check.add((), "give either calls (inline) or calls_file (JSON Lines), not both")
    elif not has_calls and not has_file:
        if calls_and_io:
            check.add((), "missing: calls (a list of {function, args}) or calls_file (JSON Lines)")
    elif has_calls:
        raw_calls = data["calls"]
        if not isinstance(raw_calls, list):
            check.add(
                ("calls",), f"expected a list of {{function, args}}, got {describe(raw_calls)}"
            )
        else:
            names = {fid: None for fid in declared if isinstance(fid, str)}
            if check_calls is not None:
                calls = check_calls(check, raw_calls, names)
            else:
                calls = []
                for i, call in enumerate(raw_calls):
                    checked = check_call(check, call, ("calls", i), names, check_size=check_size)
                    if checked is not None:
                        calls.append(checked)
    else:
        raw_file = data["calls_file"]
        if not isinstance(raw_file, str) or not raw_file.strip():
            check.add(("calls_file",), f"expected a file path, got {describe(raw_file)}")
        else:
            candidate = Path(os.path.expanduser(raw_file))
            if not candidate.is_absolute():
                candidate = base / candidate
            if not candidate.is_file():
                what = "is not a file" if candidate.exists() else "file not found"
                check.add(("calls_file",), f"{what}: {_display(candidate)}")
            else:
                calls_file = candidate

    policy = check_policy(check, data.get("policy"))
    audit = data.get("audit")
    if audit is not None and type(audit) is not bool:
        check.add(("audit",), f"expected true or false, got {describe(audit)}")
        audit = None
    io = resolve_io(check, data.get("io"), base) if calls_and_io else {}
    return TaskFile(
        path=task_file,
        label=check.label,
        task_id=task_id,
        instance=instance,
        functions=functions,
        calls=calls,
        calls_file=calls_file,
        policy=policy,
        audit=audit,
        io=io,
    )
