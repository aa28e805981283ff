"""A task submitted to ``blockx serve``: parsed, checked, every problem with its JSON path and
the message ``blockx validate`` gives (src/blockx/serve/documents.py, docs/taskspec.md)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blockx.cli.taskfile import SpecError, load_task_file
from blockx.cli.taskfile_checks import MAX_PROBLEMS, Checker, NoLines, parse_call_line
from blockx.serve.documents import (
    CheckedTask,
    DocumentError,
    UnsupportedMediaType,
    check_call_lines,
    check_task_document,
    json_path,
    parse_task_body,
    task_from_spec,
)
from blockx.worker.api import Call, Task, TaskPolicy

ADDER = "def _(p):\n    return {'y': p['x'] + 1}\n"
BROKEN = "def _(p):\n    return (p['x']\n"
YAML_CT = "application/yaml"
JSON_CT = "application/json"


def submit(doc: Any, content_type: str = JSON_CT, **options: Any) -> CheckedTask:
    body = doc if isinstance(doc, bytes) else (doc.encode() if isinstance(doc, str) else None)
    if body is None:
        body = json.dumps(doc).encode()
    return check_task_document(parse_task_body(body, content_type), **options)


def problems(doc: Any, content_type: str = JSON_CT, **options: Any) -> list[tuple[str, str]]:
    with pytest.raises(DocumentError) as caught:
        submit(doc, content_type, **options)
    assert caught.value.problems, "a DocumentError lists its problems"
    return caught.value.problems


def task(**fields: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "functions": {"adder": {"source": ADDER}},
        "calls": [{"function": "adder", "args": {"x": 1}}],
    }
    doc.update(fields)
    return {key: value for key, value in doc.items() if value is not None}


# --- a good task -------------------------------------------------------------------------------


def test_a_json_task_becomes_a_spec_and_normalised_calls() -> None:
    checked = submit(
        task(
            task_id="prices-1",
            instance="tenant-a",
            calls=[{"function": "adder", "args": {"x": 1}}, {"function": "adder"}],
            policy={"max_attempts": 2, "failure": "continue"},
        )
    )
    assert not checked.streamed
    assert checked.calls_count == 2
    assert checked.calls_lines == (
        b'{"function":"adder","args":{"x":1}}\n{"function":"adder","args":[]}\n'
    )
    assert orjson.loads(checked.spec_json) == {
        "task_id": "prices-1",
        "instance": "tenant-a",
        "functions": {"adder": ADDER},
        "policy": {"max_attempts": 2, "failure": "continue"},
        "audit": None,
    }
    assert checked.task_file.calls == [("adder", {"x": 1}), ("adder", [])]
    assert checked.task_id == "prices-1"
    assert "prices-1" in repr(checked) and "2 inline" in repr(checked)


def test_yaml_and_json_bodies_give_the_same_task() -> None:
    yaml_body = (
        "task_id: prices-1\n"
        "functions:\n"
        "  adder:\n"
        "    source: |\n"
        "      def _(p):\n"
        "          return {'y': p['x'] + 1}\n"
        "calls:\n"
        "  - {function: adder, args: {x: 1}}\n"
        "policy: {max_attempts: 2}\n"
    )
    json_doc = task(task_id="prices-1", policy={"max_attempts": 2})
    for content_type in ("application/yaml", "application/x-yaml", "text/yaml"):
        from_yaml = submit(yaml_body, content_type)
        from_json = submit(json_doc)
        assert from_yaml.spec_json == from_json.spec_json
        assert from_yaml.calls_lines == from_json.calls_lines


def test_a_content_type_with_parameters_and_any_case() -> None:
    assert submit(json.dumps(task()), "Application/JSON; charset=UTF-8").calls_count == 1


def test_a_task_without_task_id_is_given_one() -> None:
    checked = submit(task())
    task_id = orjson.loads(checked.spec_json)["task_id"]
    assert re.fullmatch(r"task-[0-9a-f]{12}", task_id)
    assert checked.task_file.task_id == task_id


def test_integers_of_any_size_are_kept_exact() -> None:
    big = 2**200 + 1
    body = b'{"functions": {"adder": {"source": "def _(x):\\n    return x\\n"}}, '
    body += b'"calls": [{"function": "adder", "args": ' + str(big).encode() + b"}]}"
    checked = submit(body)
    assert checked.calls_lines == b'{"function":"adder","args":' + str(big).encode() + b"}\n"


def test_inline_calls_encode_as_the_wire_does_on_every_path() -> None:
    """Plain calls take one orjson encode, the others (a null, a big integer, a missing
    args) the full check: the lines are the wire's either way, in call order."""
    from blockx.wire import dumps_wire

    args_list: list[Any] = [
        {"x": 1},
        None,
        [1, None, "é"],
        2**70,
        {"b": 2, "a": [True, False, 1.5]},
        "text",
        [],
    ]
    calls: list[dict[str, Any]] = [{"function": "adder", "args": a} for a in args_list]
    calls.append({"function": "adder"})
    checked = submit(task(calls=calls))
    expected = [dumps_wire({"function": "adder", "args": a}) + b"\n" for a in args_list]
    expected.append(b'{"function":"adder","args":[]}\n')
    assert checked.calls_lines == b"".join(expected)
    assert checked.calls_count == len(calls)
    assert checked.task_file.calls == [("adder", a) for a in args_list] + [("adder", [])]


