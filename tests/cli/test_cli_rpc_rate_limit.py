"""``blockx run`` against a node that rate-limits: ``io.rpc.max_requests_per_s`` set with
``--set``, a 429 with ``Retry-After`` honoured, and the summary counting what was throttled."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from cli_support import blockx, jsonl, write

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def test_the_summary_counts_throttled_reads(tmp_path: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "io"))
    from jsonrpc_node import ALICE, FakeNode, balance

    node = FakeNode().start()
    node.faults = ["429:1"]
    try:
        task = write(
            tmp_path / "task.yaml",
            (
                "functions:\n"
                "  wei:\n"
                "    source: |\n"
                "      def _(p):\n"
                "          return {'i': p['i'], 'wei': ChainState('eth', p['block'])"
                ".get_address_balance(p['a'])}\n"
                "calls:\n"
                + "".join(
                    f"  - {{function: wei, args: {{i: {i}, a: '{ALICE}', block: {100 + i}}}}}\n"
                    for i in range(6)
                )
            ),
        )
        summary = tmp_path / "summary.json"
        proc = blockx(
            "run",
            task,
            "-n",
            "1",
            "--summary-json",
            summary,
            "--set",
            f"io.rpc.endpoints=eth={node.url}",
            "--set",
            "io.rpc.max_requests_per_s=eth=10",
            "--set",
            "io.rpc.backoff_base_ms=1",
        )
        arrivals = sorted(node.arrivals)
    finally:
        node.stop()
    assert proc.returncode == 0, proc.stderr
    rows = sorted(jsonl(proc.stdout), key=lambda r: r["i"])
    assert [r["wei"] for r in rows] == [balance(ALICE, 100 + i) for i in range(6)]
    assert max(n for _, n in arrivals) == 1  # batches cut to the burst of 10/s: one request
    assert arrivals[1][0] - arrivals[0][0] >= 1.0 - 0.005  # Retry-After: 1
    totals = json.loads(summary.read_text())["io"]["totals"]
    assert totals["throttled"] >= 1
    assert f"{totals['throttled']} throttled" in proc.stderr
    assert "throttled" in proc.stderr.split("backend/operation", 1)[1].splitlines()[0]
