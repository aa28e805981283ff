"""How the ``blockx`` command's process ends (``blockx.cli._leave``): without the
interpreter's finalization, but with everything the interpreter's exit does before it --
non-daemon threads waited for, exit handlers run, the standard streams flushed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.cli.cli_support import clean_env

SRC = Path(__file__).resolve().parents[2] / "src"


def _leave(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    script = (
        "import atexit, sys, threading, time\n"
        "from pathlib import Path\n"
        "from blockx.cli import _leave\n"
        f"out = Path({str(tmp_path)!r})\n" + body
    )
    env = clean_env(PYTHONPATH=str(SRC))
    env.pop("PYTHONUNBUFFERED")  # stdout buffered, as a pipe's is
    return subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_status_exit_handlers_and_buffered_output_survive(tmp_path: Path) -> None:
    done = _leave(
        tmp_path,
        "atexit.register(lambda: (out / 'handler').write_text('ran'))\n"
        "sys.stdout.write('no newline, still buffered')\n"
        "sys.stderr.write('to stderr')\n"
        "_leave(3)\n",
    )
    assert done.returncode == 3
    assert (tmp_path / "handler").read_text() == "ran"
    assert done.stdout == "no newline, still buffered"
    assert done.stderr == "to stderr"


def test_a_non_daemon_thread_still_running_is_waited_for(tmp_path: Path) -> None:
    done = _leave(
        tmp_path,
        "def late():\n"
        "    time.sleep(0.3)\n"
        "    (out / 'thread').write_text('done')\n"
        "threading.Thread(target=late).start()\n"
        "_leave(0)\n",
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "thread").read_text() == "done"


def test_a_profiler_watching_the_command_gets_its_figures(tmp_path: Path) -> None:
    # cProfile writes its file after the program returns: not after an os._exit.
    figures = tmp_path / "profile.out"
    env = clean_env(PYTHONPATH=str(SRC))
    done = subprocess.run(
        [sys.executable, "-m", "cProfile", "-o", str(figures), "-m", "blockx", "config"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "executor_count" in done.stdout
    assert figures.stat().st_size > 0


def test_the_commands_start_gc_threshold_is_the_workers() -> None:
    # blockx.cli cannot import blockx.worker.loop (asyncio) for the value: kept equal here.
    from blockx.cli import _START_GC_GEN0_THRESHOLD
    from blockx.worker.loop import GC_GEN0_THRESHOLD

    assert _START_GC_GEN0_THRESHOLD == GC_GEN0_THRESHOLD