def test_a_streamed_task_has_no_calls_yet() -> None:
    checked = submit(task(calls=None, calls_stream=True))
    assert checked.streamed
    assert checked.calls_lines is None and checked.calls_count == 0
    assert checked.task_file.calls is None
    assert "streamed" in repr(checked)


def test_an_empty_call_list_is_a_task_with_no_calls() -> None:
    checked = submit(task(calls=[]))
    assert (checked.calls_lines, checked.calls_count) == (b"", 0)


def test_task_from_spec_rebuilds_the_workers_task() -> None:
    checked = submit(
        task(task_id="t1", instance="a", policy={"max_attempts": 4, "deadline_ms": 1000})
    )
    calls = [Call("adder", {"x": 1})]
    rebuilt = task_from_spec(checked.spec_json, calls)
    assert isinstance(rebuilt, Task)
    assert rebuilt.task_id == "t1" and rebuilt.instance == "a"
    assert rebuilt.functions == {"adder": ADDER}
    assert rebuilt.calls is calls
    assert rebuilt.policy == TaskPolicy(max_attempts=4, deadline_ms=1000)
    assert rebuilt.audit is False
    audited = submit(task(audit=True))
    assert task_from_spec(audited.spec_json, []).audit is True


# --- the body ----------------------------------------------------------------------------------


def test_another_content_type_is_unsupported() -> None:
    for content_type in ("text/plain", "application/x-ndjson", "", "multipart/form-data"):
        with pytest.raises(UnsupportedMediaType, match="application/json"):
            parse_task_body(b"{}", content_type)


def test_bytes_that_are_not_utf8() -> None:
    assert problems(b'{"task_id": "\xff"}') == [("$", "not UTF-8 text (byte 13)")]
    assert problems(b"{}", "application/json; charset=latin-1") == [
        ("$", "charset 'latin-1' is not supported: send UTF-8")
    ]


def test_malformed_json_names_line_and_column() -> None:
    assert problems('{\n  "functions": {},\n  "calls": [,]\n}') == [
        ("$", "line 3, column 13: not valid JSON: Expecting value")
    ]


def test_malformed_yaml_names_line_and_column() -> None:
    [(path, message)] = problems("functions:\n  f: {source: x}\ncalls: [1,\n", YAML_CT)
    assert path == "$"
    assert re.match(r"line \d+, column \d+: not valid YAML: ", message), message


def test_a_key_written_twice_is_refused() -> None:
    assert problems('{"calls": [], "calls": []}') == [
        ("$", "duplicate key 'calls' (the last one would win)")
    ]
    assert problems("calls: []\ncalls: []\n", YAML_CT) == [
        ("$", "line 2: duplicate key 'calls' (first at line 1; the last one would win)")
    ]


