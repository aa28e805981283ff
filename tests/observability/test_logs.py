"""JSON logs (issue #20, docs/observability.md): with ``--log-format json`` (or
``BLOCKX_LOG_FORMAT=json``) every stderr line of ``blockx run`` and ``blockx serve`` is one
JSON object with ``ts``, ``level``, ``logger``, ``message`` and ``task_id`` / ``call_id`` /
``executor`` where known; the executors' own lines are forwarded into the same stream,
tagged with their executor; no progress line is mixed in; text stays the default."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
from tests.cli.cli_support import clean_env, jsonl, kill_if_running, streamed_task, wait_for_exit
from tests.serve.server import Server, wait_for

from blockx.cli.console import Console, StderrWriter
from blockx.executor.logging_setup import JsonLinesStdout, set_call_fields_provider
from blockx.observability.logs import (
    JsonLogFormatter,
    LogFormatError,
    json_line,
    resolve_log_format,
    rfc3339,
)

#: RFC 3339, UTC, milliseconds.
RFC3339_UTC = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")
REQUIRED = ("ts", "level", "logger", "message")
LEVELS = {"debug", "info", "warning", "error", "critical"}

TASK = """\
task_id: logs-json
functions:
  f:
    source: |
      import sys, warnings
      def _(i):
          print(f"printed by call {i}")
          if i == 2:
              warnings.warn("careful with 2")
              sys.stderr.write("a raw stderr line from call 2\\n")
          if i == 3:
              raise ValueError("three is bad")
          return {"i": i}
  broken:
    source: |
      def _(i:
          return i
calls:
  - {function: f, args: [1]}
  - {function: f, args: [2]}
  - {function: f, args: [3]}
  - {function: broken, args: [4]}
policy:
  failure: continue
"""


def _records(stderr: str) -> list[dict[str, Any]]:
    """Every line of ``stderr`` as a JSON object with the required keys (or the test fails)."""
    records = []
    assert "\r" not in stderr and "\x1b" not in stderr, "a progress frame in JSON output"
    assert stderr.endswith("\n"), "the last line is cut short"
    for line in stderr.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            pytest.fail(f"a stderr line is not JSON: {line!r}\n--- stderr:\n{stderr}")
        assert isinstance(record, dict), line
        for key in REQUIRED:
            assert key in record, f"{key} missing in {line}"
        assert RFC3339_UTC.match(record["ts"]), record["ts"]
        assert record["level"] in LEVELS, line
        assert isinstance(record["logger"], str) and isinstance(record["message"], str), line
        records.append(record)
    return records


def _run(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    task = tmp_path / "task.yaml"
    task.write_text(TASK, encoding="utf-8")
    return subprocess.run(
        [sys.executable, "-m", "blockx", "run", str(task), "-n", "1", *args],
        cwd=tmp_path,
        env=clean_env(**env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


# --- blockx run, real processes ------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "env"),
    [(("--log-format", "json"), {}), ((), {"BLOCKX_LOG_FORMAT": "json"})],
    ids=["option", "environment"],
)
def test_run_json_every_stderr_line_parses(
    tmp_path: Path, args: tuple[str, ...], env: dict[str, str]
) -> None:
    # --progress asked for too: in json it is never drawn.
    proc = _run(tmp_path, *args, "--progress", **env)
    assert proc.returncode == 1, proc.stderr
    assert [json.loads(line)["i"] for line in proc.stdout.splitlines()] == [1, 2]
    records = _records(proc.stderr)

    # The CLI's warning (a function that cannot run), with its excerpt in the same record.
    (cannot_run,) = [r for r in records if "cannot run" in r["message"]]
    assert cannot_run["level"] == "warning"
    assert "broken" in cannot_run["message"] and "\n" in cannot_run["message"]

    # print() output of the functions: one record a line, tagged with the executor (and,
    # where the executor knew it, the call).
    printed = {r["message"]: r for r in records if r["message"].startswith("printed by call")}
    assert set(printed) == {"printed by call 1", "printed by call 2", "printed by call 3"}
    for text, record in printed.items():
        assert record["executor"] == "exec-0" and record["stream"] == "stdout"
        assert record["call_id"] == f"{record['task_run']}/c{int(text[-1]) - 1}"
        assert record["task_id"] == "logs-json" and record["function"] == "f"
        assert "executor_logger" not in record  # user output, not the executor's own log
    # The Python warning of the function and its raw stderr line: forwarded, tagged.
    (warned,) = [r for r in records if "careful with 2" in r["message"]]
    assert warned["level"] == "warning" and warned["executor"] == "exec-0"
    assert warned["call_id"].endswith("/c1") and warned["function"] == "f"
    assert warned["task_id"] == "logs-json" and warned["task_run"].startswith("logs-json#")
    (raw,) = [r for r in records if r["message"] == "a raw stderr line from call 2"]
    assert raw["executor"] == "exec-0" and raw["stream"] == "stderr"

    # The failure report: a headline, then one record per failed call naming the call.
    report = [r for r in records if r["logger"] == "blockx.cli.report"]
    assert report[0]["message"].startswith("FAILED: 2 of 4 calls failed")
    failed = {r["call_index"]: r for r in report[1:]}
    assert set(failed) == {2, 3}
    assert failed[2]["function"] == "f" and failed[2]["error_kind"] == "user_error"
    assert failed[2]["call_id"].endswith("/c2") and failed[2]["task_id"] == "logs-json"
    assert "three is bad" in failed[2]["error"] and "Traceback" in failed[2]["message"]
    assert failed[3]["function"] == "broken" and failed[3]["level"] == "error"

    # The summary: one record, the figures under "summary" (what --summary-json writes).
    (summary,) = [r for r in records if r["logger"] == "blockx.cli.summary"]
    assert summary["message"].startswith("task logs-json: FAILED")
    assert summary["summary"]["succeeded"] == 2 and summary["summary"]["failed"] == 2
    assert sum(summary["summary"]["failures_by_kind"].values()) == 2
    assert summary["summary"]["exit_code"] == 1
    assert records[-1] is summary  # the report, then the summary, last: nothing reordered


@pytest.mark.slow
def test_run_json_verbose_forwards_the_executors_own_lines(tmp_path: Path) -> None:
    proc = _run(tmp_path, "--log-format", "json", "-v")
    assert proc.returncode == 1, proc.stderr
    records = _records(proc.stderr)
    own = [r for r in records if r.get("executor_logger", "").startswith("blockx.executor")]
    assert own, "no line of the executor's own"
    assert all(r["executor"] == "exec-0" for r in own)
    assert any(r["message"] == "executor started" for r in own)
    # The message is the executor's, without the text format's "[exec-0]" prefix.
    assert not any(r["message"].startswith("[exec-0]") for r in records)
    # The worker's own records (-v) are there too, in the same stream.
    assert any(r["logger"].startswith("blockx.worker") and "executor" not in r for r in records)


@pytest.mark.slow
def test_run_json_even_when_the_environment_asks_executors_for_text(tmp_path: Path) -> None:
    """``--log-format json`` wins over ``BLOCKX_LOG_FORMAT=text`` — for the executors too."""
    proc = _run(tmp_path, "--log-format", "json", "-v", BLOCKX_LOG_FORMAT="text")
    records = _records(proc.stderr)
    assert any(r.get("executor_logger") == "blockx.executor" for r in records)


@pytest.mark.slow
def test_run_text_stays_the_default(tmp_path: Path) -> None:
    proc = _run(tmp_path)
    assert proc.returncode == 1
    lines = proc.stderr.splitlines()
    assert any(line.startswith("blockx: warning: function 'broken' cannot run") for line in lines)
    assert "[exec-0] printed by call 1" in lines
    assert any(line.startswith("FAILED: 2 of 4 calls failed") for line in lines)
    assert any(line.startswith("task logs-json: FAILED") for line in lines)
    assert not any(line.startswith("{") for line in lines)


@pytest.mark.slow
def test_run_refuses_an_unknown_log_format_in_the_environment(tmp_path: Path) -> None:
    proc = _run(tmp_path, BLOCKX_LOG_FORMAT="xml")
    assert proc.returncode == 2
    assert "BLOCKX_LOG_FORMAT='xml': expected text or json" in proc.stderr


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pipe sizes: Linux")
def test_run_json_through_a_slow_stderr_drops_whole_records_and_says_so(tmp_path: Path) -> None:
    """The stderr writer thread in json: a stderr not read while the run goes on does not
    stall it; lines are dropped whole (every line still parses), counted in a record of
    their own, and the ones written keep their order; the summary comes last."""
    count, lines = 600, 20
    body = (
        f"for j in range({lines}):\n"
        "    print(f'call {i} line {j} ' + 'x' * 80)\n"
        "return {'i': i}"
    )
    task = streamed_task(tmp_path, count, body, task_id="printing")
    proc = subprocess.Popen(
        [sys.executable, "-m", "blockx", "run", str(task), "-n", "2", "--log-format", "json"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=clean_env(),
        cwd=tmp_path,
    )
    rows: list[bytes] = []
    try:
        assert proc.stdout is not None and proc.stderr is not None
        stdout = proc.stdout

        def read() -> None:
            while chunk := stdout.read1(65536):
                rows.append(chunk)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        deadline = time.monotonic() + 120
        while sum(chunk.count(b"\n") for chunk in rows) < count:  # stderr unread meanwhile
            assert proc.poll() is None, "blockx run ended before its last row"
            assert time.monotonic() < deadline, "the rows did not all come"
            time.sleep(0.01)
        err = proc.stderr.read().decode()
        wait_for_exit(proc, 60)
        reader.join(10)
    finally:
        kill_if_running(proc)
    assert proc.returncode == 0, err[-2000:]
    assert [row["i"] for row in jsonl(b"".join(rows).decode())] == list(range(count))
    records = _records(err)
    notices = [r for r in records if "stderr lines dropped" in r["message"]]
    assert notices, "nothing was dropped: the test did not fill stderr"
    assert all(r["level"] == "warning" for r in notices)
    dropped = sum(r["lines_dropped"] for r in notices)
    seen: dict[int, int] = {}
    written = 0
    for record in records:
        match = re.match(r"call (\d+) line (\d+) x", record["message"])
        if match:
            call, line = int(match.group(1)), int(match.group(2))
            assert seen.get(call, -1) < line, f"call {call}: line {line} out of order"
            assert record["call_id"].endswith(f"/c{call}"), record
            seen[call] = line
            written += 1
    assert written + dropped == count * lines
    assert records[-1]["logger"] == "blockx.cli.summary"
    assert records[-1]["summary"]["stderr_lines_dropped"] == dropped


# --- blockx serve, a real server -------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_serve_json_lines_parse(tmp_path: Path) -> None:
    server = Server(tmp_path / "data", "--log-format", "json", "-v", executors=1)
    with server:
        # The harness found the port in the JSON line's message.
        task_id = server.submit(
            {
                "task_id": "serve-logs",
                "functions": {"f": {"source": "def _(i):\n    print('hi', i)\n    return i\n"}},
                "calls": [{"function": "f", "args": [1]}],
            }
        )
        assert server.wait_finished(task_id)["state"] == "succeeded"
        wait_for(lambda: "hi 1" in server.stderr, 30, "the forwarded print() line")
        code = server.stop()
    assert code == 0
    records = _records(server.stderr)
    (listening,) = [r for r in records if r["message"].startswith("listening on")]
    assert listening["message"] == f"listening on http://127.0.0.1:{server.port}"
    assert listening["logger"] == "blockx.serve" and listening["level"] == "info"
    # aiohttp's access records (-v) and the executors' lines go through the same formatter.
    assert any(r["logger"] == "aiohttp.access" for r in records)
    (printed,) = [r for r in records if r["message"] == "hi 1"]
    assert printed["executor"] == "exec-0" and printed["call_id"].endswith("/c0")
    assert any("draining" in r["message"] for r in records)


@pytest.mark.slow
def test_serve_json_refusal_is_a_record(tmp_path: Path) -> None:
    """A refusal before start-up (a non-loopback address without a token) is JSON too."""
    proc = subprocess.run(
        [sys.executable, "-m", "blockx", "serve", "--log-format", "json", "--host", "0.0.0.0"],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2
    (record,) = _records(proc.stderr)
    assert record["level"] == "error" and record["logger"] == "blockx.serve"
    assert "not a loopback address" in record["message"]


@pytest.mark.slow
def test_serve_json_a_port_in_use_ends_in_a_record(tmp_path: Path) -> None:
    """What ends the process before it listens (the port is taken) is a record too."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "blockx",
                "serve",
                "--log-format",
                "json",
                "--port",
                str(port),
                "--data-dir",
                str(tmp_path / "data"),
                "--executors",
                "1",
            ],
            cwd=tmp_path,
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert proc.returncode == 1
    last = _records(proc.stderr)[-1]
    assert last["level"] == "critical" and "address already in use" in last["message"]
    assert "Traceback" in last["exc"]


