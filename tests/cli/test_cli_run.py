"""``blockx run`` as a user runs it: the examples, outputs, exit codes, the failure report."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from cli_support import EXAMPLES, blockx, copy_example, jsonl, without_stalls, write

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

QUICKSTART_ROWS = [
    {
        "wallet": "alice",
        "usd": 9075.62,
        "tokens": [
            {"token": "ETH", "amount": 2.5, "usd": 7875.62},
            {"token": "USDC", "amount": 1200, "usd": 1200.0},
        ],
    },
    {
        "wallet": "bob",
        "usd": 9571.25,
        "tokens": [
            {"token": "BTC", "amount": 0.1, "usd": 6421.0},
            {"token": "ETH", "amount": 1, "usd": 3150.25},
        ],
    },
    {
        "wallet": "carol",
        "usd": 5994.0,
        "tokens": [
            {"token": "SOL", "amount": 40, "usd": 5944.0},
            {"token": "USDC", "amount": 50, "usd": 50.0},
        ],
    },
    {
        "wallet": "dave",
        "usd": 2517.56,
        "tokens": [
            {"token": "BTC", "amount": 0.02, "usd": 1284.2},
            {"token": "ETH", "amount": 0.25, "usd": 787.56},
            {"token": "SOL", "amount": 3, "usd": 445.8},
        ],
    },
    {"wallet": "erin", "usd": 0.0, "tokens": []},
]


def test_the_quickstart_writes_its_rows_as_jsonl_and_a_summary(tmp_path: Path) -> None:
    task = copy_example("quickstart", tmp_path)
    proc = blockx("run", task, "--executors", "2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert jsonl(proc.stdout) == QUICKSTART_ROWS  # stdout is nothing but the rows
    err = proc.stderr
    assert "task quickstart: ok — 5 calls in" in err
    assert "9 sub-calls" in err
    # nine price sub-calls for four tokens: five answered without running again, from the
    # call cache or by joining a flight (which of the two depends on the timing)
    found = re.search(r"(\d+) call-cache hits, (\d+) singleflight joins", err)
    assert found is not None, err
    assert int(found.group(1)) + int(found.group(2)) == 5, found.group(0)
    assert "blockdb/get_row" in err and "blockdb/upsert_rows" in err
    assert "outputs   5 rows → stdout" in err
    assert "\r" not in err  # no progress line: stderr is not a terminal
    # the table store is where the task file says (next to the example), and a second
    # run reads the prices from it instead of "asking the API"
    assert (tmp_path / ".data" / "quickstart.sqlite3").is_file()
    again = blockx("run", task, "-n", "2", "--summary-json", tmp_path / "s.json", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert jsonl(again.stdout) == QUICKSTART_ROWS
    summary = json.loads((tmp_path / "s.json").read_text())
    ops = {(o["backend"], o["operation"]): o for o in summary["io"]["operations"]}
    assert ops[("blockdb", "upsert_rows")]["requests"] == 5  # wallets only: prices were there


def test_dash_o_writes_the_rows_to_a_file(tmp_path: Path) -> None:
    task = copy_example("quickstart", tmp_path)
    out = tmp_path / "rows.jsonl"
    proc = blockx("run", task, "-o", out, "-n", "2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    assert jsonl(out.read_text()) == QUICKSTART_ROWS
    assert f"5 rows → {out}" in proc.stderr


def test_quiet_prints_no_summary(tmp_path: Path) -> None:
    task = copy_example("quickstart", tmp_path)
    proc = blockx("run", task, "-n", "1", "--quiet", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert without_stalls(proc.stderr) == ""
    assert len(jsonl(proc.stdout)) == 5


def test_python_dash_m_and_the_installed_script_agree(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "blockx"
    if not script.exists():
        pytest.skip("the blockx script is not installed in this environment (pip install -e .)")
    import subprocess

    from cli_support import clean_env

    task = copy_example("quickstart", tmp_path)
    proc = subprocess.run(
        [str(script), "run", str(task), "-n", "1", "-q"],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert jsonl(proc.stdout) == QUICKSTART_ROWS


def test_a_failing_call_exits_1_with_a_report_pointing_at_the_users_line(tmp_path: Path) -> None:
    write(
        tmp_path / "fns" / "ratio.py",
        (
            "def share(part, whole):\n"
            "    return part / whole\n"
            "\n"
            "def _(p):\n"
            "    return {'name': p['name'], 'share': share(p['part'], p['whole'])}\n"
        ),
    )
    task = write(
        tmp_path / "task.yaml",
        (
            "functions:\n"
            "  ratio: {path: fns/ratio.py}\n"
            "calls:\n"
            "  - {function: ratio, args: {name: a, part: 1, whole: 4}}\n"
            "  - {function: ratio, args: {name: b, part: 1, whole: 0}}\n"
            "  - {function: ratio, args: {name: c, part: 3, whole: 4}}\n"
            "policy: {failure: continue}\n"
        ),
    )
    proc = blockx("run", task, "-n", "1", "--errors", tmp_path / "errors.jsonl", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert jsonl(proc.stdout) == [{"name": "a", "share": 0.25}, {"name": "c", "share": 0.75}]
    err = proc.stderr
    assert "FAILED: 1 of 3 calls failed (failure: continue" in err
    assert '1) call #1: ratio({"name":"b","part":1,"whole":0}) — user_error after 1 attempt' in err
    assert 'File "fns/ratio.py", line 5, in _' in err
    assert 'File "fns/ratio.py", line 2, in share' in err
    assert "return part / whole" in err
    assert "ZeroDivisionError: division by zero" in err
    assert "<blockx:" not in err  # module names are mapped to the real files
    assert "failures  user_error 1" in err
    (record,) = jsonl((tmp_path / "errors.jsonl").read_text())
    assert record["index"] == 1 and record["kind"] == "user_error"
    assert record["args"] == {"name": "b", "part": 1, "whole": 0}
    assert 'fns/ratio.py", line 2' in record["stack"]


def test_fast_fail_stops_the_task_at_the_first_failure(tmp_path: Path) -> None:
    task = write(
        tmp_path / "task.yaml",
        (
            "functions:\n"
            "  f:\n"
            "    source: |\n"
            "      import time\n"
            "      def _(n):\n"
            "          if n == 0:\n"
            "              raise KeyError('no such thing')\n"
            "          time.sleep(0.05)\n"
            "          return {'n': n}\n"
            "calls:\n"
            + "".join(f"  - {{function: f, args: {i}}}\n" for i in range(200))
            + "policy: {max_attempts: 2}\n"
        ),
    )
    proc = blockx("run", task, "-n", "1", "--set", "dispatcher.task_max_inflight_calls=4")
    assert proc.returncode == 1, proc.stderr
    err = proc.stderr
    assert "FAILED: call #0 failed and stopped the task (failure: fast_fail)" in err
    assert "KeyError: 'no such thing'" in err
    # an inline `source: |` block: the line of the task file
    assert f'File "{task}", line 7, in _' in err
    assert "cancelled" in err
    assert len(jsonl(proc.stdout)) < 200


def test_a_syntax_error_in_one_function_under_continue(tmp_path: Path) -> None:
    write(tmp_path / "functions" / "good.py", "def _(x):\n    return {'x': x, 'double': 2 * x}\n")
    write(tmp_path / "functions" / "bad.py", ("def _(x):\n    y = x + 1\n    return {'y': y\n"))
    task = write(
        tmp_path / "task.yaml",
        (
            "functions:\n"
            "  good: {path: functions/good.py}\n"
            "  bad: {path: functions/bad.py}\n"
            "calls:\n"
            "  - {function: good, args: 1}\n"
            "  - {function: bad, args: 1}\n"
            "  - {function: good, args: 2}\n"
            "  - {function: bad, args: 2}\n"
            "  - {function: good, args: 3}\n"
            "  - {function: bad}\n"
            "  - {function: bad, args: [1, x]}\n"
            "policy: {failure: continue}\n"
        ),
    )
    proc = blockx("run", task, "-n", "2", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    # the other function's calls all ran
    assert jsonl(proc.stdout) == [{"x": n, "double": 2 * n} for n in (1, 2, 3)]
    err = proc.stderr
    # announced before the run, with the file, line and column and the offending line
    assert (
        "warning: function 'bad' cannot run — its calls will fail: "
        "functions/bad.py:3:12: SyntaxError: '{' was never closed" in err
    )
    assert "return {'y': y" in err
    # and each of its calls is reported failed, pointing at the file and line
    assert "FAILED: 4 of 7 calls failed" in err
    assert "call #1: bad(1) — user_error" in err and "call #3: bad(2) — user_error" in err
    # a list is the positional arguments: no arguments read f(), two read f(1, "x")
    assert "call #5: bad() — user_error" in err and 'call #6: bad(1, "x") — user_error' in err
    assert 'File "functions/bad.py", line 3' in err
    assert "failures  user_error 4" in err


def test_streaming_example_writes_every_row(tmp_path: Path) -> None:
    task = copy_example("streaming", tmp_path)
    out = tmp_path / "rows.jsonl"
    proc = blockx("run", task, "-o", out, "-n", "2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = jsonl(out.read_text())
    collatz = [r for r in rows if "steps" in r]
    digits = [r for r in rows if "digit" in r]
    assert len(collatz) == 2940 and len(digits) > 60
    assert {r["n"] for r in collatz} == {n for n in range(1, 3001) if n % 50}
    by_n = {r["n"]: r for r in collatz}
    assert by_n[27] == {"n": 27, "steps": 111, "peak": 9232}
    assert "task streaming: ok — 3,000 calls in" in proc.stderr


def test_the_error_handling_example_fails_three_ways(tmp_path: Path) -> None:
    task = copy_example("error_handling", tmp_path)
    proc = blockx("run", task, "-n", "2", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert jsonl(proc.stdout) == [
        {"currency": "EUR", "cents": 1250},
        {"currency": "USD", "cents": 700},
        {"currency": "GBP", "cents": 99},
        {"slept": 0.1},
    ]
    err = proc.stderr
    assert "FAILED: 3 of 7 calls failed" in err
    assert "parse_amount" in err and "user_error after 1 attempt" in err
    assert 'File "error_handling/functions/parse_amount.py", line 8, in check_positive' in err
    assert "node_balance" in err and "io_error after 3 attempts" in err
    assert 'File "error_handling/functions/node_balance.py", line 6, in _' in err
    assert "slow_report" in err and "deadline_exceeded after 1 attempt" in err
    assert "blockx/chain.py" not in err  # BlockX's own frames are left out
    assert "failures  user_error 1, io_error 1, deadline_exceeded 1" in err or all(
        kind in err for kind in ("user_error 1", "io_error 1", "deadline_exceeded 1")
    )
    assert "2 retries" in err


def test_chain_reads_example_against_a_local_json_rpc_node(tmp_path: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "io"))
    from jsonrpc_node import ALICE, CONTRACT, FakeNode, balance

    node = FakeNode().start()
    try:
        functions = EXAMPLES / "chain_reads" / "functions"
        task = write(
            tmp_path / "task.yaml",
            (
                "functions:\n"
                f"  account_snapshot: {{path: {functions / 'account_snapshot.py'}}}\n"
                f"  token_balance: {{path: {functions / 'token_balance.py'}}}\n"
                "calls:\n"
                f"  - {{function: account_snapshot, args: {{address: '{ALICE}', block: 105}}}}\n"
                f"  - {{function: account_snapshot, args: {{address: '{CONTRACT}', block: 106}}}}\n"
                f"  - {{function: account_snapshot, args: {{address: '{CONTRACT}', block: 106}}}}\n"
            ),
        )
        proc = blockx("run", task, "-n", "1", "--set", f"io.rpc.endpoints=eth={node.url}")
    finally:
        node.stop()
    assert proc.returncode == 0, proc.stderr
    rows = jsonl(proc.stdout)
    assert rows[0]["balance_wei"] == balance(ALICE, 105)
    assert rows[1]["balance_wei"] == balance(CONTRACT, 106) > 2**64  # exact beyond 64 bits
    assert rows[1]["is_contract"] is True and rows[0]["is_contract"] is False
    assert rows[0]["nonce"] == 5
    assert rows[2] == rows[1]
    assert "rpc/eth_getBalance" in proc.stderr
    assert "1 call-cache hits" in proc.stderr or "1 singleflight joins" in proc.stderr


def test_the_summary_counts_reads_answered_in_the_executors(tmp_path: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "io"))
    from jsonrpc_node import ALICE, FakeNode, balance

    node = FakeNode().start()
    try:
        task = write(
            tmp_path / "task.yaml",
            (
                "functions:\n"
                "  wei:\n"
                "    source: |\n"
                "      def _(p):\n"
                "          state = ChainState('eth', p['block'])\n"
                "          return {'i': p['i'], 'wei': [state.get_address_balance(p['a'])\n"
                "                                       for _ in range(4)]}\n"
                "calls:\n"
                + "".join(
                    f"  - {{function: wei, args: {{i: {i}, a: '{ALICE}', block: 105}}}}\n"
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
        )
        methods = list(node.methods)
    finally:
        node.stop()
    assert proc.returncode == 0, proc.stderr
    assert [row["wei"] for row in jsonl(proc.stdout)] == [[balance(ALICE, 105)] * 4] * 6
    assert methods == ["eth_getBalance"]  # one request for 24 reads
    totals = json.loads(summary.read_text())["io"]["totals"]
    # Each call's first read may go to the worker (the calls run at once); reads 2..4 of
    # every call are answered by the executor; every read is counted once.
    assert totals["requests"] + totals["local_hits"] == 24
    assert totals["local_hits"] >= 18
    assert f"{totals['local_hits']} more answered in the executors" in proc.stderr
    assert "in executor" in proc.stderr


def test_print_output_of_functions_goes_to_stderr_not_into_the_rows(tmp_path: Path) -> None:
    task = write(
        tmp_path / "task.yaml",
        (
            "functions:\n"
            "  talk:\n"
            "    source: |\n"
            "      def _(x):\n"
            "          print('working on', x)\n"
            "          return {'x': x}\n"
            "calls:\n"
            "  - {function: talk, args: 41}\n"
        ),
    )
    proc = blockx("run", task, "-n", "1")
    assert proc.returncode == 0, proc.stderr
    assert jsonl(proc.stdout) == [{"x": 41}]
    assert "[exec-0] working on 41" in proc.stderr
    quiet = blockx("run", task, "-n", "1", "-q")
    assert "working on" not in quiet.stderr


def test_the_report_lists_twenty_failed_calls_then_counts_the_rest(tmp_path: Path) -> None:
    task = write(
        tmp_path / "task.yaml",
        "functions:\n"
        "  check:\n"
        "    source: |\n"
        "      def _(n):\n"
        "          if n % 2:\n"
        "              raise ValueError(f'odd: {n}')\n"
        "          return {'n': n}\n"
        "calls:\n"
        + "".join(f"  - {{function: check, args: {i}}}\n" for i in range(50))
        + "policy: {failure: continue}\n",
    )
    proc = blockx("run", task, "-n", "1", "--errors", tmp_path / "errors.jsonl")
    assert proc.returncode == 1
    assert len(jsonl(proc.stdout)) == 25
    err = proc.stderr
    assert "FAILED: 25 of 50 calls failed" in err
    assert "20) call #39: check(39) — user_error after 1 attempt" in err
    assert "21) call" not in err
    assert "… and 5 more failed call(s) (--errors FILE lists all)" in err
    assert "ValueError: odd: 1" in err and "ValueError: odd: 39" in err
    assert len(jsonl((tmp_path / "errors.jsonl").read_text())) == 25


def test_without_a_data_dir_the_tables_live_next_to_the_task_file(tmp_path: Path) -> None:
    """docs/taskspec.md: a task finds its tables from any working directory."""
    project = tmp_path / "project"
    project.mkdir()
    task = write(
        project / "task.yaml",
        """
functions:
  count:
    source: |
      def _(i):
          t = Table("hits")
          n = (t.get_row(i) or {"n": 0})["n"] + 1
          t.upsert_row({"key": i, "n": n})
          return {"i": i, "n": n}
calls: [{function: count, args: 1}]
""",
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    first = blockx("run", task, "-n", "1", cwd=elsewhere)
    assert first.returncode == 0, first.stderr
    assert jsonl(first.stdout) == [{"i": 1, "n": 1}]
    assert (project / ".blockx" / "blockdb.sqlite3").is_file()
    assert not (elsewhere / ".blockx").exists()
    # From the task's own directory the same table is found: the second run counts 2.
    second = blockx("run", "task.yaml", "-n", "1", cwd=project)
    assert second.returncode == 0, second.stderr
    assert jsonl(second.stdout) == [{"i": 1, "n": 2}]
    config = blockx("config", "--task", task, "--json", cwd=elsewhere)
    assert config.returncode == 0, config.stderr
    rows = {row["knob"]: row for row in json.loads(config.stdout)}
    assert rows["io.data_dir"]["value"] == str(project / ".blockx")
    assert rows["io.data_dir"]["source"] == "default (next to the task file)"
