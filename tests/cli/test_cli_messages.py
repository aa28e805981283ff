"""The messages of ``blockx run`` and ``blockx validate`` (issue 16, item 8): sub-call errors
with their chain once, JSON errors at the real column, byte order marks, a value that
contains itself, non-ASCII ids, ``debug: true`` output in the report, the docs' names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from cli_support import REPO, blockx, write

pytestmark = pytest.mark.timeout(120)

SUBCALLS = """\
functions:
  a: {source: "def _(x):\\n    return function.call('b', x)\\n"}
  b: {source: "def _(x):\\n    return function.call('a', x)\\n"}
  d: {source: "def _(n):\\n    if n == 0:\\n        raise ValueError('bottom')\\n    return function.call('d', n - 1)\\n"}
calls: [{function: a, args: [1]}, {function: d, args: [3]}]
policy: {failure: continue, max_attempts: 1}
"""


def test_a_sub_call_error_carries_each_prefix_once_and_the_chain(tmp_path: Path) -> None:
    task = write(tmp_path / "task.yaml", SUBCALLS)
    proc = blockx("run", task, "-n", "1", "--errors", "errors.jsonl", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    err = proc.stderr
    cycle = [ln for ln in err.splitlines() if "SubcallCycleDetectedError" in ln]
    assert len(cycle) == 1, err
    assert cycle[0].strip().startswith("blockx.executor.errors.SubcallCycleDetectedError: ")
    assert "a → b → a → b: subcall_cycle_detected: sub-call of 'b'" in cycle[0]
    assert cycle[0].count("subcall_cycle_detected") == 1
    assert cycle[0].count("SubcallCycleDetectedError") == 1
    deep = [ln for ln in err.splitlines() if "SubcallFailedError" in ln]
    assert len(deep) == 1, err
    assert deep[0].strip() == (
        "blockx.executor.errors.SubcallFailedError: d → d → d → d: user_error: ValueError: bottom"
    )
    errors = (tmp_path / "errors.jsonl").read_text()
    assert "d → d → d → d: user_error: ValueError: bottom" in errors


def _validate_calls(tmp_path: Path, data: bytes) -> str:
    (tmp_path / "calls.jsonl").write_bytes(data)
    task = write(
        tmp_path / "task.yaml",
        "functions:\n  f: {source: \"def _(x):\\n    return {'x': x}\\n\"}\n"
        "calls_file: calls.jsonl\n",
    )
    proc = blockx("validate", task, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout
    run = blockx("run", task, "-n", "1", cwd=tmp_path)
    assert run.returncode == 2 and run.stderr == proc.stderr
    return proc.stderr


def test_a_byte_order_mark_is_named(tmp_path: Path) -> None:
    err = _validate_calls(tmp_path, b'\xef\xbb\xbf{"function":"f","args":[1]}\n')
    assert "calls.jsonl: line 1: starts with a byte order mark (BOM, bytes EF BB BF)" in err
    task = tmp_path / "bom.json"
    task.write_bytes(b'\xef\xbb\xbf{"functions": {"f": {"source": "def _(): pass"}}, "calls": []}')
    proc = blockx("validate", task, cwd=tmp_path)
    assert proc.returncode == 2
    assert "bom.json: starts with a byte order mark" in proc.stderr
    yaml_task = tmp_path / "bom.yaml"  # YAML allows a BOM: still valid
    yaml_task.write_bytes(b"\xef\xbb\xbf" + (tmp_path / "task.yaml").read_bytes())
    (tmp_path / "calls.jsonl").write_bytes(b'{"function":"f","args":[1]}\n')
    assert blockx("validate", yaml_task, cwd=tmp_path).returncode == 0


def test_a_json_error_names_its_real_column(tmp_path: Path) -> None:
    line = b'{"function":"f","args":[1, 2, 3, 4, 5, 6, 7, 8]'  # the closing brace is missing
    err = _validate_calls(
        tmp_path,
        b'{"function":"f","args":[1]}\n' + line + b'\n{"function":"f","args":[1],}\n',
    )
    assert f"calls.jsonl: line 2: not valid JSON: the line ends at column {len(line) + 1}" in err
    assert "a missing } or ]?" in err
    assert (
        "line 3: not valid JSON: Expecting property name enclosed in double quotes at column 28"
        in err
    )
    assert "column 1" not in err


def test_an_unterminated_string_reads_once_at(tmp_path: Path) -> None:
    err = _validate_calls(tmp_path, b'{"function":"f","args":["abc]}\n')
    assert "Unterminated string starting at column 25" in err
    assert "at at" not in err
    task = write(tmp_path / "t.json", '{"functions": {"f": {"source": "x}}')
    proc = blockx("validate", task, cwd=tmp_path)
    assert "at at" not in proc.stderr and "Unterminated string" in proc.stderr


def test_nan_in_a_calls_file_says_why(tmp_path: Path) -> None:
    err = _validate_calls(tmp_path, b'{"function":"f","args":[NaN]}\n')
    assert "line 1: not valid JSON: NaN is not a JSON number" in err


SELF_REFERENCE = """\
functions:
  f: {source: "def _(x):\\n    d = {}\\n    d['d'] = d\\n    return d\\n"}
