"""``make demo`` on a fresh clone is not silent while the compiled build runs (issue 16,
item 10): the Makefile's build rule says what it does and how long it took. Run on a copy
of the Makefile with a stand-in for the venv's python (``true`` / ``false``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from cli_support import REPO

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(shutil.which("make") is None, reason="no make"),
]

STAMP = "src/blockx/_native_build.json"


def _fresh(tmp_path: Path) -> Path:
    shutil.copy(REPO / "Makefile", tmp_path / "Makefile")
    (tmp_path / "pyproject.toml").touch()
    (tmp_path / "setup.py").touch()
    (tmp_path / ".venv").mkdir()
    installed = tmp_path / ".venv" / ".blockx-installed"
    installed.touch()
    later = time.time() + 5
    os.utime(installed, (later, later))  # the venv is newer than pyproject.toml
    return tmp_path


def _make(cwd: Path, python: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "BLOCKX_PURE_PYTHON"}
    environ.update(env)
    return subprocess.run(
        ["make", "--no-print-directory", STAMP, f"PY={python}"],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        check=False,
    )


def test_the_build_says_what_it_does_first_and_how_long_it_took(tmp_path: Path) -> None:
    proc = _make(_fresh(tmp_path), "true")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == (
        "compiling the hot paths with mypyc, ~8 min on 2 cores; BLOCKX_PURE_PYTHON=1 skips it"
    )
    assert lines[-1].startswith("build done in ") and lines[-1].endswith(" s")


def test_the_pure_python_install_says_so(tmp_path: Path) -> None:
    proc = _make(_fresh(tmp_path), "true", BLOCKX_PURE_PYTHON="1")
    assert proc.returncode == 0, proc.stderr
    assert "installing without the compiled build (BLOCKX_PURE_PYTHON=1)" in proc.stdout


def test_a_failed_build_fails_make(tmp_path: Path) -> None:
    proc = _make(_fresh(tmp_path), "false")
    assert proc.returncode != 0
    assert "build done" not in proc.stdout


def test_demo_and_test_go_through_the_build() -> None:
    text = (REPO / "Makefile").read_text()
    assert "demo: setup" in text and "test: setup" in text
    assert "setup: $(STAMP) $(NATIVE_STAMP)" in text
