"""Submitted tasks: a task body sent to ``blockx serve``, checked like a task file.

Theory of operation
-------------------
``POST /v1/tasks`` carries a task in the task-file schema (docs/taskspec.md) as
JSON or YAML. :func:`parse_task_body` turns the body into data with the task
file's own parser (:func:`blockx.cli.taskfile_checks.parse_document`: line and
column of a syntax error, a key written twice refused) and
:func:`check_task_document` checks it with the task file's own field checks
(:func:`blockx.cli.taskfile.check_task_fields`), so every problem has the very
message ``blockx validate`` gives for the same mistake. Problems are
``(path, message)`` pairs, the path a JSON path: ``$`` for the document,
``$.policy.max_attempts``, ``$.calls[3].function``, ``$.functions['a.b'].source``.
A :class:`DocumentError` carries every problem found (at most
:data:`~blockx.cli.taskfile_checks.MAX_PROBLEMS`, then "… and N more"), never
only the first.

On top of the task-file rules a submitted task:

* gives ``calls`` (inline) or ``calls_stream: true`` (the calls are
  ``POST``-ed later; :func:`check_call_lines` checks each body of them);
* may not name ``calls_file`` or ``io`` (the server's files and IO
  configuration are the operator's, not the client's);
* gives its functions as ``source``; a ``path`` is read only when the server
  has a functions root, resolved (symlinks too) and kept inside it;
* may not turn ``audit`` off on a server that requires it (then the spec's
  ``audit`` is always true, and a function the audit gate refuses is a problem,
  as in ``blockx validate``);
* has its functions compiled: a syntax error is a problem naming the function,
  the file and the line (:meth:`~blockx.cli.taskfile.TaskFile.code_problems`; an
  inline source's "file" is ``task (functions.ID.source)`` and the line is the
  source's own).

The messages name the document ``task`` where a file's would name the task
file (:data:`LABEL`). No line numbers: JSON has none, and a path says where.

What the server keeps: :class:`CheckedTask`'s ``spec_json`` (everything but
the calls, to rebuild the :class:`~blockx.worker.api.Task` with
:func:`task_from_spec`) and ``calls_lines``, the calls as normalised JSON Lines
(one ``{"function", "args"}`` per line, encoded as the wire encodes: big
integers exact).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import orjson

from blockx.cli.calls_file import parse_chunk_fast, parse_lines
from blockx.cli.taskfile import FunctionSource, ReadPath, TaskFile, check_task_fields
from blockx.cli.taskfile_checks import (
    MAX_ARGS_BYTES,
    MAX_PROBLEMS,
    Checker,
    NoLines,
    SpecError,
    args_size_problem,
    check_call,
    describe,
    json_line_problem,
    parse_document,
)
from blockx.wire import NotSerializableError, dumps_wire, loads_wire

if TYPE_CHECKING:
    from blockx.worker.api import Task

__all__ = [
    "CALLS_CONTENT_TYPES",
    "LABEL",
    "TASK_CONTENT_TYPES",
    "CheckedTask",
    "DocumentError",
    "Problem",
    "UnsupportedMediaType",
    "check_call_lines",
    "check_task_document",
    "json_path",
    "media_type",
    "parse_task_body",
    "task_from_spec",
]

#: How messages name a submitted task (where a task file's would name the file).
LABEL: Final = "task"
#: Media types of a task body (``POST /v1/tasks``); the first is JSON, the others YAML.
TASK_CONTENT_TYPES: Final = (
    "application/json",
    "application/yaml",
    "application/x-yaml",
    "text/yaml",
)
#: Media types of a body of calls (``POST /v1/tasks/{id}/calls``): JSON Lines.
CALLS_CONTENT_TYPES: Final = ("application/x-ndjson", "application/jsonl", "text/plain")
#: The top-level fields a submitted task may name. ``calls_file`` and ``io`` (task-file
#: fields) are refused with their reason, not as unknown fields.
SUBMITTED_FIELDS: Final = (
    "task_id",
    "instance",
    "functions",
    "calls",
    "calls_stream",
    "policy",
    "audit",
)
_REFUSED_FIELDS: Final = ("calls_file", "io")
#: What YAML aliases may add to a document (values beyond its own): a few aliases
#: are fine, an "aliases of aliases" bomb is not.
MAX_ALIAS_EXPANSION: Final = 1_000_000

_CALLS_FILE_REFUSED: Final = (
    "a submitted task cannot read the server's files: send calls inline or use calls_stream"
)
_IO_REFUSED: Final = (
    "the server's IO configuration applies to every task; set it with blockx serve --config"
)
_PATH_REFUSED: Final = (
    "a submitted task cannot read the server's files: send the function's code as source "
    "(or start the server with --functions-root)"
)
#: orjson options that leave every non-JSON type to the (absent) default: it raises.
_PLAIN_JSON: Final = (
    orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_SUBCLASS
)
_NAME_RE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: A sub-path of a call's arguments as the checks write it (``x[0]``, ``rows[2][1]``).
_NAME_INDEX_RE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\[\d+\])+")

#: ``(JSON path, message)``: one problem of a submitted document.
Problem = tuple[str, str]


class DocumentError(ValueError):
    """A submitted task (or a body of calls) is wrong: ``problems`` lists every problem."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(f"{path}: {message}" for path, message in self.problems))