calls: [{function: f, args: [1]}]
"""


def test_an_output_that_contains_itself_is_said_once(tmp_path: Path) -> None:
    task = write(tmp_path / "task.yaml", SELF_REFERENCE)
    proc = blockx("run", task, "-n", "1", "--errors", "e.jsonl", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "output_not_serializable" in proc.stderr
    assert "$['d']×255 (a value that contains itself?)" in proc.stderr
    assert "['d']['d']['d']['d']" not in proc.stderr
    assert max(len(line) for line in proc.stderr.splitlines()) < 300
    assert "['d']['d']['d']['d']" not in (tmp_path / "e.jsonl").read_text()


def test_a_non_ascii_id_is_refused_saying_ascii_and_which_character(tmp_path: Path) -> None:
    task = write(
        tmp_path / "task.yaml",
        'task_id: tâche\nfunctions:\n  prix_€: {source: "def _(x):\\n    return x\\n"}\ncalls: []\n',
    )
    proc = blockx("validate", task, cwd=tmp_path)
    assert proc.returncode == 2
    assert "task_id: expected ASCII letters" in proc.stderr
    assert "'â' (character 2) is not allowed" in proc.stderr
    assert "is not a valid function id (ASCII letters" in proc.stderr
    assert "'€' (character 6) is not allowed" in proc.stderr


DEBUG = """\
functions:
  f: {source: "def _(x):\\n    print('hello from', x)\\n    if x:\\n        raise ValueError('boom')\\n    return {'x': x}\\n"}
calls: [{function: f, args: [0]}, {function: f, args: [1]}]
policy: {debug: true, max_attempts: 1, failure: continue}
"""


def test_debug_output_of_a_failed_call_is_in_the_failure_report(tmp_path: Path) -> None:
    task = write(tmp_path / "task.yaml", DEBUG)
    proc = blockx("run", task, "-n", "1", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    report = proc.stderr[proc.stderr.index("FAILED:") :]
    assert "1) call #1: f(1) — user_error after 1 attempt" in report
    assert "   output of the call (policy.debug):\n   | hello from 1\n" in report


def test_the_docs_name_the_exceptions_where_they_live_and_every_error_kind() -> None:
    from blockx.executor.errors import RemoteIOError
    from blockx.wire import keys

    assert RemoteIOError.__module__ == "blockx.executor.errors"
    docs = "".join((REPO / "docs" / name).read_text() for name in ("sdk.md", "cli.md", "io.md"))
    assert "sdk_bridge.RemoteIOError" not in docs
    sdk = (REPO / "docs" / "sdk.md").read_text()
    kinds = {getattr(keys, name) for name in dir(keys) if name.startswith("ERR_")}
    kinds.add("outbox_full")
    table = sdk[sdk.index("### Every error kind") :]
    missing = {kind for kind in kinds if not re.search(rf"`{kind}`", table)}
    assert not missing, missing
    limits = sdk[sdk.index("### Limits") :]
    assert "16 MiB" in limits and "payload_too_large" in limits
