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


def test_without_ray_the_option_exits_2_with_the_install_hint(tmp_path: Path) -> None:
    (tmp_path / "task.yaml").write_text(TASK)
    (tmp_path / "calls.jsonl").write_text('{"function": "double", "args": {"i": 1}}\n')
    env = dict(os.environ)
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    code = (
        "import sys; sys.modules['ray'] = None\n"  # import ray raises ImportError
        "from blockx.cli import main\n"
        "sys.exit(main(['run', 'task.yaml', '--ray', 'auto']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 2, done.stderr
    assert "pip install 'blockx[ray]'" in done.stderr
    assert done.stdout == ""


SLOW_TASK = """\
functions:
  slow:
    source: |
      import time
      def slow(i):
          time.sleep(0.05)
          return {"i": i}
calls_file: calls.jsonl
policy: {failure: continue}
"""


@pytest.mark.slow
def test_sigint_cancels_a_cluster_run_like_a_local_one(tmp_path: Path) -> None:
    import signal
    import time

    pytest.importorskip("ray", reason="ray is not installed: pip install 'blockx[ray]'")
    (tmp_path / "task.yaml").write_text(SLOW_TASK)
    with open(tmp_path / "calls.jsonl", "w") as f:
        for i in range(200_000):
            f.write(json.dumps({"function": "slow", "args": i}) + "\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "blockx", "run", "task.yaml", "--ray", "auto"),
            *("-o", "out.jsonl", "--summary-json", "summary.json"),
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out = tmp_path / "out.jsonl"
        deadline = time.monotonic() + 240  # a generous bound on a wait, not on the code
        while not (out.exists() and out.stat().st_size > 0):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no row came"
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows and len({r["i"] for r in rows}) == len(rows)  # none twice
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["interrupted"] == "SIGINT" and summary["failure"] == "CANCELLED"
    assert summary["calls"] < 200_000


def test_table_is_refused_on_sqlite_only(tmp_path: Path) -> None:
    """The refusal's rule without a run: Table + SQLite refused (auto without a DSN is
    SQLite), Table + PostgreSQL accepted, no Table accepted on SQLite."""
    from blockx.cli.run_cluster import table_problem
    from blockx.cli.run_input import Checked
    from blockx.cli.settings import load_task_and_settings

    (tmp_path / "table.yaml").write_text(TABLE_TASK)
    (tmp_path / "plain.yaml").write_text(TASK)
    (tmp_path / "calls.jsonl").write_text('{"function": "double", "args": {"i": 1}}\n')

    def problem(task: str, *sets: str) -> str | None:
        spec, total, settings = load_task_and_settings(str(tmp_path / task), sets=sets)
        return table_problem(Checked(spec, total, settings, sink=None))  # type: ignore[arg-type]

    assert problem("table.yaml") is not None
    assert problem("table.yaml", "io.blockdb.engine=sqlite") is not None
    dsn = "io.blockdb.postgres_dsn=postgresql://u@127.0.0.1:5/db"
    assert problem("table.yaml", "io.blockdb.engine=postgres", dsn) is None
    assert problem("table.yaml", dsn) is None  # auto with a DSN: PostgreSQL
    assert problem("plain.yaml", "io.blockdb.engine=sqlite") is None


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--ray", "auto"], "pip install 'blockx[ray]'"),
        (["--executors-per-node", "2"], "--executors-per-node N: a positive integer, with --ray"),
    ],
)
def test_serve_ray_refuses_to_start_without_ray_or_with_a_lone_option(
    tmp_path: Path, args: list[str], said: str
) -> None:
    """``blockx serve --ray`` without Ray installed, or ``--executors-per-node`` without
    ``--ray``: exit 2 before anything starts, saying why."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    code = (
        "import sys; sys.modules['ray'] = None\n"  # import ray raises ImportError
        "from blockx.cli import main\n"
        f"sys.exit(main(['serve', '--port', '0', '--data-dir', 'data', *{args!r}]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 2, done.stderr
    assert said in done.stderr
    assert "listening" not in done.stderr
