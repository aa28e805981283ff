"""``blockx run``'s stdout when nobody reads it: the run goes on, signals are handled, a
first signal ends the process within a bounded time (the unwritten rows are dropped and
counted), a second one at once; a slow reader gets every row, in order."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_support import (
    assert_executors_gone,
    clean_env,
    executor_pids,
    kill_if_running,
    stalls_ms,
    streamed_task,
    wait_for_exit,
    wait_until_pipe_is_full,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(120),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pipe sizes: Linux"),
]


def _rows_task(tmp_path: Path, count: int, pad: int) -> Path:
    """A streamed task of ``count`` calls; call i returns ``{"i": i, "pad": "x" * pad}``."""
    return streamed_task(tmp_path, count, f"return {{'i': i, 'pad': 'x' * {pad}}}")


def _start(task: Path, err: Path, *args: str) -> subprocess.Popen[bytes]:
    """``blockx run TASK ARGS`` with stdout a pipe (read by the test, or not) and stderr
    a file (so stderr can never block it)."""
    with open(err, "wb") as stderr:
        return subprocess.Popen(
            [sys.executable, "-m", "blockx", "run", str(task), "-n", "2", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=clean_env(),
            cwd=task.parent,
        )


def _wait_until_stdout_is_full(proc: subprocess.Popen[bytes]) -> None:
    assert proc.stdout is not None
    wait_until_pipe_is_full(proc, proc.stdout.fileno())


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_ends_the_run_promptly_while_stdout_is_not_read(
    tmp_path: Path, signum: int, status: int
) -> None:
    task = _rows_task(tmp_path, 5000, 200)
    err_path = tmp_path / "err.txt"
    proc = _start(task, err_path, "-v")
    try:
        _wait_until_stdout_is_full(proc)
        time.sleep(0.5)
        proc.send_signal(signum)
        took = wait_for_exit(proc, 30)
    finally:
        kill_if_running(proc)
    assert proc.stdout is not None
    written = proc.stdout.read()
    err = err_path.read_text()
    assert proc.returncode == status, err
    # the run was cancelled and ended within its grace for the output (2 s) plus shutdown
    assert took < 15, err
    name = signal.Signals(signum).name
    assert f"interrupted ({name})" in err
    assert "stdout was not read for 2 s after the interruption" in err
    dropped_message = re.search(r"([\d,]+) rows dropped, not written", err)
    assert dropped_message, err
    summary = re.search(r"outputs +([\d,]+) rows? → stdout; ([\d,]+) not written", err)
    assert summary, err
    rows_written, rows_dropped = (int(n.replace(",", "")) for n in summary.groups())
    assert rows_dropped == int(dropped_message.group(1).replace(",", "")) > 0
    # exactly the rows counted written reached the pipe, whole and in order (a last line
    # may be cut short: the stop came in the middle of it)
    lines = written.split(b"\n")[:-1]
    assert [json.loads(line)["i"] for line in lines] == list(range(rows_written))
    succeeded = int(re.search(r"calls +([\d,]+) succeeded", err).group(1).replace(",", ""))
    assert rows_written + rows_dropped == succeeded  # every row of an ended call accounted
    assert_executors_gone(executor_pids(err))


def test_a_second_signal_exits_at_once_while_stdout_is_not_read(tmp_path: Path) -> None:
    task = _rows_task(tmp_path, 5000, 200)
    err_path = tmp_path / "err.txt"
    proc = _start(task, err_path, "-v")
    try:
        _wait_until_stdout_is_full(proc)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        took = wait_for_exit(proc, 30)
    finally:
        kill_if_running(proc)
    err = err_path.read_text()
    assert proc.returncode == 130, err
    assert "blockx: SIGINT again: exiting at once" in err
    assert "interrupted (SIGINT)" not in err  # gone before the summary, as asked
    assert took < 5, err
    assert_executors_gone(executor_pids(err))  # the parent-death signal


def test_a_slow_reader_gets_every_row_in_order_and_the_run_does_not_stall(
    tmp_path: Path,
) -> None:
    count, pad = 3000, 2000  # ~6 MB: more than the pipe and the writer's queue hold
    task = _rows_task(tmp_path, count, pad)
    err_path = tmp_path / "err.txt"
    proc = _start(task, err_path)
    assert proc.stdout is not None
    chunks: list[bytes] = []
    try:
        time.sleep(3)  # nobody reads: stdout fills, then the writer's queue
        fd = proc.stdout.fileno()
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
            time.sleep(0.005)
        wait_for_exit(proc, 60)
    finally:
        kill_if_running(proc)
    err = err_path.read_text()
    assert proc.returncode == 0, err
    rows = [json.loads(line) for line in b"".join(chunks).splitlines()]
    assert len(rows) == count
    assert rows == [{"i": i, "pad": "x" * pad} for i in range(count)]
    assert f"outputs   {count:,} rows → stdout" in err
    # the event loop never waited for the reader (it would have, writing rows itself, for
    # about the 3 s nobody read); shorter stalls are the machine's load, not the writer's
    assert all(ms < 2000 for ms in stalls_ms(err)), err
