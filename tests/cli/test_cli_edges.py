"""The edges of ``blockx run`` (issue 16): output paths checked before anything runs, a
calls file that changes while it is read, ``max_output_bytes`` inline and streamed, a
reader that goes away."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from cli_support import blockx, clean_env, jsonl, without_stalls, write

from blockx.cli.calls_file import KEEP_CHECKED_BYTES

pytestmark = [pytest.mark.timeout(120)]

DOUBLE = "functions:\n  double: {path: double.py}\n"
DOUBLE_PY = "def _(x):\n    return {'y': 2 * x}\n"
CALLS = '{"function":"double","args":[1]}\n{"function":"double","args":[2]}\n'


def _stream_task(tmp_path: Path) -> Path:
    write(tmp_path / "double.py", DOUBLE_PY)
    write(tmp_path / "calls.jsonl", CALLS)
    return write(tmp_path / "task.yaml", DOUBLE + "calls_file: calls.jsonl\n")


# --- 1. an output path that is an input ----------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "target", "named"),
    [
        ("-o", "calls.jsonl", "the calls file calls.jsonl"),
        ("-o", "task.yaml", "the task file"),
        ("--errors", "double.py", "the source of function 'double'"),
        ("--summary-json", "calls.jsonl", "the calls file calls.jsonl"),
    ],
)
def test_an_output_that_is_an_input_is_refused_before_anything_runs(
    tmp_path: Path, flag: str, target: str, named: str
) -> None:
    task = _stream_task(tmp_path)
    before = (tmp_path / target).read_bytes()
    proc = blockx("run", task, flag, target, "-n", "1", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert (tmp_path / target).read_bytes() == before  # not truncated
    assert f"{flag} {target}: is the same file as {named}" in proc.stderr
    assert proc.stderr.count("\n") == 1  # one line, naming both
    assert proc.stdout == ""


def test_an_output_reaching_an_input_through_a_symlink_or_hard_link_is_refused(
    tmp_path: Path,
) -> None:
    task = _stream_task(tmp_path)
    (tmp_path / "out").mkdir()
    os.symlink(tmp_path / "calls.jsonl", tmp_path / "out" / "rows.jsonl")
    os.link(tmp_path / "task.yaml", tmp_path / "copy.yaml")
    for target, named in (("out/rows.jsonl", "the calls file"), ("copy.yaml", "the task file")):
        proc = blockx("run", task, "-o", target, "-n", "1", cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr
        assert f"-o {target}: is the same file as {named}" in proc.stderr
    assert (tmp_path / "calls.jsonl").read_text() == CALLS


def test_two_outputs_naming_one_file_are_refused(tmp_path: Path) -> None:
    task = _stream_task(tmp_path)
    proc = blockx("run", task, "-o", "x.jsonl", "--errors", "./x.jsonl", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "--errors ./x.jsonl: is the same file as -o x.jsonl" in proc.stderr
    assert not (tmp_path / "x.jsonl").exists()


def test_dev_null_may_take_every_output(tmp_path: Path) -> None:
    task = _stream_task(tmp_path)
    proc = blockx(
        "run", task, "-o", os.devnull, "--errors", os.devnull, "-n", "1", "-q", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr


# --- 2. output paths that cannot be written ------------------------------------------------


@pytest.mark.parametrize("flag", ["-o", "--errors", "--summary-json"])
def test_an_output_that_is_a_directory_is_refused_before_anything_runs(
    tmp_path: Path, flag: str
) -> None:
    task = _stream_task(tmp_path)
    (tmp_path / "d").mkdir()
    proc = blockx("run", task, flag, "d", "-n", "1", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""  # nothing ran
    assert f"{flag} d: is a directory" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("flag", ["--errors", "--summary-json"])
def test_an_output_that_cannot_be_created_is_refused_before_anything_runs(
    tmp_path: Path, flag: str
) -> None:
    task = _stream_task(tmp_path)
    proc = blockx("run", task, flag, "/proc/blockx-no-such-file", "-n", "1", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert f"{flag} /proc/blockx-no-such-file: cannot be written" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_checked_output_is_left_untouched_when_the_run_is_refused(tmp_path: Path) -> None:
    task = _stream_task(tmp_path)
    write(tmp_path / "old-errors.jsonl", "keep me\n")
    (tmp_path / "d").mkdir()
    proc = blockx("run", task, "--errors", "old-errors.jsonl", "-o", "d", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert (tmp_path / "old-errors.jsonl").read_text() == "keep me\n"
    assert not (tmp_path / "new.json").exists()


# --- 1 and 6. a calls file that changes while it is read -----------------------------------

TRUNCATE_PY = """\
import os