@pytest.mark.parametrize(
    ("body", "content_type", "what"),
    [
        ("[1, 2]", JSON_CT, "a list"),
        ('"task"', JSON_CT, "'task'"),
        ("null", JSON_CT, "an empty document"),
        ("", YAML_CT, "an empty document"),
        ("- 1\n", YAML_CT, "a list"),
    ],
)
def test_a_document_that_is_not_a_mapping(body: str, content_type: str, what: str) -> None:
    assert problems(body, content_type) == [
        ("$", f"expected a mapping of task fields (functions, calls, ...), got {what}")
    ]


def test_yaml_no_stays_a_string() -> None:
    """Task YAML is read by the 1.2 core schema (docs/taskspec.md): ``NO`` is the string NO,
    ``false`` the boolean."""
    body = f"functions: {{adder: {{source: {json.dumps(ADDER)}}}}}\ncalls: []\n"
    assert submit(body + "instance: NO\n", YAML_CT).task_file.instance == "NO"
    assert problems(body + "audit: NO\n", YAML_CT) == [
        ("$.audit", "expected true or false, got 'NO'")
    ]
    assert orjson.loads(submit(body + "audit: false\n", YAML_CT).spec_json)["audit"] is False


def test_deeply_nested_documents_are_refused_not_crashed() -> None:
    depth = 100_000
    assert problems('{"calls": ' + "[" * depth + "]" * depth + "}") == [
        ("$", "not valid JSON: nested too deeply")
    ]
    [(path, message)] = problems("calls: " + "[" * depth + "]" * depth + "\n", YAML_CT)
    assert path == "$" and "nesting depth" in message


def test_arguments_nested_past_what_an_executor_takes() -> None:
    args: Any = 1
    for _ in range(300):
        args = [args]
    assert problems(task(calls=[{"function": "adder", "args": args}])) == [
        ("$.calls[0].args", "cannot be sent to an executor: it is nested more than 254 levels deep")
    ]


def test_a_yaml_alias_bomb_is_refused() -> None:
    lines = ["a0: &a0 [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]"]
    for level in range(1, 8):
        ref = f"*a{level - 1}"
        lines.append(f"a{level}: &a{level} [{', '.join([ref] * 10)}]")
    assert problems("\n".join(lines) + "\n", YAML_CT) == [
        ("$", "YAML aliases repeat more than 1,000,000 values: write the values out (or send JSON)")
    ]


def test_a_yaml_value_that_contains_itself_is_refused() -> None:
    assert problems("calls: &c [*c]\n", YAML_CT) == [
        ("$", "a YAML alias refers to the value that contains it (a loop JSON cannot hold)")
    ]


def test_a_few_yaml_aliases_are_fine() -> None:
    body = (
        f"functions: {{adder: {{source: {json.dumps(ADDER)}}}}}\n"
        "calls:\n  - {function: adder, args: &one {x: 1}}\n  - {function: adder, args: *one}\n"
    )
    assert submit(body, YAML_CT).calls_count == 2


def test_a_huge_document_is_checked() -> None:
    calls = [{"function": "adder", "args": {"x": i}} for i in range(100_000)]
    assert submit(task(calls=calls)).calls_count == 100_000


# --- the submitted-task rules --------------------------------------------------------------------


def test_calls_and_calls_stream_together() -> None:
    assert problems(task(calls_stream=True)) == [
        ("$", "give either calls (inline) or calls_stream: true (calls sent later), not both")
    ]


def test_neither_calls_nor_calls_stream() -> None:
    assert problems(task(calls=None)) == [
        (
            "$",
            "missing: calls (a list of {function, args}) or calls_stream: true (calls sent later)",
        )
    ]


def test_calls_stream_false_without_calls() -> None:
    assert problems(task(calls=None, calls_stream=False)) == [
        (
            "$.calls_stream",
            "false and no calls: give calls (a list of {function, args}) or calls_stream: true "
            "(calls sent later)",
        )
    ]
    assert submit(task(calls_stream=False)).calls_count == 1


def test_calls_stream_must_be_a_boolean() -> None:
    assert ("$.calls_stream", "expected true or false, got 'yes'") in problems(
        task(calls=None, calls_stream="yes")
    )


def test_calls_file_is_refused() -> None:
    assert problems(task(calls=None, calls_file="calls.jsonl")) == [
        (
            "$.calls_file",
            "a submitted task cannot read the server's files: send calls inline or use "
            "calls_stream",
        ),
        (
            "$",
            "missing: calls (a list of {function, args}) or calls_stream: true (calls sent later)",
        ),
    ]


