"""The pool's process scans where ``/proc`` is missing (macOS; issue #22, item 5).

``process_tree.PROC_ROOT`` is pointed at a directory that is no process table, so every
reading goes through psutil -- against real processes: a marked child that starts a
grandchild in a session of its own, found as descendants, by its mark, and killed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from blockx.worker.pool import process_tree

psutil = pytest.importorskip("psutil", reason="psutil is in the test extra")

#: A child carrying a mark that starts a grandchild in its own session, prints its pid.
CHILD = """
import shutil, subprocess, sys, time
g = subprocess.Popen([shutil.which("sleep"), "300"], start_new_session=True)
print(g.pid, flush=True)
time.sleep(300)
"""


def _wait(condition: Callable[[], bool], timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


Child = tuple["subprocess.Popen[str]", int, str]


@pytest.fixture
def marked_child() -> Iterator[Child]:
    mark = f"{process_tree.worker_mark_prefix()}e1:0"
    env = {**os.environ, process_tree.MARK_ENV: mark}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True, env=env
    )
    assert child.stdout is not None
    grandchild = int(child.stdout.readline())
    try:
        yield child, grandchild, mark
    finally:
        for pid in (grandchild, child.pid):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        child.wait(60)


@pytest.fixture
def no_proc(marked_child: Child, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Child:
    """``marked_child``, then ``/proc`` pointed away. In that order: the mark must carry
    the real start time, or another pool on this machine (reading ``/proc``) would take
    the child for an orphan and kill it."""
    monkeypatch.setattr(process_tree, "PROC_ROOT", str(tmp_path / "no-proc"))
    return marked_child


def test_start_time_and_ancestry_from_psutil(no_proc: Child) -> None:
    child, grandchild, _mark = no_proc
    me = os.getpid()
    start = process_tree.process_start_time(child.pid)
    assert start is not None and start == process_tree.process_start_time(child.pid)
    assert start == int(psutil.Process(child.pid).create_time() * 1000)  # not clock ticks
    assert process_tree.worker_mark_prefix(me, "tok").startswith(f"{me}:")
    assert process_tree.descends_from(grandchild, me)
    assert process_tree.descends_from(child.pid, me)
    assert not process_tree.descends_from(me, child.pid)
    assert process_tree.process_start_time(2**22 + 12345) is None


def test_descendants_and_marks_from_psutil(no_proc: Child) -> None:
    child, grandchild, mark = no_proc
    found = process_tree.descendants(os.getpid())
    assert child.pid in found and grandchild in found
    killed = process_tree.kill_marked(mark)
    assert sorted(killed) == sorted([child.pid, grandchild])
    assert _wait(lambda: _gone(grandchild))
    child.wait(60)


def test_without_proc_or_psutil_the_scans_find_nothing(
    no_proc: Child, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(process_tree, "load_psutil", lambda: None)
    child, _grandchild, mark = no_proc
    assert process_tree.descendants(os.getpid()) == []
    assert process_tree.kill_marked(mark) == []
    assert process_tree.process_start_time(child.pid) is None
    assert shutil.which("sleep")