def _(path, keep, pad=None):
    if path is not None:
        os.truncate(path, keep)  # the calls file, while the run reads it
    return {"ok": 1}
"""


#: Each line padded so the file passes KEEP_CHECKED_BYTES: the run reads it again.
PAD = "p" * (KEEP_CHECKED_BYTES // 3000 + 64)


@pytest.mark.parametrize("keep", [0, 150])
def test_a_calls_file_cut_short_while_it_is_read_fails_and_says_how_many_calls_were_read(
    tmp_path: Path, keep: int
) -> None:
    calls = tmp_path / "calls.jsonl"
    lines = [json.dumps({"function": "cut", "args": [str(calls), keep]})]
    lines += [f'{{"function":"cut","args":[null,0,"{PAD}"]}}'] * 3000
    write(calls, "\n".join(lines) + "\n")
    assert calls.stat().st_size > KEEP_CHECKED_BYTES
    write(tmp_path / "cut.py", TRUNCATE_PY)
    task = write(
        tmp_path / "task.yaml", "functions:\n  cut: {path: cut.py}\ncalls_file: calls.jsonl\n"
    )
    proc = blockx(
        "run",
        task,
        "-n",
        "1",
        "--set",
        "stream_build.batch_max_rows=1",
        "--set",
        "stream_build.max_outstanding_batches=1",
        "--summary-json",
        "summary.json",
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stderr
    err = proc.stderr
    assert "blockx: error: calls.jsonl changed while it was read" in err
    summary = json.loads((tmp_path / "summary.json").read_text())
    read = summary["calls"]
    assert 0 < read < 3001
    assert summary["calls_in_file"] == 3001
    assert summary["exit_code"] == 1
    assert f"stream    stopped after {read:,} call" in err
    assert len(jsonl(proc.stdout)) == summary["succeeded"]
    assert "nothing was run" not in err
    assert ": FAILED — " in err and f"{read:,} of 3,001 calls" in err


def test_a_small_calls_file_cut_short_while_it_runs_runs_as_it_was_checked(
    tmp_path: Path,
) -> None:
    # Up to KEEP_CHECKED_BYTES the check's decoded calls are what runs: the file is not
    # read again, so cutting it changes nothing.
    calls = tmp_path / "calls.jsonl"
    lines = [json.dumps({"function": "cut", "args": [str(calls), 0]})]
    lines += ['{"function":"cut","args":[null,0]}'] * 3000
    write(calls, "\n".join(lines) + "\n")
    write(tmp_path / "cut.py", TRUNCATE_PY)
    task = write(
        tmp_path / "task.yaml", "functions:\n  cut: {path: cut.py}\ncalls_file: calls.jsonl\n"
    )
    proc = blockx("run", task, "-n", "1", "--set", "stream_build.batch_max_rows=1", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert calls.stat().st_size == 0  # the first call did cut it
    assert jsonl(proc.stdout) == [{"ok": 1}] * 3001


def test_a_calls_file_whole_as_checked_still_succeeds(tmp_path: Path) -> None:
    task = _stream_task(tmp_path)
    proc = blockx("run", task, "-n", "1", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert jsonl(proc.stdout) == [{"y": 2}, {"y": 4}]


# --- 3. max_output_bytes: the rows of the calls that succeeded, inline or streamed ---------

PAD_PY = "def _(x):\n    return {'x': x, 'pad': 'p' * 100}\n"


@pytest.mark.parametrize("inline", [True, False], ids=["inline", "streamed"])
def test_max_output_bytes_writes_the_rows_of_the_calls_that_succeeded(
    tmp_path: Path, inline: bool
) -> None:
    write(tmp_path / "pad.py", PAD_PY)
    calls = [{"function": "pad", "args": [i]} for i in range(50)]
    head = "functions:\n  pad: {path: pad.py}\npolicy: {max_output_bytes: 1000}\n"
    if inline:
        task = write(tmp_path / "task.yaml", head + f"calls: {json.dumps(calls)}\n")
    else:
        write(tmp_path / "calls.jsonl", "".join(json.dumps(c) + "\n" for c in calls))
        task = write(tmp_path / "task.yaml", head + "calls_file: calls.jsonl\n")
    proc = blockx("run", task, "-n", "1", "--summary-json", "s.json", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "max_output_bytes" in proc.stderr
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["failure"] == "OUTPUT_BYTES_EXCEEDED"
    rows = jsonl(proc.stdout)
    assert summary["succeeded"] > 0
    assert len(rows) == summary["succeeded"] == summary["output_rows"]
    assert [r["x"] for r in rows] == sorted(r["x"] for r in rows)  # in call order


# --- 6. the reader goes away ---------------------------------------------------------------

ENDLESS_PY = "def _(i):\n    return {'i': i, 'pad': 'p' * 200}\n"


def _endless(tmp_path: Path) -> list[str]:
    write(tmp_path / "f.py", ENDLESS_PY)
    write(
        tmp_path / "calls.jsonl",
        "".join(f'{{"function":"f","args":[{i}]}}\n' for i in range(200_000)),
    )
    task = write(tmp_path / "task.yaml", "functions:\n  f: {path: f.py}\ncalls_file: calls.jsonl\n")
    return [sys.executable, "-m", "blockx", "run", str(task), "-n", "1"]


@pytest.mark.slow
def test_a_reader_that_goes_away_gets_one_line_and_141(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        _endless(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=clean_env(),
        cwd=tmp_path,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith(b"{")
    proc.stdout.close()  # like `| head -1`
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141, err
    lines = [
        ln
        for ln in without_stalls(err).splitlines()
        if "UserWarning" not in ln and "_native" not in ln
    ]
    assert len(lines) == 1, err
    assert "stdout's reader went away after" in lines[0]
    assert "Traceback" not in err


@pytest.mark.slow
def test_ctrl_c_in_a_pipeline_whose_reader_dies_says_so_and_exits_130(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        _endless(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=clean_env(),
        cwd=tmp_path,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith(b"{")
    proc.send_signal(signal.SIGINT)  # Ctrl-C reaches the whole pipeline:
    proc.stdout.close()  # the reader dies with it
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 130, err
    assert "interrupted (SIGINT)" in err
    assert "Traceback" not in err


# --- 4. a backend still busy when the task is over -----------------------------------------

LOCKED_TASK = """\
functions:
  w: {source: "def _(x):\\n    Table('t').upsert_rows([{'key': 'k', 'v': x}])\\n    return {'ok': x}\\n"}
