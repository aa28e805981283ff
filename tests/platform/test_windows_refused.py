"""Windows is refused at start with a clear message (issue #22, item 5): the worker's
start, ``blockx run``/``serve`` and the executor process. Windows cannot be run here:
``sys.platform`` is set to ``win32`` in the process under test, after its imports."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from blockx.portability import (
    SUPPORTED_PLATFORMS,
    UnsupportedPlatformError,
    check_platform,
    platform_problem,
)

MESSAGE = "BlockX does not run on Windows"


@pytest.mark.parametrize("platform", ["win32", "cygwin", "msys"])
def test_windows_is_named_and_refused(platform: str) -> None:
    problem = platform_problem(platform)
    assert problem is not None and MESSAGE in problem
    assert "Linux and macOS" in problem and "WSL" in problem
    with pytest.raises(UnsupportedPlatformError, match=MESSAGE):
        check_platform(platform)


@pytest.mark.parametrize("platform", ["linux", "darwin", *SUPPORTED_PLATFORMS])
def test_linux_and_macos_are_accepted(platform: str) -> None:
    assert platform_problem(platform) is None
    check_platform(platform)


def _as_windows(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=cwd
    )


def test_blockx_run_is_refused_with_a_clear_message(tmp_path: Path) -> None:
    (tmp_path / "task.yaml").write_text(
        "functions: {f: {source: 'def f():\\n    return 1\\n'}}\ncalls: [{function: f}]\n"
    )
    proc = _as_windows(
        "import asyncio, sys, blockx.cli as cli  # asyncio: loaded as on Linux\n"
        "sys.platform = 'win32'\n"
        "sys.exit(cli.main(['run', 'task.yaml']))\n",
        tmp_path,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"blockx: error: {MESSAGE}"), proc.stderr
    assert proc.stdout == ""


def test_the_executor_process_is_refused(tmp_path: Path) -> None:
    proc = _as_windows(
        "import sys, blockx.executor.__main__ as m\n"
        "sys.platform = 'win32'\n"
        "sys.exit(m.main(['--socket', 'x', '--executor-id', 'e1']))\n",
        tmp_path,
    )
    assert proc.returncode == 4, proc.stderr  # EXIT_STARTUP_FAILED
    assert f"blockx executor: start-up refused: {MESSAGE}" in proc.stderr


def test_worker_start_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from blockx.worker.app import Worker

    worker = Worker()

    async def start() -> None:
        monkeypatch.setattr(sys, "platform", "win32")
        try:
            await worker.start()
        finally:
            monkeypatch.undo()

    with pytest.raises(UnsupportedPlatformError, match=MESSAGE):
        asyncio.run(start())
