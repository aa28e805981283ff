"""Helpers of the CLI tests: run ``python -m blockx`` as a user does, in a clean environment."""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path
from typing import Any

import pytest
from tests.helpers.processes import process_is_gone

from blockx.worker.config import CONFIG_FILE_ENV, iter_knobs
from blockx.worker.io.config import ENV_VARS as IO_ENV_VARS

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without any BlockX knob (the tests set what they need)."""
    env = dict(os.environ)
    for _section, _name, f in iter_knobs():
        env.pop(f.metadata["env"], None)
    for variable in IO_ENV_VARS.values():
        env.pop(variable, None)
    env.pop(CONFIG_FILE_ENV, None)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


#: The worker's warning when its event loop ran late (a busy machine can cause it anywhere).
_STALL = re.compile(r"event loop stalled (\d+) ms")


def stalls_ms(err: str) -> list[int]:
    """How long each "event loop stalled" warning in ``err`` says the loop was late."""
    return [int(m.group(1)) for m in _STALL.finditer(err)]


def without_stalls(err: str) -> str:
    """``err`` without its "event loop stalled" warnings: a loaded machine (CI, two cores
    shared with other test processes) can delay any process's loop, so a test comparing
    messages must not count them."""
    return "".join(line for line in err.splitlines(keepends=True) if not _STALL.search(line))


def blockx(
    *args: str | os.PathLike[str],
    cwd: str | os.PathLike[str] | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m blockx ARGS`` and return the finished process (text, both streams)."""
    return subprocess.run(
        [sys.executable, "-m", "blockx", *map(str, args)],
        cwd=cwd,
        env=env if env is not None else clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def copy_example(name: str, dest: Path) -> Path:
    """A copy of ``examples/NAME`` under ``dest`` (its tables go to ``dest/.data``); the task file."""
    target = dest / name
    shutil.copytree(EXAMPLES / name, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target / "task.yaml"


def jsonl(text: str) -> list[Any]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def wait_until_pipe_is_full(proc: subprocess.Popen[bytes], fd: int, timeout: float = 60) -> None:
    """Wait until the pipe whose read end is ``fd`` holds all it can (nobody reads it).

    "All it can" is not always the capacity: a pipe keeps its data in page slots, and
    writes that do not fill their pages can use up every slot ~10% short of the
    capacity (how short depends on how the writer's chunks fell). So the pipe counts
    as full at the capacity (less a page), or once it holds more than half of it and
    has not grown for a second while the writer keeps running.
    """
    capacity = fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ)
    deadline = time.monotonic() + timeout
    last, since = -1, time.monotonic()
    while True:
        queued = struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
        now = time.monotonic()
        if queued >= capacity - 4096:
            return
        if queued != last:
            last, since = queued, now
        elif queued > capacity // 2 and now - since >= 1.0:
            return
        if proc.poll() is not None:
            tail = os.read(fd, capacity).decode(errors="replace")[-3000:]
            raise AssertionError(
                f"blockx run ended (status {proc.returncode}) before the pipe was full:\n{tail}"
            )
        assert now < deadline, f"the pipe holds only {queued} bytes"
        time.sleep(0.02)


def kill_if_running(proc: subprocess.Popen[bytes]) -> None:
    """Kill and reap ``proc`` unless it already ended (a test's ``finally``)."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def wait_for_exit(proc: subprocess.Popen[bytes], timeout: float) -> float:
    """Wait for the process to end (kill it past ``timeout`` and fail); the time it took."""
    started = time.monotonic()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(f"blockx run did not end within {timeout} s")
    return time.monotonic() - started


class PipeStream:
    """Stands in for ``sys.stdout`` or ``sys.stderr``: a pipe's write end (the test holds
    the read end)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self.encoding = "utf-8"

    def fileno(self) -> int:
        return self._fd

    def flush(self) -> None:
        pass


class Pipe:
    def __init__(self) -> None:
        self.read_end, self.write_end = os.pipe()
        self.stream = PipeStream(self.write_end)
        self.stdout = self.stream


def drain(fd: int) -> bytes:
    """What the pipe holds now, without waiting."""
    os.set_blocking(fd, False)
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.set_blocking(fd, True)
    return b"".join(chunks)


def streamed_task(tmp_path: Path, count: int, body: str, *, task_id: str = "streamed") -> Path:
    """A task file whose ``count`` calls (a calls file) call ``f(i)`` for i in 0..count-1;
    ``body``: the lines of ``f``'s entry ``def _(i):``, indented by 4."""
    write(
        tmp_path / "calls.jsonl",
        "".join(f'{{"function": "f", "args": {i}}}\n' for i in range(count)),
    )
    source = "".join(f"          {line}\n" for line in body.splitlines())
    return write(
        tmp_path / "task.yaml",
        f"task_id: {task_id}\nfunctions:\n  f:\n    source: |\n      import time\n"
        f"      def _(i):\n{source}calls_file: calls.jsonl\n",
    )


def executor_pids(stderr: str) -> list[int]:
    """The executors ``blockx run -v`` said it started, by pid."""
    return [int(p) for p in re.findall(r"executor exec-\d+ started \(pid (\d+)\)", stderr)]


def assert_executors_gone(pids: list[int], timeout: float = 10) -> None:
    """Every one of ``pids`` ends within ``timeout`` (none outlives ``blockx run``)."""
    assert pids
    deadline = time.monotonic() + timeout
    while not all(process_is_gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(process_is_gone(pid) for pid in pids), "an executor outlived blockx run"