calls: [{function: w, args: [1]}]
policy: {call_budget_ms: 1000, max_attempts: 1}
io: {data_dir: data, blockdb: {timeout_s: 120}}
"""


def test_a_locked_sqlite_store_does_not_hold_the_command_past_the_task(tmp_path: Path) -> None:
    import sqlite3
    import time

    (tmp_path / "data").mkdir()
    holder = sqlite3.connect(tmp_path / "data" / "blockdb.sqlite3", isolation_level=None)
    holder.execute("PRAGMA journal_mode=WAL")
    holder.execute("CREATE TABLE IF NOT EXISTS other (x)")
    holder.execute("BEGIN EXCLUSIVE")  # another process's lock, held for the whole run
    task = write(tmp_path / "task.yaml", LOCKED_TASK)
    started = time.monotonic()
    try:
        proc = blockx("run", task, "-n", "1", "--summary-json", "s.json", cwd=tmp_path)
    finally:
        holder.close()
    took = time.monotonic() - started
    assert proc.returncode == 1, proc.stderr
    assert took < 60, took  # far below the store's 120 s busy timeout, however slow the machine
    assert "deadline_exceeded" in proc.stderr
    assert "abandoned blockdb: 1 operation still running 1 s after the task ended" in proc.stderr
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["io_abandoned"] == [
        "blockdb: 1 operation still running 1 s after the task ended: abandoned, not finished"
    ]