class UnsupportedMediaType(ValueError):
    """The body's ``Content-Type`` is none of those accepted (the server answers 415)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckedTask:
    """A submitted task that passed every check: what the server stores and runs."""

    #: The checked task (``calls``: the inline calls, None for a streamed task).
    task_file: TaskFile
    #: ``calls_stream: true``: the calls arrive later (:func:`check_call_lines`).
    streamed: bool
    #: JSON of ``{"task_id", "instance", "functions": {id: source}, "policy", "audit"}``.
    spec_json: bytes
    #: The inline calls as JSON Lines (one ``{"function", "args"}`` per line), or None.
    calls_lines: bytes | None
    calls_count: int

    @property
    def task_id(self) -> str:
        task_id = self.task_file.task_id
        assert task_id is not None  # check_task_document always names the task
        return task_id

    def __repr__(self) -> str:
        calls = "streamed" if self.streamed else f"{self.calls_count} inline"
        return (
            f"CheckedTask(task_id={self.task_file.task_id!r}, "
            f"instance={self.task_file.instance!r}, functions={list(self.task_file.functions)}, "
            f"calls={calls}, spec={len(self.spec_json)} bytes)"
        )


# --- paths -----------------------------------------------------------------------------------


def json_path(path: tuple[Any, ...]) -> str:
    """A checker's field path as a JSON path: ``("calls", 3, "function")`` ->
    ``$.calls[3].function``; a key that is not a plain name is quoted (``$.functions['a.b']``)."""
    out = "$"
    for part in path:
        if isinstance(part, int) and not isinstance(part, bool):
            out += f"[{part}]"
        elif isinstance(part, str):
            if _NAME_RE.fullmatch(part) or _NAME_INDEX_RE.fullmatch(part):
                out += "." + part
            else:
                out += "['" + part.replace("\\", "\\\\").replace("'", "\\'") + "']"
        else:  # a YAML key that is not a string (``NO:``, ``1:``)
            out += f"[{describe(part)}]"
    return out


def _problems(check: Checker) -> list[Problem]:
    out = [(json_path(path), what) for path, what in check.found]
    if check.more:
        out.append(("$", f"… and {check.more} more problem(s)"))
    return out


def _strip_label(problem: str) -> str:
    return problem.removeprefix(f"{LABEL}: ")


# --- the body --------------------------------------------------------------------------------


def media_type(content_type: str) -> tuple[str, dict[str, str]]:
    """``("application/json", {"charset": "utf-8"})`` of a ``Content-Type`` header."""
    kind, *params = content_type.split(";")
    parsed: dict[str, str] = {}
    for param in params:
        name, _, value = param.partition("=")
        parsed[name.strip().lower()] = value.strip().strip('"').lower()
    return kind.strip().lower(), parsed


def _decode(body: bytes, content_type: str, accepted: tuple[str, ...]) -> tuple[str, str]:
    """(media type, text) of a body; UnsupportedMediaType, or DocumentError for bad bytes."""
    kind, params = media_type(content_type)
    if kind not in accepted:
        raise UnsupportedMediaType(
            f"Content-Type {kind or '(none)'!r} is not accepted here; send one of: "
            + ", ".join(accepted)
        )
    charset = params.get("charset")
    if charset is not None and charset not in ("utf-8", "utf8"):
        raise DocumentError([("$", f"charset {charset!r} is not supported: send UTF-8")])
    try:
        return kind, body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DocumentError([("$", f"not UTF-8 text (byte {exc.start})")]) from None


def parse_task_body(body: bytes, content_type: str) -> Any:
    """The data of a task body: JSON (``application/json``) or YAML (``application/yaml``,
    ``application/x-yaml``, ``text/yaml``).

    Raises :class:`UnsupportedMediaType` for another content type, :class:`DocumentError`
    for bytes that are not UTF-8, a syntax error (with line and column), a key written
    twice, a document nested too deeply or a YAML alias bomb. The data is not checked
    (:func:`check_task_document` does that; it need not even be a mapping).
    """
    kind, text = _decode(body, content_type, TASK_CONTENT_TYPES)
    is_json = kind == "application/json"
    try:
        data, _lines = parse_document(text, LABEL, is_json)
    except SpecError as exc:
        raise DocumentError([("$", _strip_label(p)) for p in exc.problems]) from None
    except RecursionError:
        what = "JSON" if is_json else "YAML"
        raise DocumentError([("$", f"not valid {what}: nested too deeply")]) from None
    if not is_json:
        problem = _alias_problem(data)
        if problem is not None:
            raise DocumentError([("$", problem)])
    return data


def _alias_problem(data: Any) -> str | None:
    """Why ``data`` (from YAML) is too costly to check: a value that contains itself, or
    aliases that repeat more than :data:`MAX_ALIAS_EXPANSION` values. JSON cannot share
    values; YAML aliases can, and a check walks each use."""
    sizes: dict[int, int] = {}  # id of a container -> values it holds, aliases expanded
    distinct = 0
    stack: list[tuple[Any, bool]] = [(data, False)]
    open_: set[int] = set()
    while stack:
        value, done = stack.pop()
        if not isinstance(value, (dict, list)):
            continue
        key = id(value)
        children = list(value.values()) if isinstance(value, dict) else value
        if done:
            open_.discard(key)
            total = 1
            for child in children:
                total += sizes.get(id(child), 1) if isinstance(child, (dict, list)) else 1
            sizes[key] = total
            if total - distinct > MAX_ALIAS_EXPANSION:
                return (
                    f"YAML aliases repeat more than {MAX_ALIAS_EXPANSION:,} values: write the "
                    "values out (or send JSON)"
                )
            continue
        if key in open_:
            return "a YAML alias refers to the value that contains it (a loop JSON cannot hold)"
        if key in sizes:
            continue
        distinct += len(children) + 1
        open_.add(key)
        stack.append((value, True))
        stack.extend((child, False) for child in children)
    return None


# --- the task --------------------------------------------------------------------------------


def _path_reader(functions_root: Path | None) -> ReadPath:
    """How a function's ``{path: FILE}`` is read: refused, or inside ``functions_root``."""
    root = functions_root.resolve(strict=True) if functions_root is not None else None

    def read(check: Checker, base: Path, fid: str, raw: str) -> tuple[Path, str] | None:
        where = ("functions", fid, "path")
        if root is None:
            check.add(where, _PATH_REFUSED)
            return None
        # Messages show the path as given: the server's own directories are not the client's.
        shown = raw
        if "\x00" in raw:
            check.add(where, f"expected a file path, got {describe(raw)}")
            return None
        candidate = root / raw
        try:
            path = candidate.resolve(strict=True)
        except FileNotFoundError:
            if not candidate.resolve(strict=False).is_relative_to(root):
                check.add(where, f"{shown} escapes the functions root")
            else:
                check.add(where, f"file not found: {shown}")
            return None
        except (OSError, RuntimeError) as exc:  # a symlink loop, no permission
            check.add(where, f"cannot read {shown}: {getattr(exc, 'strerror', None) or exc}")
            return None
        if not path.is_relative_to(root):
            check.add(where, f"{shown} escapes the functions root")
            return None
        if path.is_dir():
            check.add(where, f"{shown} is a directory, not a .py file")
            return None
        if not path.is_file():  # a FIFO or a device would block or never end
            check.add(where, f"{shown} is not a regular file")
            return None
        try:
            data = path.read_bytes()
        except OSError as exc:
            check.add(where, f"cannot read {shown}: {exc.strerror or exc}")
            return None
        try:
            # The path as given names the file in messages (the root is the server's).
            return Path(raw), data.decode("utf-8")
        except UnicodeDecodeError as exc:
            check.add(where, f"{shown} is not UTF-8 text (byte {exc.start}: {exc.reason})")
            return None

    return read