# --- the pieces, in process ------------------------------------------------------------------


def test_resolve_log_format() -> None:
    assert resolve_log_format(None, {}) == "text"
    assert resolve_log_format(None, {"BLOCKX_LOG_FORMAT": " JSON "}) == "json"
    assert resolve_log_format("text", {"BLOCKX_LOG_FORMAT": "json"}) == "text"
    with pytest.raises(LogFormatError, match="expected text or json"):
        resolve_log_format(None, {"BLOCKX_LOG_FORMAT": "yaml"})


def test_json_line_and_ts() -> None:
    assert rfc3339(0.9999) == "1970-01-01T00:00:00.999Z"
    line = json_line("info", "x", "two\nlines", {"call_id": "t#1/c0", "message": "no", "n": None})
    assert "\n" not in line
    assert json.loads(line) == {
        "ts": json.loads(line)["ts"],
        "level": "info",
        "logger": "x",
        "message": "two\nlines",
        "call_id": "t#1/c0",
    }


def test_formatter_names_a_forwarded_executor_line() -> None:
    """A record as blockx.worker.pool.output forwards an executor's JSON line."""
    record = logging.LogRecord(
        "blockx.worker.executor", logging.WARNING, __file__, 1, "[%s] %s", ("exec-1", "hi"), None
    )
    for key, value in {
        "executorId": "exec-1",
        "executorStream": "stderr",
        "executorText": "hi",
        "callId": "t#1/c7",
        "taskId": "t#1",
        "attemptSeq": 2,
    }.items():
        setattr(record, key, value)
    data = json.loads(JsonLogFormatter().format(record))
    assert data["message"] == "hi" and data["level"] == "warning"
    assert (data["executor"], data["call_id"], data["attempt"]) == ("exec-1", "t#1/c7", 2)
    assert (data["task_id"], data["task_run"]) == ("t", "t#1")


