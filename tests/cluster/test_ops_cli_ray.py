"""``blockx run --ray`` watched as a local run is (issue #21, leftover 4), through the
real CLI in a subprocess joining a simulated cluster: ``--progress`` draws the progress
line, ``--metrics-port`` answers ``/metrics`` during the run with the nodes' series
(the local names), ``--trace-file`` gets the driver's ``task`` and ``node`` spans --
and none of them is "ignored" any more."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray", reason="ray is not installed: pip install 'blockx[ray]'")

from prometheus_client.parser import text_string_to_metric_families
from tests.cli.cli_support import clean_env
from tests.cluster.conftest import SimCluster
from tests.serve.server import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

SRC = Path(__file__).resolve().parents[2] / "src"
CALLS = 300  # 100 of them wait at the gate: never enough to fill the executors
GATE_AT = 200


def _task(gate: Path) -> str:
    return (
        "functions:\n"
        "  g:\n"
        "    source: |\n"
        "      import os, time\n"
        "      def g(i):\n"
        f"          if i >= {GATE_AT}:\n"
        f"              while not os.path.exists({str(gate)!r}):\n"
        "                  time.sleep(0.2)\n"
        "          return {'i': i}\n"
        "calls_file: calls.jsonl\n"
        "task_id: watched\n"
        # The gated calls wait until this test has seen the first GATE_AT end, and their
        # sleeps count against the call budget: the default 5 s ran out on a loaded CI
        # machine (64 of 600 calls done after 19 s), failing the run (fast_fail). They
        # poll every 0.2 s: each sleep is a round trip through the node's worker, and
        # 0.01 s polls of hundreds of waiting calls loaded the machine further.
        "policy:\n"
        "  call_budget_ms: 600000\n"
    )


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as reply:
        text = reply.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _root_succeeded(metrics: dict[Any, float]) -> float:
    return metrics.get(("blockx_calls_total", (("kind", "root"), ("outcome", "succeeded"))), -1)


def test_progress_metrics_and_trace_file_under_ray(cluster2: SimCluster, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    (tmp_path / "task.yaml").write_text(_task(gate))
    (tmp_path / "calls.jsonl").write_text(
        "".join(json.dumps({"function": "g", "args": i}) + "\n" for i in range(CALLS))
    )
    env = clean_env(COLUMNS="200", PYTHONPATH=str(SRC))
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "blockx",
            "run",
            "task.yaml",
            "--ray",
            cluster2.address,
            "--executors-per-node",
            "2",
            "-o",
            "out.jsonl",
            "--progress",
            "--metrics-port",
            "0",
            "--trace-file",
            "trace.jsonl",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr or ()), daemon=True)
    reader.start()

    def exited() -> None:
        if proc.poll() is not None:
            raise AssertionError(f"blockx run ended ({proc.returncode}):\n{''.join(lines)}")

    try:
        found = wait_for(
            lambda: (
                exited()
                or next(
                    (
                        m
                        for line in list(lines)
                        if (m := re.search(r"metrics at http://127\.0\.0\.1:(\d+)/metrics", line))
                    ),
                    None,
                )
            ),
            180,
            "the metrics address",
        )
        port = int(found.group(1))

        last: list[dict[Any, float]] = [{}]

        def scrape() -> dict[Any, float] | None:
            try:
                last[0] = _scrape(port)
                return last[0]
            except OSError:  # URLError too: the endpoint is not there (any more)
                exited()  # the run ended: its stderr says why
                return None

        def running(m: dict[Any, float]) -> bool:
            # the run's driver still running: once it ends, exited() says why
            return m.get(("blockx_tasks", (("state", "running"),))) == 1

        # During the run (the calls from GATE_AT on wait at the gate): the nodes' series.
        try:
            during = wait_for(
                lambda: (
                    exited()
                    or ((m := scrape()) and _root_succeeded(m) >= GATE_AT and running(m) and m)
                ),
                180,
                "the calls before the gate in /metrics",
            )
        except AssertionError as timed_out:  # what the run showed: its last scrape, stderr
            shown = {k: v for k, v in last[0].items() if k[0].startswith("blockx_")}
            raise AssertionError(
                f"{timed_out}\nlast scrape: {shown}\nstderr: {''.join(lines)[-4000:]}"
            ) from None
        assert _root_succeeded(during) < CALLS
        assert during[("blockx_cluster_nodes", ())] == 2
        assert during[("blockx_executors", (("state", "running"),))] == 4
        assert during[("blockx_tasks", (("state", "running"),))] == 1
        assert during[("blockx_cluster_batches_total", ())] > 0
        gate.touch()
        returncode = proc.wait(timeout=240)
        reader.join(5)
        assert returncode == 0, "".join(lines)[-4000:]  # its stderr: why the run failed
    finally:
        gate.touch()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(10)
    err = "".join(lines)
    assert "ignored" not in err and "not supported" not in err, err
    # the progress line, forced on (text mode turned its \r into \n)
    assert re.search(r"\d calls/s  retries \d+  failed \d+[^\n]*  2 nodes\x1b\[K", err), err
    assert re.search(rf"\d+/{CALLS}  ", err), err  # its total, from the calls file
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["i"] for r in rows] == list(range(CALLS))

    spans = [json.loads(line) for line in (tmp_path / "trace.jsonl").read_text().splitlines()]
    tasks = [s for s in spans if s["name"] == "task"]
    nodes = [s for s in spans if s["name"] == "node"]
    assert len(tasks) == 1 and len(nodes) == 2, spans
    task = tasks[0]
    assert task["parent_span_id"] is None and task["attributes"]["blockx.task_id"] == "watched"
    assert task["attributes"]["blockx.outcome"] == "succeeded"
    assert task["attributes"]["blockx.calls"] == CALLS
    assert all(
        n["trace_id"] == task["trace_id"] and n["parent_span_id"] == task["span_id"] for n in nodes
    )
    assert sum(n["attributes"]["blockx.calls"] for n in nodes) == CALLS
    assert all(n["start_ns"] <= n["end_ns"] <= task["end_ns"] for n in nodes)
