"""The pytest plugin (``blockx_function``) and the quickstart's tests, run by pytest.

``pytest examples/quickstart/tests`` in a subprocess must pass (the issue's
proof). The plugin is loaded through its pytest11 entry point when BlockX is
installed with it; a checkout whose installed metadata predates the entry point
gets it with ``-p`` (the same module).
"""

from __future__ import annotations

import importlib.metadata
import os
import pathlib
import subprocess
import sys
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PLUGIN = "blockx.testing.pytest_plugin"


def _entry_point_installed() -> bool:
    return any(ep.value == PLUGIN for ep in importlib.metadata.entry_points(group="pytest11"))


def _pytest(*args: str, cwd: pathlib.Path) -> subprocess.CompletedProcess[str]:
    plugin = [] if _entry_point_installed() else ["-p", PLUGIN]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *plugin, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_entry_point_is_declared():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["entry-points"]["pytest11"] == {"blockx": PLUGIN}


@pytest.mark.slow
def test_the_quickstart_example_tests_pass_under_pytest():
    done = _pytest("examples/quickstart/tests", cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert " passed" in done.stdout and "failed" not in done.stdout


@pytest.mark.slow
def test_the_fixture_finds_files_next_to_the_test_and_failures_are_reported(tmp_path):
    (tmp_path / "functions").mkdir()
    (tmp_path / "functions" / "double.py").write_text("def _(x):\n    return 2 * x\n")
    (tmp_path / "test_user.py").write_text(
        "def test_ok(blockx_function):\n"
        "    assert blockx_function('functions/double.py')(21) == 42\n"
        "def test_wrong(blockx_function):\n"
        "    assert blockx_function('functions/double.py')(1) == 3\n"
    )
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    done = _pytest("test_user.py", cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 failed, 1 passed" in done.stdout
