"""Shared helpers of the sandbox tests: the skip rule, a recording sandbox spawner,
worker sessions in either spawn mode (reusing the worker e2e helpers)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

# The worker end-to-end helpers live beside the worker e2e tests.
_E2E_DIR = str(Path(__file__).resolve().parents[1] / "worker" / "e2e")
if _E2E_DIR not in sys.path:
    sys.path.insert(0, _E2E_DIR)

from e2e_support import (  # noqa: E402
    SLEEPER,
    WEDGE_KNOBS,
    RecordingSpawner,
    WorkerSession,
    e2e_config,
    wedge_is_killed,
)

from blockx.worker.pool.sandbox import (  # noqa: E402
    SandboxSettings,
    SandboxSpawner,
    sandbox_available,
)
from blockx.worker.pool.spawner import ExecutorLaunchSpec  # noqa: E402

__all__ = [
    "SANDBOX_OK",
    "SANDBOX_REASON",
    "SLEEPER",
    "SPAWN_MODES",
    "WEDGE_KNOBS",
    "RecordingSandboxSpawner",
    "WorkerSession",
    "e2e_config",
    "needs_sandbox",
    "processes_mentioning",
    "session_for",
    "wedge_is_killed",
]

SANDBOX_OK, SANDBOX_REASON = sandbox_available()

#: Skips a test where bubblewrap or user namespaces are unavailable, saying why.
needs_sandbox = pytest.mark.skipif(
    not SANDBOX_OK, reason=f"sandbox spawn mode unavailable: {SANDBOX_REASON}"
)

#: Both spawn modes, the sandbox one skipped (with the reason) where it cannot run.
SPAWN_MODES = [
    pytest.param("process", id="process"),
    pytest.param("sandbox", id="sandbox", marks=needs_sandbox),
]


class RecordingSandboxSpawner(SandboxSpawner):
    """The sandbox spawner, remembering every pid it started (for the orphan check)."""

    def __init__(self, settings: SandboxSettings | None = None, **kwargs: Any) -> None:
        super().__init__(settings, **kwargs)
        self.pids: list[int] = []

    def spawn(self, spec: ExecutorLaunchSpec) -> subprocess.Popen[bytes]:
        process = super().spawn(spec)
        self.pids.append(process.pid)
        return process


def session_for(mode: str, **overrides: Any) -> WorkerSession:
    """A (not yet started) worker session in ``mode`` with the e2e knobs and ``overrides``."""
    config = e2e_config(**{"pool.spawn_mode": mode, **overrides})
    if mode == "sandbox":
        spawner: Any = RecordingSandboxSpawner(SandboxSettings.from_pool(config.pool))
    else:
        spawner = RecordingSpawner()
    return WorkerSession(config, spawner=spawner)


def processes_mentioning(text: str) -> list[int]:
    """Pids whose command line contains ``text`` (the sandboxed pythons included: they
    are in another pid namespace, but the host sees them)."""
    needle = text.encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if needle in f.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


def cgroup_dirs_left(spawner: SandboxSpawner) -> list[str]:
    """The spawner's cgroup directories that still exist (none after the pool stopped)."""
    plan = spawner.plan
    if plan is None or plan.cgroups is None:
        return []
    return [base for base in plan.cgroups.bases.values() if os.path.exists(base)]