def test_io_is_refused() -> None:
    assert problems(task(io={"data_dir": "/tmp/x"})) == [
        (
            "$.io",
            "the server's IO configuration applies to every task; set it with blockx serve "
            "--config",
        )
    ]


def test_an_unknown_field_suggests_the_submitted_fields() -> None:
    [(path, message)] = problems(task(calls=None, calls_strem=True, calls_stream=True))
    assert path == "$.calls_strem"
    assert message == (
        "unknown field (did you mean 'calls_stream'?); expected one of: task_id, instance, "
        "functions, calls, calls_stream, policy, audit"
    )


def test_max_calls() -> None:
    calls = [{"function": "adder", "args": i} for i in range(3)]
    assert problems(task(calls=calls), max_calls=2) == [
        (
            "$.calls",
            "3 calls; this server takes at most 2 inline: send more with calls_stream: true",
        )
    ]
    assert submit(task(calls=calls), max_calls=3).calls_count == 3


def test_a_function_path_is_refused_without_a_functions_root() -> None:
    assert problems(task(functions={"adder": {"path": "adder.py"}}, calls=[])) == [
        (
            "$.functions.adder.path",
            "a submitted task cannot read the server's files: send the function's code as "
            "source (or start the server with --functions-root)",
        )
    ]


def test_a_function_path_inside_the_functions_root(tmp_path: Path) -> None:
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "adder.py").write_text(ADDER)
    checked = submit(task(functions={"adder": {"path": "lib/adder.py"}}), functions_root=tmp_path)
    assert orjson.loads(checked.spec_json)["functions"] == {"adder": ADDER}


def test_a_function_path_escaping_the_functions_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "secret.py").write_text(ADDER)
    (root / "link.py").symlink_to(tmp_path / "secret.py")
    (root / "dirlink").symlink_to(tmp_path)
    functions = {
        "up": {"path": "../secret.py"},
        "absolute": {"path": str(tmp_path / "secret.py")},
        "link": {"path": "link.py"},
        "through_dir": {"path": "dirlink/secret.py"},
        "missing_outside": {"path": "../nothing.py"},
    }
    found = problems(task(functions=functions, calls=[]), functions_root=root)
    assert found == [
        ("$.functions.up.path", "../secret.py escapes the functions root"),
        ("$.functions.absolute.path", f"{tmp_path / 'secret.py'} escapes the functions root"),
        ("$.functions.link.path", "link.py escapes the functions root"),
        ("$.functions.through_dir.path", "dirlink/secret.py escapes the functions root"),
        ("$.functions.missing_outside.path", "../nothing.py escapes the functions root"),
    ]


