"""Fault containment of a real executor process (issue 15): the black box names the call
that held the thread when the process died, a memory limit ends the process (exit 87)
before the host's memory goes, an executor out of descriptors recycles itself (exit 88),
no process user code started outlives the executor, a stopped-then-resumed executor
fails no healthy call, and heartbeats say how long the running call has run."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.helpers.fake_worker import FakeWorker

from blockx.wire import keys
from blockx.wire.blackbox import (
    CAUSE_DESCRIPTORS_EXHAUSTED,
    CAUSE_MEMORY_EXCEEDED,
    CAUSE_NONE,
    EXIT_DESCRIPTORS_EXHAUSTED,
    EXIT_MEMORY_EXCEEDED,
    read_blackbox,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

StartWorker = Callable[..., FakeWorker]

CRASH = """\
import os

def _(p):
    os._exit(p)
"""

SUSPEND = """\
from blockx.sdk import get_provider

def _(p):
    return get_provider().read_req("blockdb", "get_row", {"k": p})
"""


def _box_worker(start_worker: StartWorker, tmp_path: Path, *args: str) -> tuple[FakeWorker, str]:
    box = str(tmp_path / "exec.box")
    return start_worker(extra_args=("--blackbox-path", box, *args)), box


def _reap(worker: FakeWorker, timeout: float = 30.0) -> tuple[int, int]:
    """Wait for the executor to exit by itself: ``(exit status, peak RSS in KiB)``
    (``wait4``: the peak of this one child, whatever else the test process reaped)."""
    assert worker.proc is not None
    deadline = time.monotonic() + timeout
    while True:
        pid, status, usage = os.wait4(worker.proc.pid, os.WNOHANG)
        if pid:
            code = os.waitstatus_to_exitcode(status)
            worker.proc.returncode = code
            return code, usage.ru_maxrss
        if time.monotonic() > deadline:
            raise AssertionError(f"executor still running:\n{worker.stderr_text()[-3000:]}")
        time.sleep(0.02)


# --- the black box ---------------------------------------------------------------------


def test_a_call_that_exits_the_process_is_named_in_the_black_box(
    start_worker: StartWorker, tmp_path: Path
) -> None:
    worker, box = _box_worker(start_worker, tmp_path)
    worker.execute_call("t1/culprit", source=CRASH, args=7, attempt_seq=3)
    code, _ = _reap(worker)
    assert code == 7
    record = read_blackbox(box)
    assert record is not None
    assert (record.call_id, record.attempt_seq, record.cause) == ("t1/culprit", 3, CAUSE_NONE)


def test_a_suspended_call_is_not_blamed_for_its_neighbours_crash(
    start_worker: StartWorker, tmp_path: Path
) -> None:
    worker, box = _box_worker(start_worker, tmp_path)
    worker.execute_call("t1/waiting", source=SUSPEND, args=1)
    waiting = worker.next_frame()
    assert waiting.message_type == keys.MT_CALL_WAITING  # suspended in its IO wait
    worker.execute_call("t1/crasher", source=CRASH, args=1)
    code, _ = _reap(worker)
    assert code == 1
    record = read_blackbox(box)
    assert record is not None and record.call_id == "t1/crasher"


def test_an_idle_executor_names_no_call(start_worker: StartWorker, tmp_path: Path) -> None:
    worker, box = _box_worker(start_worker, tmp_path)
    worker.execute_call("t1/ok", source="def _(p):\n    return p\n", args=1)
    assert worker.wait_terminal("t1/ok").message_type == keys.MT_CALL_COMPLETED
    worker.proc.kill()  # type: ignore[union-attr]
    _reap(worker)
    record = read_blackbox(box)
    assert record is not None and record.call_id is None


# --- memory ----------------------------------------------------------------------------


def test_a_huge_allocation_ends_the_executor_at_once_without_taking_the_memory(
    start_worker: StartWorker, tmp_path: Path
) -> None:
    worker, box = _box_worker(start_worker, tmp_path, "--memory-limit-mb", "200")
    worker.execute_call("t1/hog", source="def _(p):\n    return len(bytearray(8 << 30))\n")
    code, peak_kib = _reap(worker)
    assert code == EXIT_MEMORY_EXCEEDED
    assert peak_kib < 400 * 1024, f"peak RSS {peak_kib >> 10} MiB"
    record = read_blackbox(box)
    assert record is not None
    assert (record.call_id, record.cause) == ("t1/hog", CAUSE_MEMORY_EXCEEDED)
    assert "memory limit of 200 MB" in worker.stderr_text()


def test_an_allocation_storm_is_stopped_near_the_limit(
    start_worker: StartWorker, tmp_path: Path
) -> None:
    worker, box = _box_worker(start_worker, tmp_path, "--memory-limit-mb", "200")
    storm = (
        "def _(p):\n"
        "    chunks = []\n"
        "    while True:\n"
        "        try:\n"
        "            chunks.append(bytearray(1 << 20))\n"
        "        except MemoryError:\n"  # even a call that swallows it does not go on
        "            chunks.clear()\n"
    )
    worker.execute_call("t1/storm", source=storm)
    code, peak_kib = _reap(worker)
    assert code == EXIT_MEMORY_EXCEEDED
    assert peak_kib < 600 * 1024, f"peak RSS {peak_kib >> 10} MiB"
    record = read_blackbox(box)
    assert record is not None
    assert (record.call_id, record.cause) == ("t1/storm", CAUSE_MEMORY_EXCEEDED)


def test_calls_within_the_limit_run_as_usual(start_worker: StartWorker, tmp_path: Path) -> None:
    worker, _ = _box_worker(start_worker, tmp_path, "--memory-limit-mb", "300")
    source = "def _(p):\n    return len(bytearray(50 << 20)) + len([0] * 1_000_000)\n"
    for i in range(3):
        worker.execute_call(f"t1/c{i}", source=source)
    for i in range(3):
        frame = worker.wait_terminal(f"t1/c{i}", timeout=30)
        assert frame.envelope[keys.F_PAYLOAD][keys.FP_OUTPUT] == (50 << 20) + 1_000_000


# --- descriptors -----------------------------------------------------------------------

FD_HOG = """\
import os

