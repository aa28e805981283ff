"""``blockx run`` at a terminal: the live progress line, Ctrl-C and SIGTERM."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_support import assert_executors_gone, clean_env, copy_example, executor_pids, jsonl, write

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def _read_all(fd: int) -> bytes:
    chunks = []
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:  # EIO: the other side closed
            break
        if not data:
            break
        chunks.append(data)
    return b"".join(chunks)


def _read_until(fd: int, needle: str, timeout: float) -> bytes:
    """What ``fd`` gives until ``needle`` has appeared (or EOF, or ``timeout`` seconds)."""
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    while needle.encode() not in b"".join(chunks):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        try:
            data = os.read(fd, 65536)
        except OSError:  # EIO: the other side closed
            break
        if not data:
            break
        chunks.append(data)
    return b"".join(chunks)


def test_progress_line_on_a_terminal(tmp_path: Path) -> None:
    # The calls wait on a gate the test opens only once it has seen a progress frame:
    # however fast the machine, the run is still going when the line is first drawn.
    gate = tmp_path / "gate"
    task = write(
        tmp_path / "task.yaml",
        (
            "task_id: gated\n"
            # the gate opens once the test has seen a progress frame: on a loaded machine
            # later than the default 5 s call budget (the sleeps count) would allow
            "policy: {call_budget_ms: 600000}\n"
            "functions:\n"
            "  wait_for_gate:\n"
            "    source: |\n"
            "      import os, time\n"
            "      def _(p):\n"
            "          while not os.path.exists(p['gate']):\n"
            "              time.sleep(0.02)\n"
            "          return {'i': p['i']}\n"
            "calls:\n"
            + "".join(
                f"  - {{function: wait_for_gate, args: {{i: {i}, gate: '{gate}'}}}}\n"
                for i in range(300)
            )
        ),
    )
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "blockx",
            "run",
            str(task),
            "-n",
            "2",
            "-o",
            str(tmp_path / "rows.jsonl"),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=slave,
        env=clean_env(COLUMNS="160"),
        cwd=tmp_path,
    )
    os.close(slave)
    try:
        before = _read_until(master, "calls/s", timeout=60)
    finally:
        gate.touch()
    err = (before + _read_all(master)).decode("utf-8", "replace")
    os.close(master)
    assert proc.wait(timeout=60) == 0, err
    frames = [f for f in err.split("\r") if "calls/s" in f and f.endswith("\x1b[K")]
    assert frames, err
    assert any(re.search(r"\d+% \S+ [\d,]+/300 ", f) for f in frames), frames[:5]
    assert all("retries" in f and "failed" in f for f in frames)
    # the line is cleared before the summary
    assert "\r\x1b[K" in err
    assert "task gated: ok — 300 calls in" in err
    assert len(jsonl((tmp_path / "rows.jsonl").read_text())) == 300
    # at most 8 redraws a second
    duration = float(re.search(r"time +([\d.]+) s wall", err).group(1))
    assert len(frames) <= 8 * duration + 2


def test_no_progress_line_without_a_terminal_unless_asked(tmp_path: Path) -> None:
    task = copy_example("streaming", tmp_path)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "blockx",
            "run",
            str(task),
            "-n",
            "1",
            "--progress",
            "-o",
            str(tmp_path / "rows.jsonl"),
        ],
        capture_output=True,
        text=True,
        env=clean_env(COLUMNS="200"),  # frames are cut to the terminal's width
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0
    # forced on: at least its first frame, drawn at once
    assert re.search(r"\d calls/s  retries[^\n]*\x1b\[K", proc.stderr), proc.stderr


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_cancels_the_task_and_stops_the_executors(
    tmp_path: Path, signum: int, status: int
) -> None:
    task = write(
        tmp_path / "task.yaml",
        (
            "functions:\n"
            "  nap:\n"
            "    source: |\n"
            "      import time\n"
            "      def _(i):\n"
            f"          open({str(tmp_path / 'started')!r} + str(i), 'w').close()\n"
            "          time.sleep(0.25)\n"
            "          return {'i': i}\n"
            "calls:\n"
            + "".join(f"  - {{function: nap, args: {i}}}\n" for i in range(200))
            + "policy: {failure: continue}\n"
        ),
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "blockx",
            "run",
            str(task),
            "-n",
            "2",
            "-v",
            "--set",
            "dispatcher.task_max_inflight_calls=4",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )
    # At most 4 calls run at once: once 6 have started, at least 2 have ended (however
    # long the executors took to start), and 200 x 0.25 s cannot all be over.
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("started*"))) < 6:
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "the calls did not start"
        time.sleep(0.02)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == status, err
    name = signal.Signals(signum).name
    assert "task " in err and f"interrupted ({name})" in err
    rows = jsonl(out)
    assert 0 < len(rows) < 200  # what ended before the signal was written
    pids = executor_pids(err)
    assert pids, err
    assert_executors_gone(pids)


def test_a_closed_output_pipe_ends_the_run_with_one_line(tmp_path: Path) -> None:
    task = copy_example("streaming", tmp_path)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "blockx",
            "run",
            str(task),
            "-n",
            "1",
            "--set",
            "stream_build.batch_max_rows=64",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=clean_env(),
        cwd=tmp_path,
    )
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    assert first.startswith(b"{")
    proc.stdout.close()  # like `| head -1`
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141, err
    assert "Traceback" not in err and "BrokenPipeError" not in err
    assert "blockx: stdout's reader went away after " in err
    assert "(exit status 141)" in err
