"""A reader that does not read (``blockx run ... | (sleep 30; cat)``, issue 16 item 5): the
rows' queue is bounded by bytes *in memory*, so the stream stops reading its calls file
(back-pressure reaches the reader of the calls) while the worker stays small; once the
reader reads, every row arrives.

The worker's memory is read from ``/proc/PID/status`` once the run has stopped on its own:
the output pipe full and the calls file's read position (``/proc/PID/fdinfo``) not moving.
Nothing here depends on the machine's speed: every wait is on a condition.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_support import clean_env, kill_if_running, wait_until_pipe_is_full, write

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

CALLS = 200_000
#: A row of ~60 bytes: the 4 MiB queue holds ~70,000 of them.
ROW_PY = "def _(i):\n    return {'i': i, 'pad': 'x' * 40}\n"
#: What the worker may hold with a full queue, far above its ~100 MB with a fast reader,
#: far below what ~70,000 queued rows cost when each keeps orjson's 4 KiB buffer (~380 MB).
CEILING_MB = 220


def _status_kb(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def _read_position(pid: int, path: Path) -> int | None:
    """Where the process's descriptor of ``path`` is (None: it has none open)."""
    target = str(path.resolve())
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") != target:
                continue
            with open(f"/proc/{pid}/fdinfo/{fd}", encoding="ascii") as f:
                for line in f:
                    if line.startswith("pos:"):
                        return int(line.split()[1])
        except (FileNotFoundError, ProcessLookupError):
            continue
    return None


def _wait_until_the_reading_stops(pid: int, calls: Path, timeout: float = 120) -> int:
    """Wait until the calls file's read position has not moved for 2 s; return it."""
    deadline = time.monotonic() + timeout
    last, since = -1, time.monotonic()
    while True:
        position = _read_position(pid, calls)
        now = time.monotonic()
        if position is not None and position != last:
            last, since = position, now
        elif position is not None and now - since >= 2.0:
            return position
        assert now < deadline, f"the calls file is still being read (at {position})"
        time.sleep(0.05)


def test_a_slow_reader_pauses_the_stream_and_keeps_the_worker_small(tmp_path: Path) -> None:
    write(tmp_path / "row.py", ROW_PY)
    calls = tmp_path / "calls.jsonl"
    with open(calls, "w", encoding="utf-8") as f:
        for i in range(CALLS):
            f.write(f'{{"function":"row","args":[{i}]}}\n')
    task = write(
        tmp_path / "task.yaml", "functions:\n  row: {path: row.py}\ncalls_file: calls.jsonl\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "blockx", "run", str(task), "-n", "1", "-q"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=clean_env(),
        cwd=tmp_path,
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        wait_until_pipe_is_full(proc, proc.stdout.fileno())
        position = _wait_until_the_reading_stops(proc.pid, calls)
        size = calls.stat().st_size
        assert position < size, "the whole calls file was read although nobody read the rows"
        rss_mb = _status_kb(proc.pid, "VmRSS") / 1024
        assert rss_mb < CEILING_MB, f"worker RSS {rss_mb:.0f} MB with a full queue"
        # Now the reader reads: every row arrives, the run ends well.
        rows = sum(1 for _ in proc.stdout)
        assert proc.wait(timeout=120) == 0, proc.stderr.read().decode()
        assert rows == CALLS
    finally:
        kill_if_running(proc)