def check_task_document(
    data: Any,
    *,
    functions_root: Path | None = None,
    require_audit: bool = False,
    max_calls: int | None = None,
) -> CheckedTask:
    """Check a submitted task's data (from :func:`parse_task_body`) by the task-file rules
    and the submitted-task rules (the module docstring).

    ``functions_root``: where ``{path: FILE}`` functions may be read (None: a path is
    refused). ``require_audit``: ``audit: false`` is refused and the task is audited.
    ``max_calls``: the most inline calls taken (None: no limit).
    Raises :class:`DocumentError` with every problem; nothing else for any data.
    """
    if not isinstance(data, Mapping):
        what = "an empty document" if data is None else describe(data)
        raise DocumentError(
            [("$", f"expected a mapping of task fields (functions, calls, ...), got {what}")]
        )
    try:
        return _check_task(data, functions_root, require_audit, max_calls)
    except RecursionError:
        raise DocumentError([("$", "nested too deeply to check")]) from None


def _check_task(
    data: Mapping[Any, Any],
    functions_root: Path | None,
    require_audit: bool,
    max_calls: int | None,
) -> CheckedTask:
    check = Checker(LABEL, NoLines())
    if "calls_file" in data:
        check.add(("calls_file",), _CALLS_FILE_REFUSED)
    if "io" in data:
        check.add(("io",), _IO_REFUSED)
    streamed = _check_calls_source(check, data, max_calls)
    lines: list[bytes] = []  # the inline calls, encoded as they are checked
    if require_audit and data.get("audit") is False:
        check.add(("audit",), "this server requires audit: true")
    task = check_task_fields(
        check,
        {key: value for key, value in data.items() if key not in _REFUSED_FIELDS},
        base=functions_root or Path(LABEL),
        task_file=Path(LABEL),
        check_size=False,  # _encode_call measures each call's arguments as it encodes them
        top_fields=SUBMITTED_FIELDS,
        read_path=_path_reader(functions_root),
        calls_and_io=False,
        check_calls=lambda check, raw, names: _check_inline_calls(check, raw, names, lines),
    )
    audit = True if require_audit else task.audit
    task = replace(
        task,
        task_id=task.task_id or f"task-{uuid.uuid4().hex[:12]}",
        audit=audit,
        calls=None if streamed else task.calls,
    )
    for problem in task.code_problems():
        fn = task.functions[problem.function_id]
        check.add(("functions", fn.function_id, _origin_field(fn)), problem.message)
    calls_lines = None if streamed else b"".join(lines)
    if check.found or check.more:
        raise DocumentError(_problems(check))
    spec = {
        "task_id": task.task_id,
        "instance": task.instance,
        "functions": {fid: fn.source for fid, fn in task.functions.items()},
        "policy": task.policy,
        "audit": audit,
    }
    return CheckedTask(
        task_file=task,
        streamed=streamed,
        spec_json=orjson.dumps(spec),
        calls_lines=calls_lines,
        calls_count=0 if streamed else len(lines),
    )


