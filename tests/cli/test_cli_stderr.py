"""``blockx run``'s stderr when nobody reads it: a task whose functions print a lot runs to
the end and the command exits on time (lines past the writer's queue are dropped and
counted), signals are handled; a reader that reads, even one that pauses, gets every line."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from cli_support import (
    clean_env,
    jsonl,
    kill_if_running,
    streamed_task,
    wait_for_exit,
    wait_until_pipe_is_full,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(120),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pipe sizes: Linux"),
]

DROP_NOTICE = re.compile(
    r"blockx: warning: ([\d,]+) stderr lines? dropped: stderr was not read fast enough"
)


def _printing_task(tmp_path: Path, count: int, lines: int, sleep_s: float = 0.0) -> Path:
    """A streamed task of ``count`` calls; call i prints ``lines`` numbered lines of ~100
    characters (then sleeps ``sleep_s``) and returns ``{"i": i}``."""
    body = (
        f"for j in range({lines}):\n"
        "    print(f'call {i} line {j} ' + 'x' * 80)\n"
        f"time.sleep({sleep_s})\n"
        "return {'i': i}"
    )
    return streamed_task(tmp_path, count, body, task_id="printing")


def _start(task: Path, *args: str, stdout: int = subprocess.PIPE) -> subprocess.Popen[bytes]:
    """``blockx run TASK ARGS`` with stderr a pipe the test reads, or not."""
    return subprocess.Popen(
        [sys.executable, "-m", "blockx", "run", str(task), "-n", "2", *args],
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=subprocess.PIPE,
        env=clean_env(),
        cwd=task.parent,
    )


def _read_in_thread(proc: subprocess.Popen[bytes]) -> tuple[threading.Thread, list[bytes]]:
    """Read stdout to its end on a thread (the rows); the chunks read so far."""
    assert proc.stdout is not None
    stdout = proc.stdout
    chunks: list[bytes] = []

    def read() -> None:
        while chunk := stdout.read1(65536):
            chunks.append(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return reader, chunks


def _assert_lines_in_order(err: str) -> int:
    """Each call's printed lines that were written came in the order printed; their count."""
    seen: dict[int, int] = {}
    count = 0
    for call, line in re.findall(r"\] call (\d+) line (\d+) x", err):
        call_i, line_j = int(call), int(line)
        assert seen.get(call_i, -1) < line_j, f"call {call_i}: line {line_j} out of order"
        seen[call_i] = line_j
        count += 1
    return count


def test_a_run_whose_stderr_is_never_read_completes_and_exits_on_time(tmp_path: Path) -> None:
    count = 1500
    task = _printing_task(tmp_path, count, 20)  # ~3 MB printed: more than pipe and queue hold
    proc = _start(task)
    try:
        reader, rows = _read_in_thread(proc)
        took = wait_for_exit(proc, 60)
        reader.join(10)
    finally:
        kill_if_running(proc)
    assert proc.returncode == 0
    assert [row["i"] for row in jsonl(b"".join(rows).decode())] == list(range(count))
    assert took < 45
    assert proc.stderr is not None
    err = proc.stderr.read().decode()
    assert 0 < len(err) <= 256 * 1024  # what the pipe held; the rest was dropped
    _assert_lines_in_order(err)


def test_stderr_read_after_the_rows_has_the_drop_notice_and_the_summary(tmp_path: Path) -> None:
    count = 1500
    task = _printing_task(tmp_path, count, 20)
    proc = _start(task, "--summary-json", str(tmp_path / "summary.json"))
    try:
        reader, rows = _read_in_thread(proc)
        deadline = time.monotonic() + 60
        while sum(chunk.count(b"\n") for chunk in rows) < count:  # stderr is not read meanwhile
            assert proc.poll() is None, "blockx run ended before its last row"
            assert time.monotonic() < deadline, "the rows did not all come"
            time.sleep(0.01)
        assert proc.stderr is not None
        err = proc.stderr.read().decode()  # now read it, to its end
        wait_for_exit(proc, 30)
        reader.join(10)
    finally:
        kill_if_running(proc)
    assert proc.returncode == 0, err
    assert [row["i"] for row in jsonl(b"".join(rows).decode())] == list(range(count))
    notices = DROP_NOTICE.findall(err)
    assert notices, err[-2000:]
    dropped = sum(int(n.replace(",", "")) for n in notices)
    written = _assert_lines_in_order(err)
    assert written + dropped == count * 20
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["stderr_lines_dropped"] == dropped
    # the final texts come whole, after everything else
    assert f"task printing: ok — {count:,} calls in" in err, err[-2000:]
    assert err.rstrip().splitlines()[-1].lstrip().startswith("time ")


@pytest.mark.parametrize("signals", [1, 2])
def test_sigint_ends_the_run_promptly_while_stderr_is_not_read(
    tmp_path: Path, signals: int
) -> None:
    task = _printing_task(tmp_path, 20_000, 10, sleep_s=0.5)  # ~40 s of calls
    proc = _start(task, "-o", str(tmp_path / "rows.jsonl"), stdout=subprocess.DEVNULL)
    try:
        assert proc.stderr is not None
        wait_until_pipe_is_full(proc, proc.stderr.fileno())
        time.sleep(0.5)
        for _ in range(signals):
            proc.send_signal(signal.SIGINT)
            time.sleep(0.2)
        took = wait_for_exit(proc, 30)
    finally:
        kill_if_running(proc)
    assert proc.returncode == 130
    # the first signal: the run is cancelled, stderr gets 2 s to take the final texts
    assert took < 15


def test_a_reader_that_pauses_gets_every_line_in_order_and_the_run_does_not_stall(
    tmp_path: Path,
) -> None:
    # ~200 KB printed, more than the pipe holds, most of it at once (256 calls in flight);
    # each call then sleeps 2 s, so the run lasts longer than the reader's pause
    count = 400
    task = _printing_task(tmp_path, count, 5, sleep_s=2.0)
    proc = _start(task, "-o", str(tmp_path / "rows.jsonl"), stdout=subprocess.DEVNULL)
    try:
        time.sleep(3)  # nobody reads: stderr fills, then the writer's queue takes the rest
        assert proc.stderr is not None
        err = proc.stderr.read().decode()
        wait_for_exit(proc, 60)
    finally:
        kill_if_running(proc)
    assert proc.returncode == 0, err
    assert not DROP_NOTICE.search(err), err[-2000:]
    assert _assert_lines_in_order(err) == count * 5
    assert f"task printing: ok — {count:,} calls in" in err
    # the event loop never waited for the reader (it would have, writing stderr itself)
    assert "event loop stalled" not in err
