"""Reading a task file's document and checking its sections, for :mod:`blockx.cli.taskfile`.

Theory of operation
-------------------
:func:`parse_document` turns a task file's text into data: YAML (PyYAML's
parser, the C one when built) keeps its node tree, so a
problem can name the line of the field it is about; JSON has no line
numbers here. YAML is read by the 1.2 core schema (:mod:`blockx.cli.yaml12`:
``NO`` and ``1:30`` stay strings, ``010`` is 10). A mapping that names a key
twice is refused in both (YAML and JSON would silently keep the last one).

A :class:`Checker` collects the problems of one file — each names the file,
the field path (``calls[3].function``) and, for YAML, the line — and raises
them together as one :class:`SpecError` (at most :data:`MAX_PROBLEMS`, then
"… and N more"). The checks of the sections that need nothing from the task
model live here: :func:`check_policy` (``TaskPolicy`` keyword arguments),
:func:`check_call` (one ``{function, args}``, args a JSON value) and
:func:`resolve_io` (relative paths made absolute, then the worker's own IO
configuration check). :func:`parse_call_line` is one line of a
``calls_file``: a fast path for a well-formed line, the full check (and
problems naming the line) otherwise.

:mod:`blockx.cli.taskfile` is the public import path: it re-exports
:class:`SpecError` and the field tuples, reads the function sources and
builds the ``TaskFile``. Nothing here reads a file.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from blockx.worker.config import MAX_DURATION_MS

__all__ = [
    "CALL_FIELDS",
    "FAILURE_POLICIES",
    "IO_PATH_KNOBS",
    "MAX_ARGS_BYTES",
    "MAX_BUDGET_MS",
    "MAX_PROBLEMS",
    "POLICY_FIELDS",
    "Checker",
    "NoLines",
    "SpecError",
    "args_size_problem",
    "check_call",
    "check_policy",
    "describe",
    "json_line_problem",
    "parse_call_line",
    "parse_document",
    "resolve_io",
]

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
#: ``TaskPolicy.failure``'s values (``blockx.worker.api.FAILURE_POLICIES``; here for the
#: "did you mean" hint without importing the worker at start-up).
FAILURE_POLICIES: Final = ("fast_fail", "continue")
#: IO knobs that are paths: relative ones are taken relative to the task file.
IO_PATH_KNOBS: Final = ((None, "data_dir"), ("blockdb", "sqlite_path"))
#: Problems listed before "... and N more" (per file).
MAX_PROBLEMS: Final = 20
#: The largest time budget a policy may give (ms): 24 h. Larger ones overflow the
#: executors' timers; a task that needs more has no deadline at all.
MAX_BUDGET_MS: Final = MAX_DURATION_MS
#: Room kept in an ``ExecuteCall`` frame for everything but the arguments (ids, digest,
#: budget, trace, audit payload).
ENVELOPE_ALLOWANCE_BYTES: Final = 64 * 1024
#: The largest arguments a call may have, encoded as JSON: the frame limit
#: (``MAX_FRAME_BYTES``, 16 MiB, docs/protocol.md) less the envelope's room. Larger
#: arguments would fail every attempt as ``payload_too_large``: refused before the run.
MAX_ARGS_BYTES: Final = 16 * 1024 * 1024 - ENVELOPE_ALLOWANCE_BYTES


class SpecError(ValueError):
    """A task file (or its calls file) is wrong; each line of the message names one problem."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


