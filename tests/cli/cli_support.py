"""Helpers of the CLI tests: run ``python -m blockx`` as a user does, in a clean environment."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

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