def _(p):
    held = []
    while True:
        held.append(os.open("/dev/null", os.O_RDONLY))
"""


def test_an_executor_out_of_descriptors_fails_the_call_then_recycles_itself(
    start_worker: StartWorker, tmp_path: Path
) -> None:
    worker, box = _box_worker(start_worker, tmp_path, "--max-open-files", "64")
    limits = Path(f"/proc/{worker.pid}/limits").read_text()
    (line,) = [line for line in limits.splitlines() if line.startswith("Max open files")]
    assert line.split()[3:5] == ["64", "64"]  # soft and hard
    worker.execute_call("t1/fds", source=FD_HOG)
    failed = worker.wait_terminal("t1/fds", timeout=30)
    assert failed.message_type == keys.MT_CALL_FAILED
    assert "Too many open files" in failed.envelope[keys.F_PAYLOAD][keys.FP_ERROR_MESSAGE]
    code, _ = _reap(worker)
    assert code == EXIT_DESCRIPTORS_EXHAUSTED
    record = read_blackbox(box)
    assert record is not None
    assert (record.call_id, record.cause) == (None, CAUSE_DESCRIPTORS_EXHAUSTED)


# --- descendants -----------------------------------------------------------------------

SPAWNER = """\
import os
import subprocess

def _(marker):
    subprocess.Popen(["setsid", "sleep", marker + "1"], start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)
    first = os.fork()
    if first == 0:
        try:
            if os.fork() == 0:
                os.setsid()
                os.execvp("sleep", ["sleep", marker + "2"])
        finally:
            os._exit(0)
    os.waitpid(first, 0)
    return "spawned"
