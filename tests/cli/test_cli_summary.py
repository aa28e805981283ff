"""``blockx run``'s summary says what is true: the calls of a stream that stopped early are
the calls read, not the file's; IO latencies come from a clock finer than their values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_support import blockx, write

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def test_a_fast_fail_stream_says_how_much_of_its_calls_file_was_read(tmp_path: Path) -> None:
    write(
        tmp_path / "calls.jsonl",
        "".join(f'{{"function": "f", "args": {i}}}\n' for i in range(50_000)),
    )
    task = write(
        tmp_path / "task.yaml",
        (
            "functions:\n"
            "  f:\n"
            "    source: |\n"
            "      def _(i):\n"
            "          if i == 10:\n"
            "              raise ValueError('boom')\n"
            "          return {'i': i}\n"
            "calls_file: calls.jsonl\n"
        ),
    )
    summary = tmp_path / "summary.json"
    proc = blockx(
        "run",
        task,
        "-n",
        "1",
        "--set",
        "stream_build.batch_max_rows=64",
        "--summary-json",
        summary,
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stderr
    data = json.loads(summary.read_text())
    read = data["calls"]
    assert data["calls_in_file"] == 50_000 and read < 50_000
    err = proc.stderr
    # the count is of the calls read, and says so: not "N calls" as if the file held N
    assert f"FAILED — {read:,} of 50,000 calls in" in err
    assert (
        f"stream    stopped after {read:,} calls read; the rest of calls.jsonl "
        f"({50_000 - read:,} calls) was not read"
    ) in err
    assert f"; {50_000 - read:,} calls of calls.jsonl not read" in err  # the failure report


def test_io_latencies_are_measured_below_the_millisecond(tmp_path: Path) -> None:
    task = write(
        tmp_path / "task.yaml",
        (
            "functions:\n"
            "  f:\n"
            "    source: |\n"
            "      def _(i):\n"
            "          Table('t').upsert_row({'key': str(i), 'v': i})\n"
            "          return Table('t').get_row(str(i))\n"
            "calls:\n"
            + "".join(f"  - {{function: f, args: {i}}}\n" for i in range(40))
            + "io: {data_dir: .data}\n"
        ),
    )
    summary = tmp_path / "summary.json"
    proc = blockx("run", task, "-n", "1", "--summary-json", summary, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    operations = json.loads(summary.read_text())["io"]["operations"]
    assert {op["operation"] for op in operations} >= {"get_row", "upsert_rows"}
    # A clock of whole milliseconds (uvloop's loop.time()) makes every latency, and so
    # every total, a whole number of ms; table calls take fractions of one.
    totals = [op["total_ms"] for op in operations]
    assert any(abs(total - round(total)) >= 0.001 for total in totals), totals