def test_a_function_path_missing_or_a_directory(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    functions = {"gone": {"path": "gone.py"}, "dir": {"path": "pkg"}}
    assert problems(task(functions=functions, calls=[]), functions_root=tmp_path) == [
        ("$.functions.gone.path", "file not found: gone.py"),
        ("$.functions.dir.path", "pkg is a directory, not a .py file"),
    ]


def test_a_function_path_that_is_not_a_regular_file(tmp_path: Path) -> None:
    import os

    os.mkfifo(tmp_path / "pipe.py")
    assert problems(
        task(functions={"f": {"path": "pipe.py"}}, calls=[]), functions_root=tmp_path
    ) == [("$.functions.f.path", "pipe.py is not a regular file")]


def test_a_function_path_with_a_nul_byte(tmp_path: Path) -> None:
    assert problems(
        task(functions={"f": {"path": "a\x00b.py"}}, calls=[]), functions_root=tmp_path
    ) == [("$.functions.f.path", "expected a file path, got 'a\\x00b.py'")]


def test_a_server_that_requires_audit() -> None:
    assert problems(task(audit=False), require_audit=True) == [
        ("$.audit", "this server requires audit: true")
    ]
    for audit in (None, True):
        checked = submit(task(audit=audit), require_audit=True)
        assert orjson.loads(checked.spec_json)["audit"] is True
        assert checked.task_file.audit is True
    assert orjson.loads(submit(task(audit=False)).spec_json)["audit"] is False


def test_a_function_the_audit_gate_refuses_is_a_problem_when_audited() -> None:
    sneaky = "import os\ndef _(p):\n    return os.getcwd()\n"
    doc = task(functions={"sneaky": {"source": sneaky}}, calls=[])
    assert submit(doc).calls_count == 0  # not audited: accepted
    [(path, message)] = problems(doc, require_audit=True)
    assert path == "$.functions.sneaky.source"
    assert "audit" in message and "(function 'sneaky' is refused by audit: true)" in message


def test_a_syntax_error_names_the_function_the_file_and_the_line() -> None:
    doc = task(functions={"adder": {"source": ADDER}, "broken": {"source": BROKEN}}, calls=[])
    assert problems(doc) == [
        (
            "$.functions.broken.source",
            "task (functions.broken.source):2:12: SyntaxError: '(' was never closed "
            "(function 'broken')",
        )
    ]


def test_a_syntax_error_in_a_function_file(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text(BROKEN)
    doc = task(functions={"bad": {"path": "bad.py"}}, calls=[])
    assert problems(doc, functions_root=tmp_path) == [
        ("$.functions.bad.path", "bad.py:2:12: SyntaxError: '(' was never closed (function 'bad')")
    ]


@pytest.mark.parametrize(
    ("task_id", "message"),
    [
        (
            "has space",
            "expected ASCII letters A-Z a-z, digits and . _ : @ - (at most 128), got "
            "'has space': ' ' (character 4) is not allowed",
        ),
        (7, "expected ASCII letters A-Z a-z, digits and . _ : @ - (at most 128), got 7"),
        ("x" * 129, None),
    ],
)
def test_task_id_rules(task_id: Any, message: str | None) -> None:
    [(path, found)] = problems(task(task_id=task_id))
    assert path == "$.task_id"
    if message is not None:
        assert found == message


def test_every_problem_is_reported_with_its_path() -> None:
    doc = {
        "task_id": "bad id",
        "instance": "",
        "functions": {"adder": {"source": ADDER}, "b/c": {"source": BROKEN}, "x y": "f.py"},
        "calls": [
            {"function": "adder", "args": 1},
            {"function": "addr"},
            {"args": 1},
            {"function": "adder", "args": {"f": float("nan")}},
            "adder",
        ],
        "policy": {"max_attempts": "three", "failure": "contine", "retries": 2},
        "audit": "yes",
    }
    found = problems(json.dumps(doc, allow_nan=True))
    paths = [path for path, _ in found]
    assert paths == [
        "$.task_id",
        "$.instance",
        "$.functions['x y']",
        "$.calls[1].function",
        "$.calls[2].function",
        "$.calls[3].args.f",
        "$.calls[4]",
        "$.policy.retries",
        "$.policy.max_attempts",
        "$.policy.failure",
        "$.audit",
        "$.functions['b/c'].source",
    ]
    assert ("$.policy.max_attempts", "expected a positive integer, got 'three'") in found
    assert ("$.calls[3].args.f", "nan is not a JSON number") in found


def test_too_many_problems_are_counted() -> None:
    calls = [{"function": "nope"} for _ in range(30)]
    found = problems(task(calls=calls))
    assert len(found) == MAX_PROBLEMS + 1
    assert found[-1] == ("$", "… and 10 more problem(s)")


def test_json_path_quotes_what_is_not_a_name() -> None:
    assert json_path(()) == "$"
    assert json_path(("calls", 3, "function")) == "$.calls[3].function"
    assert json_path(("functions", "pricing/eth", "source")) == "$.functions['pricing/eth'].source"
    assert json_path(("calls", 0, "args", "rows[2]", "x")) == "$.calls[0].args.rows[2].x"
    assert json_path(("a'b",)) == "$['a\\'b']"
    assert json_path((False,)) == "$[false]"


# --- the same messages as blockx validate --------------------------------------------------------


def _validate_messages(path: Path) -> list[str]:
    """``blockx validate``'s problems of a task file, its label and line stripped."""
    with pytest.raises(SpecError) as caught:
        load_task_file(path)
    label = f"{path}: "
    out = []
    for problem in caught.value.problems:
        assert problem.startswith(label), problem
        out.append(re.sub(r" \(line \d+\)$", "", problem.removeprefix(label)))
    return out


def _as_validate(found: list[tuple[str, str]]) -> list[str]:
    """A submitted task's problems written as a task file's (``field: what``)."""
    out = []
    for path, message in found:
        field = path.removeprefix("$").removeprefix(".")
        out.append(f"{field}: {message}" if field else message)
    return out


@pytest.mark.parametrize(
    "doc",
    [
        task(policy={"max_attempts": "three"}),
        task(policy={"failure": "contine", "call_budget_ms": -1, "debug": 1}),
        task(calls=[{"function": "addr", "args": 1}, {"function": "adder", "args": [], "x": 1}]),
        task(task_id="naïve", instance=3, policy={"retries": 1}),
        task(functions={}),
        task(functions={"adder": {"source": ADDER, "path": "x.py"}, "b": "b.py", "c": {}}),
        task(calls={"function": "adder"}),
        task(audit="true"),
    ],
)
def test_messages_equal_blockx_validate(tmp_path: Path, doc: dict[str, Any]) -> None:
    for name, text in (
        ("task.json", json.dumps(doc)),
        ("task.yaml", json.dumps(doc, indent=2)),  # JSON is YAML: lines this time
    ):
        file = tmp_path / name
        file.write_text(text)
        assert _as_validate(problems(text)) == _validate_messages(file)


def test_arguments_nested_too_deeply_read_as_in_blockx_validate(tmp_path: Path) -> None:
    """A task file measured for size (it holds a ``*``) used to crash blockx validate here."""
    args: Any = 1
    for _ in range(300):
        args = [args]
    doc = task(calls=[{"function": "adder", "args": args}], instance="*")
    (tmp_path / "task.json").write_text(json.dumps(doc))
    found = problems(doc)
    assert found == [
        ("$.calls[0].args", "cannot be sent to an executor: it is nested more than 254 levels deep")
    ]
    assert _as_validate(found) == _validate_messages(tmp_path / "task.json")


def test_a_yaml_date_is_a_string(tmp_path: Path) -> None:
    """YAML 1.2's core schema has no dates: an unquoted ``2024-06-01`` is the string."""
    text = (
        f"functions: {{adder: {{source: {json.dumps(ADDER)}}}}}\n"
        "calls:\n  - {function: adder, args: {day: 2024-06-01}}\n"
    )
    (tmp_path / "task.yaml").write_text(text)
    assert submit(text, YAML_CT).task_file.calls == [("adder", {"day": "2024-06-01"})]
    assert load_task_file(tmp_path / "task.yaml").calls == [("adder", {"day": "2024-06-01"})]


def test_a_syntax_error_reads_as_in_blockx_validate(tmp_path: Path) -> None:
    doc = task(functions={"broken": {"source": BROKEN}}, calls=[])
    (tmp_path / "task.json").write_text(json.dumps(doc))
    [problem] = load_task_file(tmp_path / "task.json").code_problems()
    [(_, message)] = problems(doc)
    assert message == problem.message.replace(str(tmp_path / "task.json"), "task")


def test_the_checker_keeps_pairs_and_its_text() -> None:
    check = Checker("task.yaml", NoLines())
    check.add(("policy", "max_attempts"), "expected a positive integer, got 0")
    check.add((), "missing: calls")
    assert check.problems == [
        "task.yaml: policy.max_attempts: expected a positive integer, got 0",
        "task.yaml: missing: calls",
    ]
    assert check.found == [
        (("policy", "max_attempts"), "expected a positive integer, got 0"),
        ((), "missing: calls"),
    ]


# --- calls sent to a streamed task ---------------------------------------------------------------


def test_call_lines_are_normalised() -> None:
    body = b'{"function": "adder", "args": {"x": 1}}\n\n  \n{"function":"adder"}'
    assert check_call_lines(body, ["adder"]) == (
        b'{"function":"adder","args":{"x":1}}\n{"function":"adder","args":[]}\n',
        2,
    )
    assert check_call_lines(b"", ["adder"]) == (b"", 0)
    assert check_call_lines(b"\n\n", ["adder"]) == (b"", 0)


def test_call_lines_fast_and_slow_paths_agree() -> None:
    fast = b"".join(b'{"function":"adder","args":%d}\n' % i for i in range(1000))
    slow = b"\n" + fast  # a blank line: the line-by-line path
    assert check_call_lines(fast, ["adder"]) == check_call_lines(slow, ["adder"])
    assert check_call_lines(fast, ["adder"])[1] == 1000


def test_bad_call_lines_name_the_line_and_nothing_is_taken() -> None:
    body = (
        b'{"function": "adder", "args": 1}\n'
        b'{"function": "addr", "args": 1}\n'
        b"\n"
        b'{"function": "adder", "args": 1, "x": 2}\n'
        b'{"function": "adder", "args": {"a": 1\n'
        b"not json\n"
        b'\xef\xbb\xbf{"function": "adder"}\n'
    )
    with pytest.raises(DocumentError) as caught:
        check_call_lines(body, ["adder"], first_line=11)
    found = caught.value.problems
    assert [path for path, _ in found] == ["line 12", "line 14", "line 15", "line 16", "line 17"]
    # The very messages a calls_file's lines get (blockx validate: "FILE: line N: ...").
    for (path, message), (lineno, line) in zip(
        found,
        [
            (12, body.split(b"\n")[1]),
            (14, body.split(b"\n")[3]),
            (15, body.split(b"\n")[4]),
            (16, body.split(b"\n")[5]),
            (17, body.split(b"\n")[6]),
        ],
        strict=True,
    ):
        with pytest.raises(SpecError) as expected:
            parse_call_line(line + b"\n", lineno, "calls.jsonl", {"adder": None})
        assert f"calls.jsonl: {path}: {message}" == expected.value.problems[0]
    assert found[0] == (
        "line 12",
        "function: 'addr' is not a function of this task (functions: adder) (did you mean "
        "'adder'?)",
    )


def test_many_bad_call_lines_are_counted() -> None:
    body = b"x\n" * (MAX_PROBLEMS + 5)
    with pytest.raises(DocumentError) as caught:
        check_call_lines(body, ["adder"])
    assert len(caught.value.problems) == MAX_PROBLEMS + 1
    assert caught.value.problems[-1] == ("$", "… and 5 more bad line(s)")


def test_call_lines_keep_big_integers_exact() -> None:
    big = str(2**100).encode()
    assert check_call_lines(b'{"function":"f","args":' + big + b"}", ["f"]) == (
        b'{"function":"f","args":' + big + b"}\n",
        1,
    )


def test_call_lines_nested_too_deeply() -> None:
    line = b'{"function":"f","args":' + b"[" * 300 + b"]" * 300 + b"}\n"
    with pytest.raises(DocumentError) as caught:
        check_call_lines(line, ["f"])
    assert caught.value.problems == [
        ("line 1", "args: cannot be sent to an executor: it is nested more than 254 levels deep")
    ]
    deeper = b'{"function":"f","args":' + b"[" * 100_000 + b"]" * 100_000 + b"}\n"
    with pytest.raises(DocumentError) as caught:
        check_call_lines(deeper, ["f"])
    [(path, message)] = caught.value.problems
    assert path == "line 1" and message.startswith("not valid JSON")


# --- any data: a CheckedTask or a DocumentError, nothing else -------------------------------------

_KEYS = st.sampled_from(
    ["task_id", "instance", "functions", "calls", "calls_stream", "calls_file", "io", "policy",
     "audit", "function", "args", "source", "path", "adder", "max_attempts", "failure", "x"]
)  # fmt: skip
_SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(_KEYS | st.text(max_size=5), inner, max_size=5)
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_KEYS, _VALUES, max_size=8) | _VALUES)
def test_any_data_gives_a_task_or_problems(data: Any) -> None:
    try:
        checked = check_task_document(data)
    except DocumentError as exc:
        assert exc.problems
        for path, message in exc.problems:
            assert path.startswith(("$", "line ")) and message
        return
    assert checked.streamed or checked.calls_lines is not None


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_give_data_or_problems(body: bytes) -> None:
    for content_type in ("application/json", "application/yaml"):
        try:
            parse_task_body(body, content_type)
        except DocumentError as exc:
            assert exc.problems
    try:
        check_call_lines(body, ["adder"])
    except DocumentError as exc:
        assert exc.problems