"""


def _processes_with(argument: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if argument.encode() in cmdline and state != b"Z":
            found.append(int(entry))
    return found


def _wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.mark.parametrize("ending", ["sigterm", "disconnect", "memory"])
def test_no_process_user_code_started_outlives_the_executor(
    start_worker: StartWorker, tmp_path: Path, ending: str
) -> None:
    marker = f"300.{os.getpid()}{abs(hash(ending)) % 1000:03d}"
    worker, _ = _box_worker(start_worker, tmp_path, "--memory-limit-mb", "300")
    worker.execute_call("t1/spawner", source=SPAWNER, args=marker)
    done = worker.wait_terminal("t1/spawner", timeout=30)
    assert done.message_type == keys.MT_CALL_COMPLETED, done.envelope
    try:
        _wait_for(lambda: len(_processes_with(marker + "1")) == 1, 10, "the setsid sleep")
        _wait_for(lambda: len(_processes_with(marker + "2")) == 1, 10, "the double-forked sleep")
        if ending == "sigterm":
            worker.terminate()
            expected = 0
        elif ending == "disconnect":
            worker.close_socket()
            expected = 1
        else:
            worker.execute_call("t1/hog", source="def _(p):\n    return bytearray(8 << 30)\n")
            expected = EXIT_MEMORY_EXCEEDED
        code, _ = _reap(worker)
        assert code == expected
        _wait_for(
            lambda: not _processes_with(marker + "1") and not _processes_with(marker + "2"),
            10,
            "the executor's descendants to go",
        )
    finally:
        for pid in _processes_with(marker + "1") + _processes_with(marker + "2"):
            os.kill(pid, signal.SIGKILL)


# --- depth bombs -----------------------------------------------------------------------


def test_a_depth_bomb_is_a_protocol_error_not_a_reader_crash(
    start_worker: StartWorker,
) -> None:
    worker = start_worker()
    body = b'{"messageType":"ExecuteCall","callId":"c","payload":' + b"[" * 100_000
    body += b"]" * 100_000 + b"}"
    worker.send_bytes(len(body).to_bytes(4, "big") + body)
    code, _ = _reap(worker)
    assert code == 1  # the transport-lost exit: the connection is closed
    stderr = worker.stderr_text()
    assert "protocol error from the worker" in stderr
    assert "reader crashed" not in stderr


# --- budgets ---------------------------------------------------------------------------

SPIN = """\
import os

def _(flag):
    while not os.path.exists(flag):
        pass
    return "done"
"""


@pytest.mark.parametrize("budget", [10**13, 2**63 + 5])
def test_a_huge_budget_runs_the_call_instead_of_crashing_the_executor(
    start_worker: StartWorker, budget: int
) -> None:
    worker = start_worker()
    worker.execute_call(
        "t1/c", source="def _(p):\n    return sum(range(100000))\n", call_budget_ms=budget
    )
    frame = worker.wait_terminal("t1/c", timeout=30)
    assert frame.message_type == keys.MT_CALL_COMPLETED, frame.envelope
    assert worker.proc.poll() is None  # type: ignore[union-attr]


def test_heartbeats_say_how_long_the_running_call_has_run(
    start_worker: StartWorker, tmp_path: Path
) -> None:
    worker = start_worker()
    flag = str(tmp_path / "flag")
    worker.execute_call("t1/spin", source=SPIN, args=flag, call_budget_ms=60_000)

    def running_long(frame: Any) -> bool:
        payload = frame.envelope[keys.F_PAYLOAD]
        return (
            payload[keys.FP_RUNNING_CALL_ID] == "t1/spin" and payload[keys.FP_RUNNING_FOR_MS] >= 500
        )

    beat = worker.wait_heartbeat(running_long, timeout=30).envelope[keys.F_PAYLOAD]
    assert 0 < beat[keys.FP_RUNNING_CALL_BUDGET_MS] <= 60_000
    Path(flag).touch()
    assert worker.wait_terminal("t1/spin", timeout=30).message_type == keys.MT_CALL_COMPLETED
    idle = worker.wait_heartbeat(
        lambda f: (
            f.envelope[keys.F_PAYLOAD][keys.FP_HEARTBEAT_SEQ] > beat[keys.FP_HEARTBEAT_SEQ]
            and f.envelope[keys.F_PAYLOAD][keys.FP_RUNNING_CALL_ID] is None
        )
    ).envelope[keys.F_PAYLOAD]
    assert idle[keys.FP_RUNNING_FOR_MS] == 0 and idle[keys.FP_RUNNING_CALL_BUDGET_MS] == 0


def test_a_stopped_then_resumed_executor_fails_no_healthy_call(
    start_worker: StartWorker, tmp_path: Path
) -> None:
    """SIGSTOP for longer than the running call's whole budget, then SIGCONT: the
    stopped time is not charged, the call completes."""
    worker = start_worker()
    flag = str(tmp_path / "flag")
    worker.execute_call("t1/spin", source=SPIN, args=flag, call_budget_ms=4000)
    worker.wait_heartbeat(
        lambda f: f.envelope[keys.F_PAYLOAD][keys.FP_RUNNING_CALL_ID] == "t1/spin", timeout=30
    )
    os.kill(worker.pid, signal.SIGSTOP)
    try:
        time.sleep(6.0)
    finally:
        os.kill(worker.pid, signal.SIGCONT)
    time.sleep(0.3)
    Path(flag).touch()
    frame = worker.wait_terminal("t1/spin", timeout=30)
    assert frame.message_type == keys.MT_CALL_COMPLETED, frame.envelope
    assert frame.envelope[keys.F_PAYLOAD][keys.FP_BUDGET_USED_MS] < 4000
