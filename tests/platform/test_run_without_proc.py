"""A whole ``blockx run`` where there is no ``/proc`` (issue #22, item 5).

The run is started inside bubblewrap with an empty tmpfs over ``/proc`` (everything else
as it is), which is the executors' and the worker's view on a system without a Linux
process table, like macOS: executors used to refuse to start (exit 4, no
``/proc/self/statm``). Now memory comes from psutil, else ``getrusage``, and the pool's
scans find nothing rather than fail. psutil itself needs ``/proc`` on Linux, so here the
``getrusage`` path is the one that runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import blockx

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]


def _bwrap_without_proc() -> list[str]:
    bwrap = shutil.which("bwrap")
    if bwrap is None or not sys.platform.startswith("linux"):
        pytest.skip("needs bubblewrap (make system-deps installs it) on Linux")
    argv = [bwrap, "--dev-bind", "/", "/", "--tmpfs", "/proc"]
    probe = subprocess.run(
        [*argv, "/bin/sh", "-c", "test ! -e /proc/self/statm"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    if probe.returncode != 0:
        pytest.skip(f"bubblewrap cannot hide /proc here: {probe.stderr.decode()[:200]}")
    return argv


def test_quickstart_runs_with_no_proc(tmp_path: Path) -> None:
    argv = _bwrap_without_proc()
    shutil.copytree(ROOT / "examples" / "quickstart", tmp_path / "quickstart")
    task = tmp_path / "quickstart" / "task.yaml"
    # The example keeps its table store beside the examples: here, in tmp_path.
    # The blockx under test (a worktree's sources come first), as the executors inherit it.
    env = {**os.environ, "PYTHONPATH": str(Path(blockx.__file__).resolve().parents[1])}
    proc = subprocess.run(
        [*argv, sys.executable, "-m", "blockx", "run", "-v", str(task)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(proc.stdout.splitlines()) == 5, proc.stdout
    assert "process memory read from getrusage" in proc.stderr, proc.stderr[-3000:]
    assert "exited with status 4" not in proc.stderr
