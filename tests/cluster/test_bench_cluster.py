"""``bench/cluster.py`` runs end to end at a tiny size (issue #21): exit 0 and its lines
printed. No figure is looked at (the machine is shared)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_the_cluster_bench_runs_at_a_tiny_size() -> None:
    pytest.importorskip("ray", reason="ray is not installed: pip install 'blockx[ray]'")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH")) if p)
    env.pop("RAY_ADDRESS", None)
    argv = ["--calls", "300", "--io-calls", "200", "--repeats", "1", "--nodes", "2"]
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "cluster.py"), *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "part 1: 300 trivial calls, 1 executors: --ray/local = " in out
    assert "part 2: 1 node(s): " in out and "part 2: 2 node(s): " in out
    assert "calls per actor method call" in out
    # Each run's CPU by process kind (the figures themselves are not looked at).
    assert "local  CPU s for 300 calls (start-up included): " in out and "executors " in out
    assert "--ray  CPU s for 300 calls (start-up included): " in out and "node actor " in out