def _origin_field(fn: FunctionSource) -> str:
    return "source" if fn.path is None else "path"


def _check_calls_source(check: Checker, data: Mapping[Any, Any], max_calls: int | None) -> bool:
    """``calls`` or ``calls_stream: true`` (exactly one); whether the task is streamed."""
    stream = data.get("calls_stream")
    if "calls_stream" in data and type(stream) is not bool:
        check.add(("calls_stream",), f"expected true or false, got {describe(stream)}")
        stream = None
    has_calls = "calls" in data
    if stream is True and has_calls:
        check.add(
            (), "give either calls (inline) or calls_stream: true (calls sent later), not both"
        )
    elif not has_calls:
        if stream is False:
            check.add(
                ("calls_stream",),
                "false and no calls: give calls (a list of {function, args}) or "
                "calls_stream: true (calls sent later)",
            )
        elif stream is None:
            check.add(
                (),
                "missing: calls (a list of {function, args}) or calls_stream: true "
                "(calls sent later)",
            )
    raw_calls = data.get("calls")
    if max_calls is not None and isinstance(raw_calls, list) and len(raw_calls) > max_calls:
        check.add(
            ("calls",),
            f"{len(raw_calls):,} calls; this server takes at most {max_calls:,} inline: send "
            "more with calls_stream: true",
        )
    return stream is True


