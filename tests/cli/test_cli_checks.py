"""``blockx validate`` and ``blockx run`` make the same checks (issue 16): arguments over the
frame limit, functions ``audit: true`` refuses, time budgets within 24 h."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_support import blockx, without_stalls, write

#: The documented limit (docs/sdk.md): 16 MiB less 64 KiB for the call's envelope.
MAX_ARGS_BYTES = 16 * 1024 * 1024 - 64 * 1024

pytestmark = pytest.mark.timeout(120)

LEN_SOURCE = "def _(x):\n    return {'n': len(str(x))}\n"


def _big_args_task(tmp_path: Path, *, inline: bool) -> Path:
    big = "x" * (MAX_ARGS_BYTES + 1)
    small = {"function": "f", "args": [1]}
    large = {"function": "f", "args": big}  # a string: its JSON is 2 bytes longer
    functions = {"f": {"source": LEN_SOURCE}}
    if inline:
        return write(
            tmp_path / "task.json", json.dumps({"functions": functions, "calls": [small, large]})
        )
    write(tmp_path / "calls.jsonl", json.dumps(small) + "\n" + json.dumps(large) + "\n")
    return write(
        tmp_path / "task.json", json.dumps({"functions": functions, "calls_file": "calls.jsonl"})
    )


@pytest.mark.parametrize("inline", [True, False], ids=["inline", "calls_file"])
@pytest.mark.parametrize("command", ["validate", "run"])
def test_arguments_over_the_frame_limit_are_refused_by_validate_and_run_alike(
    tmp_path: Path, inline: bool, command: str
) -> None:
    task = _big_args_task(tmp_path, inline=inline)
    proc = blockx(command, task, *(["-n", "1"] if command == "run" else []), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    where = "task.json: calls[1].args: " if inline else "calls.jsonl: line 2: args: "
    assert where + f"{MAX_ARGS_BYTES + 3:,} bytes of arguments" in proc.stderr
    assert "payload_too_large" in proc.stderr
    assert proc.stdout == ""


def test_the_documented_limit_is_the_checked_one() -> None:
    from blockx.cli.taskfile_checks import MAX_ARGS_BYTES as checked

    assert checked == MAX_ARGS_BYTES


def test_arguments_just_under_the_limit_pass_validate(tmp_path: Path) -> None:
    big = "x" * (MAX_ARGS_BYTES - 10)
    write(tmp_path / "calls.jsonl", json.dumps({"function": "f", "args": big}) + "\n")
    task = write(
        tmp_path / "task.yaml",
        f"functions:\n  f: {{source: {json.dumps(LEN_SOURCE)}}}\ncalls_file: calls.jsonl\n",
    )
    proc = blockx("validate", task, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr


AUDIT_TASK = """\
functions:
  uses_os: {source: "import os\\ndef _(x):\\n    return {'pid': os.getpid()}\\n"}
  fine: {source: "def _(x):\\n    return {'x': x}\\n"}
calls: [{function: uses_os, args: [1]}, {function: fine, args: [2]}]
audit: true
policy: {failure: continue}
"""


def test_validate_refuses_a_function_the_audit_refuses_as_run_does(tmp_path: Path) -> None:
    task = write(tmp_path / "task.yaml", AUDIT_TASK)
    proc = blockx("validate", task, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "[import.module]" in proc.stderr and "'os'" in proc.stderr
    assert "function 'uses_os' is refused by audit: true" in proc.stderr
    assert "fine" not in proc.stderr
    run = blockx("run", task, "-n", "1", cwd=tmp_path)
    assert run.returncode == 1, run.stderr
    assert "audit_rejected" in run.stderr
    # without audit: true, the same functions are valid
    plain = write(tmp_path / "plain.yaml", AUDIT_TASK.replace("audit: true", "audit: false"))
    assert blockx("validate", plain, cwd=tmp_path).returncode == 0


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("call_budget_ms", "10000000000000", "an integer from 0 to 86,400,000 (24 h)"),
        ("call_budget_ms", "86400001", "an integer from 0 to 86,400,000 (24 h)"),
        ("call_budget_ms", "-1", "an integer from 0 to 86,400,000 (24 h)"),
        ("call_budget_ms", "2.5", "an integer from 0 to 86,400,000 (24 h)"),
        ("base_backoff_ms", "1e12", "an integer from 0 to 86,400,000 (24 h)"),
        ("deadline_ms", "99999999999", "an integer from 1 to 86,400,000 (24 h)"),
    ],
)
def test_budgets_out_of_bounds_get_one_message_from_validate_and_run(
    tmp_path: Path, field: str, value: str, expected: str
) -> None:
    task = write(
        tmp_path / "task.yaml",
        "functions:\n  f: {source: \"def _(x):\\n    return {'x': x}\\n\"}\n"
        f"calls: [{{function: f, args: [1]}}]\npolicy: {{{field}: {value}}}\n",
    )
    validate = blockx("validate", task, cwd=tmp_path)
    run = blockx("run", task, "-n", "1", cwd=tmp_path)
    assert validate.returncode == run.returncode == 2, run.stderr
    assert f"task.yaml: policy.{field}: expected {expected}" in validate.stderr
    assert without_stalls(validate.stderr) == without_stalls(run.stderr)
    assert run.stdout == ""


@pytest.mark.parametrize(
    ("field", "value"), [("call_budget_ms", 0), ("call_budget_ms", 86_400_000)]
)
def test_budgets_at_the_bounds_are_valid(tmp_path: Path, field: str, value: int) -> None:
    task = write(
        tmp_path / "task.yaml",
        "functions:\n  f: {source: \"def _(x):\\n    return {'x': x}\\n\"}\n"
        f"calls: [{{function: f, args: [1]}}]\npolicy: {{{field}: {value}}}\n",
    )
    assert blockx("validate", task, cwd=tmp_path).returncode == 0


@pytest.mark.parametrize(
    ("io", "expected"),
    [
        (
            "{blockdb: {timeout_s: 100000}}",
            "io.blockdb.timeout_s=100000: expected a positive number of at most 86,400 (24 h)",
        ),
        (
            "{rpc: {timeout_s: 1.0e+13}}",
            "io.rpc.timeout_s=10000000000000.0: expected a positive number of at most 86,400 (24 h)",
        ),
        (
            "{rpc: {backoff_max_ms: 10000000000000}}",
            "io.rpc.backoff_max_ms=10000000000000: expected a non-negative integer of at most "
            "86,400,000 (24 h)",
        ),
    ],
)
def test_io_time_knobs_out_of_bounds_are_refused_by_validate_and_run(
    tmp_path: Path, io: str, expected: str
) -> None:
    task = write(
        tmp_path / "task.yaml",
        "functions:\n  f: {source: \"def _(x):\\n    return {'x': x}\\n\"}\n"
        f"calls: [{{function: f, args: [1]}}]\nio: {io}\n",
    )
    validate = blockx("validate", task, cwd=tmp_path)
    run = blockx("run", task, "-n", "1", cwd=tmp_path)
    assert validate.returncode == run.returncode == 2, run.stderr
    assert expected in validate.stderr
    assert without_stalls(validate.stderr) == without_stalls(run.stderr)
