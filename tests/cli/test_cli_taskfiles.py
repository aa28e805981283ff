"""Bad task files: ``blockx run`` exits 2, names the file, the field (or line) and the problem,
and runs nothing (each function here would leave a marker file if it ever ran)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_support import blockx, write

pytestmark = pytest.mark.timeout(60)


def _marker_function(tmp_path: Path) -> str:
    """A function that proves it ran by writing a marker file."""
    marker = tmp_path / "RAN"
    return f"def _(p=None):\n    open({str(marker)!r}, 'a').write('x')\n    return {{'ok': True}}\n"


def _expect_usage_error(tmp_path: Path, task: Path, *needles: str) -> str:
    proc = blockx("run", task, "-n", "1", cwd=tmp_path)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert proc.stdout == ""
    for needle in needles:
        assert needle in proc.stderr, (needle, proc.stderr)
    assert not (tmp_path / "RAN").exists(), "a function ran although the task file is bad"
    assert "calls in" not in proc.stderr  # no summary: nothing ran
    return proc.stderr


def test_missing_functions_and_calls(tmp_path: Path) -> None:
    task = write(tmp_path / "task.yaml", "task_id: nothing\npolicy: {failure: continue}\n")
    err = _expect_usage_error(tmp_path, task)
    assert "task.yaml: functions: missing: a task needs at least one function" in err
    assert "task.yaml: missing: calls (a list of {function, args}) or calls_file" in err


def test_wrong_types_name_the_field_the_value_and_the_line(tmp_path: Path) -> None:
    write(tmp_path / "f.py", _marker_function(tmp_path))
    task = write(
        tmp_path / "task.yaml",
        (
            "functions:\n"
            "  f: {path: f.py}\n"
            "calls:\n"
            "  - {function: f}\n"
            "policy:\n"
            "  max_attempts: three\n"
            "  failure: keep_going\n"
            "  call_budget_ms: 1.5\n"
            "  debug: maybe\n"
            "  deadline_ms: 0\n"
            "audit: 1\n"
            "instance: 7\n"
        ),
    )
    err = _expect_usage_error(
        tmp_path,
        task,
        "task.yaml: policy.max_attempts: expected a positive integer, got 'three' (line 6)",
        "task.yaml: policy.failure: expected fast_fail or continue, got 'keep_going' (line 7)",
        "task.yaml: policy.call_budget_ms: expected an integer from 0 to 86,400,000 (24 h)",
        "task.yaml: policy.debug: expected true or false, got 'maybe' (line 9)",
        "task.yaml: policy.deadline_ms: expected an integer from 1 to 86,400,000 (24 h) (ms, "
        "the whole task's wall-clock limit), got 0 (line 10)",
        "task.yaml: audit: expected true or false, got 1 (line 11)",
        "task.yaml: instance: expected a non-empty string, got 7 (line 12)",
    )
    assert err.count("blockx: error:") == 7  # every problem at once


def test_an_unknown_function_in_a_call(tmp_path: Path) -> None:
    write(tmp_path / "adder.py", _marker_function(tmp_path))
    write(tmp_path / "pricer.py", _marker_function(tmp_path))
    task = write(
        tmp_path / "task.yaml",
        (
            "functions:\n"
            "  adder: {path: adder.py}\n"
            "  pricer: {path: pricer.py}\n"
            "calls:\n"
            "  - {function: adder, args: {x: 1}}\n"
            "  - {function: pricer, args: {x: 1}}\n"
            "  - {function: adder, args: {x: 2}}\n"
            "  - {function: addr, args: {x: 3}}\n"
        ),
    )
    _expect_usage_error(
        tmp_path,
        task,
        "task.yaml: calls[3].function: 'addr' is not a function of this task "
        "(functions: adder, pricer) (did you mean 'adder'?) (line 8)",
    )


def test_unknown_fields_are_errors_with_a_suggestion(tmp_path: Path) -> None:
    write(tmp_path / "f.py", _marker_function(tmp_path))
    task = write(
        tmp_path / "task.yaml",
        (
            "functions: {f: {path: f.py}}\n"
            "calls: [{function: f, arg: 1}]\n"
            "polcy: {failure: continue}\n"
        ),
    )
    _expect_usage_error(
        tmp_path,
        task,
        "task.yaml: polcy: unknown field (did you mean 'policy'?)",
        "task.yaml: calls[0].arg: unknown field (did you mean 'args'?)",
    )


def test_bad_yaml_names_the_line(tmp_path: Path) -> None:
    task = write(
        tmp_path / "task.yaml",
        ("functions:\n  f: {path: f.py}\ncalls:\n  - function: f\n    args: {x: 1\npolicy: {}\n"),
    )
    err = _expect_usage_error(tmp_path, task, "task.yaml: line ", "not valid YAML")
    assert "line 5, column" in err or "line 6, column" in err


def test_bad_json_task_file_names_the_line(tmp_path: Path) -> None:
    task = write(
        tmp_path / "task.json", '{\n  "functions": {"f": {"path": "f.py"}},\n  "calls": [,]\n}\n'
    )
    _expect_usage_error(tmp_path, task, "task.json: line 3, column 13: not valid JSON")


def test_a_missing_function_file(tmp_path: Path) -> None:
    write(tmp_path / "here.py", _marker_function(tmp_path))
    task = write(
        tmp_path / "task.yaml",
        (
            "functions:\n"
            "  here: {path: here.py}\n"
            "  gone: {path: functions/gone.py}\n"
            "calls: [{function: here}, {function: gone}]\n"
        ),
    )
    _expect_usage_error(
        tmp_path, task, "task.yaml: functions.gone.path: file not found: functions/gone.py (line 3)"
    )


def test_a_bad_line_in_the_calls_file(tmp_path: Path) -> None:
    write(tmp_path / "f.py", _marker_function(tmp_path))
    lines = [f'{{"function": "f", "args": {{"i": {i}}}}}' for i in range(40)]
    lines[16] = '{"function": "f", "args": {"i": 16}'  # line 17: not JSON
    lines[25] = '{"function": "g", "args": {}}'  # line 26: unknown function
    lines[30] = '["f", 1]'  # line 31: not an object
    write(tmp_path / "calls.jsonl", "\n".join(lines) + "\n")
    task = write(tmp_path / "task.yaml", "functions: {f: {path: f.py}}\ncalls_file: calls.jsonl\n")
    _expect_usage_error(
        tmp_path,
        task,
        "calls.jsonl: line 17: not valid JSON",
        "calls.jsonl: line 26: function: 'g' is not a function of this task (functions: f)",
        "calls.jsonl: line 31: expected a mapping {function: ID, args: ...}, got a list",
    )


def test_a_missing_calls_file_and_a_non_json_args_value(tmp_path: Path) -> None:
    write(tmp_path / "f.py", _marker_function(tmp_path))
    task = write(tmp_path / "task.yaml", "functions: {f: {path: f.py}}\ncalls_file: nope.jsonl\n")
    _expect_usage_error(tmp_path, task, "task.yaml: calls_file: file not found: nope.jsonl")
    task = write(
        tmp_path / "task2.yaml",
        (
            "functions: {f: {path: f.py}}\ncalls:\n  - {function: f, args: {day: !!timestamp 2024-06-01}}\n"
        ),
    )
    _expect_usage_error(
        tmp_path, task, "task2.yaml: calls[0].args.day: a date is not a JSON value (quote it"
    )


def test_bad_io_section_and_bad_set(tmp_path: Path) -> None:
    write(tmp_path / "f.py", _marker_function(tmp_path))
    task = write(
        tmp_path / "task.yaml",
        ("functions: {f: {path: f.py}}\ncalls: [{function: f}]\nio:\n  blockdb: {engine: mysql}\n"),
    )
    _expect_usage_error(
        tmp_path,
        task,
        "task.yaml: io.blockdb.engine='mysql': expected one of auto, sqlite, postgres",
    )
    good = write(tmp_path / "good.yaml", "functions: {f: {path: f.py}}\ncalls: [{function: f}]\n")
    proc = blockx("run", good, "--set", "pool.executor_cont=2", cwd=tmp_path)
    assert proc.returncode == 2
    assert "unknown knob 'pool.executor_cont' (did you mean pool.executor_count?)" in proc.stderr
    proc = blockx("run", good, "--set", "CALL_DEADLINE_MS=soon", cwd=tmp_path)
    assert proc.returncode == 2
    assert "dispatcher.call_deadline_ms='soon': expected a non-negative integer" in proc.stderr
    assert not (tmp_path / "RAN").exists()


def test_a_task_file_that_does_not_exist(tmp_path: Path) -> None:
    proc = blockx("run", tmp_path / "missing.yaml")
    assert proc.returncode == 2
    assert "missing.yaml: no such task file" in proc.stderr


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    assert blockx().returncode == 2
    proc = blockx("run")
    assert proc.returncode == 2 and "the following arguments are required: TASK" in proc.stderr
    proc = blockx("run", "x.yaml", "--executors", "0")
    assert proc.returncode == 2 and "expected a positive integer" in proc.stderr


def test_an_output_file_in_a_missing_directory(tmp_path: Path) -> None:
    write(tmp_path / "f.py", _marker_function(tmp_path))
    task = write(tmp_path / "task.yaml", "functions: {f: {path: f.py}}\ncalls: [{function: f}]\n")
    proc = blockx("run", task, "-o", tmp_path / "no" / "such" / "rows.jsonl", cwd=tmp_path)
    assert proc.returncode == 2
    assert "-o " in proc.stderr and "no such directory" in proc.stderr
    assert not (tmp_path / "RAN").exists()


def test_a_key_given_twice_is_an_error_not_a_silent_overwrite(tmp_path: Path) -> None:
    write(tmp_path / "f.py", _marker_function(tmp_path))
    task = write(
        tmp_path / "task.yaml",
        (
            "functions:\n"
            "  f: {path: f.py}\n"
            "calls:\n"
            "  - {function: f, args: {x: 1, x: 2}}\n"
            "policy: {failure: continue}\n"
            "policy: {max_attempts: 1}\n"
        ),
    )
    _expect_usage_error(
        tmp_path,
        task,
        "task.yaml: line 4: duplicate key 'x' (first at line 4",
        "task.yaml: line 6: duplicate key 'policy' (first at line 5; the last one would win)",
    )
    as_json = write(
        tmp_path / "task.json",
        '{"functions": {"f": {"path": "f.py"}}, "calls": [], "calls": [{"function": "f"}]}',
    )
    _expect_usage_error(tmp_path, as_json, "task.json: duplicate key 'calls'")