def _encode_call(function_id: str, args: Any) -> bytes | str:
    """One call as a JSON line (newline included), or why it cannot be sent."""
    try:
        line = dumps_wire({"function": function_id, "args": args})
    except NotSerializableError as exc:
        return f"cannot be sent to an executor: it {exc.problem}"
    except ValueError as exc:
        return f"cannot be sent to an executor: {exc}"
    if len(line) > MAX_ARGS_BYTES:
        too_large = args_size_problem(args)
        if too_large is not None:
            return too_large
    return line + b"\n"


def _check_inline_calls(
    check: Checker, raw_calls: list[Any], names: dict[str, None], lines: list[bytes]
) -> list[tuple[str, Any]]:
    """The good inline calls (each also encoded into ``lines``); problems go to ``check``
    with the task file's messages (:func:`check_call`)."""
    calls: list[tuple[str, Any]] = []
    for i, call in enumerate(raw_calls):
        fast = _plain_call_line(call, names)
        if fast is not None:
            calls.append(fast[0])
            lines.append(fast[1])
            continue
        checked = check_call(check, call, ("calls", i), names)
        if checked is None:
            continue
        line = _encode_call(*checked)
        if isinstance(line, str):
            check.add(("calls", i, "args"), line)
            continue
        calls.append(checked)
        lines.append(line)
    return calls


def _plain_call_line(call: Any, names: Mapping[str, None]) -> tuple[tuple[str, Any], bytes] | None:
    """A well-formed call with plain JSON arguments, and its line; None: check it fully.

    The fast path of a long call list (as :func:`parse_call_line`'s): one orjson encode
    instead of a walk of the arguments. orjson refuses here (no ``default``) what the full
    check refuses or must look at -- a date (passed through, not written), bytes, a set, a
    non-string key, an integer past 64 bits, nesting past 254 -- and writes NaN and
    infinities as ``null``: a line holding a ``null`` takes the full check too.
    """
    if type(call) is not dict:
        return None
    function_id = call.get("function")
    if type(function_id) is not str or function_id not in names:
        return None
    if len(call) == 2 and "args" in call:
        args = call["args"]
    elif len(call) == 1:
        args = []
    else:
        return None
    try:
        line = orjson.dumps({"function": function_id, "args": args}, option=_PLAIN_JSON)
    except TypeError:
        return None
    if b"null" in line or len(line) > MAX_ARGS_BYTES:
        return None
    return (function_id, args), line + b"\n"