def describe(value: Any) -> str:
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
    import difflib  # only for a hint

    close = difflib.get_close_matches(str(word), list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


class _Lines:
    """Line numbers of the fields of a YAML document (from its node tree)."""

    def __init__(self, node: Any) -> None:
        self._node = node

    def line(self, path: tuple[Any, ...]) -> int | None:
        """The line of the field at ``path``, or of its deepest ancestor found."""
        node, _found = self._walk(path)
        return int(node.start_mark.line) + 1 if node is not None else None

    def node(self, path: tuple[Any, ...]) -> Any:
        """The YAML node at ``path`` exactly, or None."""
        node, found = self._walk(path)
        return node if found else None

    def _walk(self, path: tuple[Any, ...]) -> tuple[Any, bool]:
        """The node at ``path`` and True, or the deepest one found on the way and False."""
        import yaml  # type: ignore[import-untyped,unused-ignore]

        node = self._node
        for part in path:
            child = None
            if isinstance(node, yaml.MappingNode):
                for key, value in node.value:
                    if getattr(key, "value", None) == part:
                        child = value
                        break
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
                if 0 <= part < len(node.value):
                    child = node.value[part]
            if child is None:
                return node, False
            node = child
        return node, True


class NoLines:
    """No line numbers (a JSON document)."""

    def line(self, path: tuple[Any, ...]) -> int | None:
        return None

    def node(self, path: tuple[Any, ...]) -> Any:
        return None


def parse_document(text: str, label: str, is_json: bool) -> tuple[Any, Any]:
    """(data, line finder) of a task file's text; SpecError on a parse error."""
    if is_json and text.startswith("\ufeff"):  # YAML allows one; JSON does not
        raise SpecError(
            [
                f"{label}: starts with a byte order mark (BOM, bytes EF BB BF): save it as "
                "UTF-8 without a BOM"
            ]
        )
    if is_json:
        try:
            return json.loads(text, object_pairs_hook=_no_duplicate_keys), NoLines()
        except json.JSONDecodeError as exc:
            raise SpecError(
                [
                    f"{label}: line {exc.lineno}, column {exc.colno}: not valid JSON: "
                    + exc.msg.removesuffix(" starting at")
                ]
            ) from None
        except _DuplicateKey as exc:
            raise SpecError(
                [f"{label}: duplicate key {exc.key!r} (the last one would win)"]
            ) from None
    # yaml12 first: it imports PyYAML without compiling its unused patterns.
    from blockx.cli.yaml12 import (
        Yaml12Loader,  # YAML 1.2's core schema: NO stays a string
        yaml,
    )

    loader = Yaml12Loader(text)
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
    out = dict(pairs)  # one C call; a key given twice makes the dict shorter
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _value in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return out


def _check_duplicate_keys(root: Any, label: str) -> None:
    """A mapping that names a key twice is an error: YAML would keep the last silently."""
    import yaml  # type: ignore[import-untyped,unused-ignore]

    problems: list[str] = []
    stack = [root]
    # Each node once: an alias is the node it names, so a document can hold one node many
    # times (an alias bomb) or inside itself (``&a [*a]``).
    seen_nodes: set[int] = set()
    while stack:
        node = stack.pop()
        if id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
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


class Checker:
    """Collects problems, each naming the file, the field and (YAML) the line."""

    def __init__(self, label: str, lines: Any) -> None:
        self.label = label
        self.lines = lines
        self.problems: list[str] = []
        #: The problems :meth:`add` took, as ``(field path, what)`` pairs: no label, no line
        #: (``blockx serve`` answers them with JSON paths: :mod:`blockx.serve.documents`).
        #: :func:`resolve_io`'s lines are only in ``problems`` (a submitted task has no io).
        self.found: list[tuple[tuple[Any, ...], str]] = []
        self.more = 0

    def add(self, path: tuple[Any, ...], what: str) -> None:
        if len(self.problems) >= MAX_PROBLEMS:
            self.more += 1
            return
        self.found.append((path, what))
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


def args_size_problem(args: Any) -> str | None:
    """Why ``args`` cannot be sent to an executor (too large for one frame, nested too
    deeply for the encoder), or None."""
    from blockx.wire import NotSerializableError, dumps_wire

    try:
        size = len(dumps_wire(args))
    except NotSerializableError as exc:  # nested past 254 (a non-JSON value: _json_problem)
        return f"cannot be sent to an executor: it {exc.problem}"
    except ValueError:  # not JSON: _json_problem says why
        return None
    if size <= MAX_ARGS_BYTES:
        return None
    return (
        f"{size:,} bytes of arguments (as JSON); a call's arguments may be at most "
        f"{MAX_ARGS_BYTES:,} bytes (the 16 MiB frame limit, less its envelope): the call "
        "would fail as payload_too_large"
    )


def check_policy(check: Checker, policy: Any) -> dict[str, Any]:
    """The ``policy`` section as ``TaskPolicy`` keyword arguments (the good fields only).

    The values are checked by :func:`blockx.worker.api.policy_problems`, the check
    ``TaskPolicy`` itself runs; here its lines only get their YAML path and line.
    """
    if policy is None:
        return {}
    if not isinstance(policy, Mapping):
        check.add(("policy",), f"expected a mapping of policy fields, got {describe(policy)}")
        return {}
    check.unknown_fields(policy, ("policy",), POLICY_FIELDS)
    from blockx.worker.api import policy_problems

    given = {name: policy[name] for name in POLICY_FIELDS if name in policy}
    bad: set[str] = set()
    for name, expected in policy_problems(given):
        value = given[name]
        hint = (
            _suggest(value, FAILURE_POLICIES)
            if name == "failure" and isinstance(value, str)
            else ""
        )
        check.add(("policy", name), f"expected {expected}, got {describe(value)}{hint}")
        bad.add(name)
    return {name: value for name, value in given.items() if name not in bad and value is not None}


def check_call(
    check: Checker,
    call: Any,
    path: tuple[Any, ...],
    known: Mapping[str, Any],
    *,
    check_size: bool = False,
) -> tuple[str, Any] | None:
    """One call -> (function id, args), or None with its problems added to ``check``.

    ``known``: the task's function ids (empty: any id is accepted). ``check_size``: also
    measure the encoded arguments (:data:`MAX_ARGS_BYTES`) — the caller knows when they
    may be that large."""
    if not isinstance(call, Mapping):
        check.add(path, f"expected a mapping {{function: ID, args: ...}}, got {describe(call)}")
        return None
    check.unknown_fields(call, path, CALL_FIELDS)
    fid = call.get("function")
    if fid is None:
        check.add((*path, "function"), "missing: the id of one of the task's functions")
        return None
    if not isinstance(fid, str):
        check.add((*path, "function"), f"expected a function id, got {describe(fid)}")
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
    if check_size:
        too_large = args_size_problem(args)
        if too_large is not None:
            check.add((*path, "args"), too_large)
            return None
    return fid, args


_BOM: Final = b"\xef\xbb\xbf"


class _NotJSON(ValueError):
    pass


def _not_a_json_number(name: str) -> Any:
    raise _NotJSON(f"{name} is not a JSON number")


def json_line_problem(line: bytes) -> str:
    """Why one line is not a JSON value, with the column (1-based, in characters) where
    it goes wrong: a byte order mark, bytes that are not UTF-8, or the parser's reason."""
    if line.startswith(_BOM):
        return (
            "starts with a byte order mark (BOM, bytes EF BB BF): save the file as UTF-8 "
            "without a BOM"
        )
    try:
        text = line.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as exc:
        return f"not UTF-8 text (byte {exc.start + 1} of the line)"
    try:
        json.loads(text, parse_constant=_not_a_json_number)
    except _NotJSON as exc:
        return f"not valid JSON: {exc}"
    except json.JSONDecodeError as exc:
        if exc.pos >= len(text.rstrip()) and text.strip():
            return (
                f"not valid JSON: the line ends at column {len(text.rstrip()) + 1} before the "
                f"value does ({exc.msg}: a missing }} or ]?)"
            )
        # json's "Unterminated string starting at" ends with its own "at"
        at = " " if exc.msg.endswith(" at") else " at "
        return f"not valid JSON: {exc.msg}{at}column {exc.pos + 1}"
    except RecursionError:
        return "not valid JSON: nested too deeply"
    return "not valid JSON"  # valid for json, not for the wire (a huge number, NaN)


def parse_call_line(
    line: bytes, lineno: int, label: str, known: Mapping[str, Any]
) -> tuple[str, Any]:
    """One JSONL line -> (function id, args); SpecError naming the line."""
    from blockx.wire import loads_wire

    try:
        call = loads_wire(line)
    except ValueError:
        raise SpecError([f"{label}: line {lineno}: {json_line_problem(line)}"]) from None
    # A line shorter than half the limit cannot hold arguments over it (re-encoding a
    # JSON value never doubles it); a longer one is measured.
    large = len(line) > MAX_ARGS_BYTES // 2
    if (
        not large
        and type(call) is dict
        and type(call.get("function")) is str
        and call["function"] in known
    ):
        if len(call) == 2 and "args" in call:
            return call["function"], call["args"]
        if len(call) == 1:
            return call["function"], []
    check = Checker(f"{label}: line {lineno}", NoLines())
    checked = check_call(check, call, (), known, check_size=large)
    check.raise_if_any()
    assert checked is not None  # no problem added: a call
    return checked


def resolve_io(check: Checker, io: Any, base: Path) -> dict[str, Any]:
    """The ``io`` section, its path knobs made absolute against ``base`` (the task's dir)."""
    if io is None:
        return {}
    if not isinstance(io, Mapping):
        check.add(("io",), f"expected a mapping of IO knobs, got {describe(io)}")
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