def test_console_json_through_the_writer_thread() -> None:
    """The console's texts, log records, sys.stderr writes (a Python warning) and the
    progress line, in json: each line one object, in order, no progress frame."""
    read_end, write_end = os.pipe()

    class Stream(io.StringIO):
        def fileno(self) -> int:
            return write_end

    console = Console(Stream(), tty=True, log_format="json")
    saved = sys.stderr
    try:
        console.attach(StderrWriter(Stream(), json_lines=True))
        console.show_progress("50% ####----")
        console.print("blockx: warning: something to know")
        console.print()  # layout: left out
        console.print("blockx: error: line one\nline two")
        # What warnings.showwarning writes for a Python warning: two lines, one write.
        sys.stderr.write(
            warnings.formatwarning("a warning of the worker process", UserWarning, "w.py", 3)
        )
        console.record("info", "a record", {"task_id": "t"}, logger="blockx.cli.summary")
        assert not console.detach()
    finally:
        sys.stderr = saved
    os.close(write_end)
    with os.fdopen(read_end, encoding="utf-8") as f:
        records = _records(f.read())
    assert [(r["level"], r["logger"]) for r in records] == [
        ("warning", "blockx.cli"),
        ("error", "blockx.cli"),
        ("warning", "stderr"),
        ("info", "blockx.cli.summary"),
    ]
    assert records[0]["message"] == "something to know"
    assert records[1]["message"] == "line one\nline two"
    assert "a warning of the worker process" in records[2]["message"]
    assert records[3]["task_id"] == "t"


def test_executor_stdout_as_json_lines_names_the_running_call() -> None:
    """An executor asked for JSON explicitly: print() output becomes JSON lines (no
    ``logger``: user output), each with the fields of the call running when it ended."""
    out = io.StringIO()
    stdout = JsonLinesStdout(out)
    running: dict[str, Any] = {"callId": "t#1/c0", "taskId": "t#1", "attemptSeq": 1}
    set_call_fields_provider(lambda: running)
    try:
        print("one", file=stdout)
        stdout.write("two, ")
        running = {"callId": "t#1/c1", "taskId": "t#1"}
        stdout.write("ended\nthree\nfour")
        set_call_fields_provider(None)
        stdout.flush()
    finally:
        set_call_fields_provider(None)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(d["msg"], d.get("callId")) for d in lines] == [
        ("one", "t#1/c0"),
        ("two, ended", "t#1/c1"),
        ("three", "t#1/c1"),
        ("four", None),
    ]
    assert all(d["level"] == "info" and "logger" not in d for d in lines)
    assert RFC3339_UTC.match(lines[0]["ts"])
