"""``blockx run`` starts its executors while it reads the task file and its calls file; bad
input found then still exits 2 with its messages and leaves no executor process behind."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.cli.cli_support import clean_env, write
from tests.helpers.processes import process_is_gone

from blockx.worker.pool.process_tree import process_start_time

FUNCTION = "def _(x):\n    return {'x': x}\n"


def _executors_of(pid: int) -> list[int]:
    """The executor processes among ``pid``'s children."""
    found: list[int] = []
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return found
    for tid in threads:
        try:
            children = Path(f"/proc/{pid}/task/{tid}/children").read_text().split()
        except OSError:
            continue
        for child in map(int, children):
            try:
                cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            except OSError:
                continue
            # An executor, forked or not; not their fork server (blockx.executor.fork_server).
            if b"blockx.executor\0" in cmdline:
                found.append(child)
    return found


def _feed_fifo(path: Path, data: bytes, proc: subprocess.Popen[str]) -> None:
    """Write ``data`` to the FIFO once ``proc`` opened it for reading (or has ended)."""
    while proc.poll() is None:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: no reader yet
                raise
            time.sleep(0.01)
            continue
        try:
            os.set_blocking(fd, True)
            os.write(fd, data)
        finally:
            os.close(fd)
        return


def _run_and_wait_for_executors(
    task: Path, cwd: Path
) -> tuple[subprocess.Popen[str], list[tuple[int, int | None]]]:
    """``blockx run task -n 2`` started, and its two executors once both exist (pid and
    start time: an exited one whose pid was reused is told apart); [] if they never came."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "blockx", "run", str(task), "-n", "2"],
        cwd=cwd,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        pids = _executors_of(proc.pid)
        if len(pids) == 2:
            return proc, [(pid, process_start_time(pid)) for pid in pids]
        time.sleep(0.02)
    return proc, []


def _assert_gone(seen: list[tuple[int, int | None]]) -> None:
    assert len(seen) == 2, "the executors were not started while the task file was read"
    for pid, started in seen:
        assert process_is_gone(pid) or process_start_time(pid) != started, pid


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_bad_calls_file_read_after_the_executors_started_leaves_no_executor_alive(
    tmp_path: Path,
) -> None:
    # The function's source is a FIFO: reading the task file waits until the test has
    # seen the executors running, so they were started before the input was checked.
    source = tmp_path / "f.py"
    os.mkfifo(source)
    write(
        tmp_path / "calls.jsonl",
        '{"function": "f", "args": [1]}\n{"function": "f", "args": [2\n',
    )
    task = write(tmp_path / "task.yaml", "functions:\n  f: {path: f.py}\ncalls_file: calls.jsonl\n")
    proc, seen = _run_and_wait_for_executors(task, tmp_path)
    _feed_fifo(source, FUNCTION.encode(), proc)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err
    assert "calls.jsonl: line 2: not valid JSON" in err
    assert out == ""
    _assert_gone(seen)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ctrl_c_while_the_task_file_is_read_ends_at_once_and_leaves_no_executor_alive(
    tmp_path: Path,
) -> None:
    # The task file's function source is a FIFO nobody writes: reading it never ends by
    # itself, so only the interruption can end the command.
    source = tmp_path / "f.py"
    os.mkfifo(source)
    task = write(tmp_path / "task.yaml", "functions:\n  f: {path: f.py}\ncalls: [{function: f}]\n")
    proc, seen = _run_and_wait_for_executors(task, tmp_path)
    try:
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            _feed_fifo(source, FUNCTION.encode(), proc)
            _, err = proc.communicate(timeout=120)
            raise AssertionError(f"Ctrl-C did not end the command while it read: {err}") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    _assert_gone(seen)


def test_a_bad_task_file_exits_2_with_its_messages_when_the_config_is_bad_too(
    tmp_path: Path,
) -> None:
    # The worker's configuration has a problem: nothing starts early, and the task file's
    # problems are the ones reported (as before the executors started early).
    task = write(tmp_path / "task.yaml", "functions: {}\ncalls: []\n")
    proc = subprocess.run(
        [sys.executable, "-m", "blockx", "run", str(task), "--set", "pool.executor_count=0"],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert "task.yaml: functions: expected a mapping" in proc.stderr
    assert "executor_count" not in proc.stderr


def test_the_worker_process_gc_is_tuned_once_the_executors_are_started(tmp_path: Path) -> None:
    # blockx.worker.app.tune_gc: the CLI applies it after spawning the executors, and
    # still applies it.
    task = write(
        tmp_path / "task.yaml",
        f"functions:\n  f:\n    source: {FUNCTION!r}\ncalls:\n  - {{function: f, args: [1]}}\n",
    )
    code = (
        "import gc\n"
        "from blockx.cli import main\n"
        "from blockx.worker.app import GC_GEN0_THRESHOLD\n"
        f"status = main(['run', {str(task)!r}, '-q', '-o', {str(tmp_path / 'rows.jsonl')!r}])\n"
        "print(status, gc.get_threshold()[0] == GC_GEN0_THRESHOLD, gc.get_freeze_count() > 0)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.stdout.split() == ["0", "True", "True"], done.stderr


#: ``blockx run`` with ``PoolManager.spawn_early`` watched: which modules were loaded when
#: the executors were spawned, and whether the run still succeeded.
_SPAWN_SPY = """
import json, sys
from blockx.worker.pool import manager
real = manager.PoolManager.spawn_early
seen_file = sys.argv[1]
def spy(self):
    seen = {m: m in sys.modules for m in ("blockx.worker.app", "blockx.cli.taskfile", "yaml")}
    with open(seen_file, "w") as f:
        json.dump(seen, f)
    return real(self)