# --- calls sent to a streamed task -----------------------------------------------------------


def check_call_lines(
    body: bytes, functions: Collection[str], first_line: int = 1
) -> tuple[bytes, int]:
    """A body of JSON Lines calls for a streamed task -> (the calls as normalised JSON
    Lines, how many). Blank lines are skipped.

    ``functions``: the task's function ids. ``first_line``: the number of the body's first
    line (for messages). Raises :class:`DocumentError` with a ``line N`` path per bad line
    (the first :data:`MAX_PROBLEMS`, then a count), each message the one a ``calls_file``'s
    line gets from ``blockx validate`` after its ``FILE: line N:``; then no call of the body
    is taken.
    """
    known = dict.fromkeys(functions)
    if body and not body.endswith(b"\n"):
        body += b"\n"
    calls = parse_chunk_fast(body, known) if body else []
    numbered: list[tuple[int, str, Any]] = []
    problems: list[Problem] = []
    more = 0
    if calls is not None:
        numbered = [(first_line + i, fid, args) for i, (fid, args) in enumerate(calls)]
    else:
        for lineno, line in parse_lines(body, first_line):
            checked = _check_line(line, known)
            if isinstance(checked, list):
                for message in checked:
                    if len(problems) < MAX_PROBLEMS:
                        problems.append((f"line {lineno}", message))
                    else:
                        more += 1
                continue
            numbered.append((lineno, *checked))
    lines: list[bytes] = []
    for lineno, fid, args in numbered:
        encoded = _encode_call(fid, args)
        if isinstance(encoded, str):
            if len(problems) < MAX_PROBLEMS:
                problems.append((f"line {lineno}", f"args: {encoded}"))
            else:
                more += 1
            continue
        lines.append(encoded)
    if problems:
        problems.sort(key=lambda p: int(p[0].removeprefix("line ")))
        if more:
            problems.append(("$", f"… and {more} more bad line(s)"))
        raise DocumentError(problems)
    return b"".join(lines), len(lines)


def _check_line(line: bytes, known: Mapping[str, Any]) -> tuple[str, Any] | list[str]:
    """One line -> (function id, args), or its problems' messages (a ``calls_file``'s)."""
    try:
        call = loads_wire(line)
    except ValueError:
        return [json_line_problem(line)]
    check = Checker("", NoLines())
    try:
        checked = check_call(check, call, (), known, check_size=len(line) > MAX_ARGS_BYTES // 2)
    except RecursionError:
        return ["not valid JSON: nested too deeply"]
    if checked is not None and not check.found:
        return checked
    messages: list[str] = []
    for path, what in check.found:
        name = ".".join(str(part) for part in path)
        messages.append(f"{name}: {what}" if name else what)
    return messages


# --- the Worker's task -----------------------------------------------------------------------


def task_from_spec(spec_json: bytes, calls: Any) -> Task:
    """The :class:`~blockx.worker.api.Task` of a stored ``spec_json``, running ``calls``
    (a list of :class:`~blockx.worker.api.Call`, or any (async) iterable of them)."""
    from blockx.worker.api import Task, TaskPolicy

    spec = orjson.loads(spec_json)
    return Task(
        functions=dict(spec["functions"]),
        calls=calls,
        task_id=spec["task_id"],
        instance=spec.get("instance"),
        policy=TaskPolicy(**spec.get("policy") or {}),
        audit=bool(spec.get("audit")),
        function_paths=False,  # a client's strings are source, never a file of this server
    )
