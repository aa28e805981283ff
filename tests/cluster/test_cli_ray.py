"""``blockx run --ray`` through the real CLI, in a subprocess (issue #21): ``--ray auto``
starts a local Ray instance and writes the rows and the summary as ``blockx run`` does
(plus ``"nodes"``); SQLite + ``Table`` is refused before anything runs (exit 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from blockx.cluster.tables import functions_using_table, uses_table

SRC = Path(__file__).resolve().parents[2] / "src"

TASK = """\
functions:
  double:
    source: |
      def double(p):
          return {"i": p["i"], "y": 2 * function.call("ident", p["i"])}
  ident:
    source: |
      def ident(x):
          return x
calls_file: calls.jsonl
policy: {failure: continue}
"""

TABLE_TASK = """\
functions:
  plain:
    source: |
      def plain(x):
          return x
  writer:
    source: |
      def writer(p):
          Table("t").upsert_row({"key": p["i"]})
calls:
  - {function: writer, args: {i: 1}}
"""


def _blockx(args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("RAY_ADDRESS", None)
    return subprocess.run(
        [sys.executable, "-m", "blockx", "run", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_uses_table_reads_the_syntax_tree() -> None:
    assert uses_table("def f():\n    return Table('t').get_row(1)\n")
    assert uses_table("from blockx.db import Table\ndef f():\n    pass\n")
    assert uses_table("import blockx.db as db\ndef f():\n    return db.Table('t')\n")
    assert not uses_table("def f(x):\n    return {'Table': x}\n")  # a string is no use
    assert not uses_table("def f(:\n")
    assert functions_using_table({"b": "Table", "a": "x = 1", "c": "Table"}) == ["b", "c"]


@pytest.mark.slow
def test_sqlite_and_table_are_refused_in_cluster_mode(tmp_path: Path) -> None:
    pytest.importorskip("ray", reason="ray is not installed: pip install 'blockx[ray]'")
    (tmp_path / "task.yaml").write_text(TABLE_TASK)
    done = _blockx(
        ["task.yaml", "--ray", "auto", "-o", "out.jsonl", "--set", "io.blockdb.engine=sqlite"],
        tmp_path,
    )
    assert done.returncode == 2, done.stderr
    assert "'writer'" in done.stderr and "'plain'" not in done.stderr
    assert "io.blockdb.engine: postgres" in done.stderr
    assert "postgres_dsn" in done.stderr
    assert not (tmp_path / "out.jsonl").exists() or (tmp_path / "out.jsonl").read_text() == ""
    # Nothing ran: no Ray instance was started for it.
    assert "Started a local Ray instance" not in done.stderr


@pytest.mark.slow
def test_ray_auto_runs_the_task_through_the_cli(tmp_path: Path) -> None:
    pytest.importorskip("ray", reason="ray is not installed: pip install 'blockx[ray]'")
    (tmp_path / "task.yaml").write_text(TASK)
    with open(tmp_path / "calls.jsonl", "w") as f:
        for i in range(2000):
            f.write(json.dumps({"function": "double", "args": {"i": i}}) + "\n")
    done = _blockx(
        [
            "task.yaml",
            "--ray",
            "auto",
            "--executors-per-node",
            "2",
            "-o",
            "out.jsonl",
            "--summary-json",
            "summary.json",
        ],
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert sorted(r["i"] for r in rows) == list(range(2000))
    assert all(r["y"] == 2 * r["i"] for r in rows)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["exit_code"] == 0 and summary["calls"] == 2000
    assert summary["succeeded"] == 2000 and summary["output_rows"] == 2000
    assert summary["subcalls"] == 2000
    assert summary["node_lost"] == 0
    (node,) = summary["nodes"].values()
    assert node["calls"] == 2000 and node["executors"] == 2 and node["batches"] >= 1
    assert "1 Ray node" in done.stderr
    # Ray's own start-up chatter is kept off the CLI's stderr.
    assert "authentication" not in done.stderr.lower()