manager.PoolManager.spawn_early = spy
from blockx.cli import console_main
sys.argv = ["blockx", "run", sys.argv[2], "-o", sys.argv[3], "-n", "2", "--quiet"]
console_main()
"""


def _run_one_call_with(spy: str, spy_file: Path, tmp_path: Path) -> None:
    """``blockx run`` of a one-call task in a process running ``spy`` first (its
    ``sys.argv``: ``spy_file``, the task, the rows file); it must succeed."""
    task = write(
        tmp_path / "task.yaml",
        'task_id: spied\nfunctions:\n  f: {source: "'
        + FUNCTION.replace("\n", "\\n")
        + '"}\ncalls:\n  - {function: f, args: 1}\n',
    )
    rows = tmp_path / "rows.jsonl"
    done = subprocess.run(
        [sys.executable, "-c", spy, str(spy_file), str(task), str(rows)],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert rows.read_text() == '{"x":1}\n'


def test_blockx_run_spawns_its_executors_before_the_worker_is_imported(tmp_path: Path) -> None:
    # The point of the early spawn: the executors boot while the worker is imported and
    # the task file read. An import of blockx.worker.app before it (as a `from
    # blockx.worker.app import run` once did) silently gave the head start back.
    seen_file = tmp_path / "seen.json"
    _run_one_call_with(_SPAWN_SPY, seen_file, tmp_path)
    import json

    assert json.loads(seen_file.read_text()) == {
        "blockx.worker.app": False,
        "blockx.cli.taskfile": False,
        "yaml": False,
    }


#: ``blockx run`` whose pool cannot finish starting before the input check has begun: its
#: wait for the executors' spawns waits for a file the check writes first.
_OVERLAP_SPY = """
import asyncio, os, sys, time
from blockx.cli import run_input
from blockx.worker.pool import manager
flag = sys.argv[1]
real_settled = manager.PoolManager._spawns_settled
async def settled_once_the_check_began(self):
    deadline = time.monotonic() + 10
    while not os.path.exists(flag):
        if time.monotonic() > deadline:
            raise RuntimeError("the input was not checked while the worker started")
        await asyncio.sleep(0.005)
    await real_settled(self)
manager.PoolManager._spawns_settled = settled_once_the_check_began
real_check = run_input.check_input
def check(*args, **kwargs):
    open(flag, "w").close()
    return real_check(*args, **kwargs)
run_input.check_input = check
from blockx.cli import console_main
sys.argv = ["blockx", "run", sys.argv[2], "-o", sys.argv[3], "-n", "2", "--quiet"]
console_main()
"""


def test_blockx_run_checks_its_input_while_the_worker_waits_for_its_executors(
    tmp_path: Path,
) -> None:
    # The worker's start waits for the fork server's first forks (~60 ms after its own
    # start); the input is checked meanwhile, not after.
    _run_one_call_with(_OVERLAP_SPY, tmp_path / "checked", tmp_path)


def test_start_executors_gives_early_executors_for_a_good_configuration() -> None:
    # start_executors falls back to None (the worker spawns them) on any failure: that
    # must stay the exception, or every run loses the head start silently.
    from blockx.cli.run_input import RunOptions, early_worker_config, start_executors

    config = early_worker_config(RunOptions(task="task.yaml", executors=1))
    assert config is not None
    early = start_executors(config)
    assert early is not None
    try:
        assert len(early.pids) == 1 and os.path.exists(early.socket_path)
    finally:
        early.discard()
