"""The client of ``blockx serve``: ``blockx.Client`` / ``AsyncClient`` and ``blockx submit /
status / rows / cancel / tasks`` (issue #19, "The client").

The first half needs no server: reading a task file into the upload, the calls
file's batches, the environment's defaults, the row stream's reconnect
bookkeeping, the messages of refusals, the command line's own errors. The second
half runs against a real ``blockx serve`` (a subprocess on an ephemeral loopback
port, real executors, a token): rows exactly once, ``--follow`` equal to ``blockx
run``, a calls file streamed in batches, a connection cut mid-stream, tokens,
unknown ids, and the async twin.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_support import blockx, clean_env, write

from blockx.cli.taskfile import SpecError, load_task_file
from blockx.client import (
    DEFAULT_SERVER,
    AsyncClient,
    Client,
    ClientError,
    RowCursor,
    ServerUnavailable,
    prepare_upload,
)
from blockx.client.common import iter_call_batches, problem_error

# --- task files ------------------------------------------------------------------------------

SQUARE = "def _(x):\n    return {'x': x, 'square': x * x}\n"
#: Fails for multiples of 7 (line 3 of its file), else one row.
PICKY = "def _(x):\n    if x % 7 == 0:\n        raise ValueError(f'no multiples of 7: {x}')\n    return {'x': x}\n"
#: Many rows per call, with padding: the stream is long enough to cut it in the middle.
WIDE = "def _(x):\n    return [{'x': x, 'i': i, 'pad': 'p' * 200} for i in range(20)]\n"
#: Calls that end one after the other over a few seconds, three rows each.
STAGGERED = (
    "import time\n\ndef _(x):\n    time.sleep(x * 0.02)\n"
    "    return [{'x': x, 'i': i} for i in range(3)]\n"
)
SLEEPY = "import time\n\ndef _(x):\n    time.sleep(x)\n    return {'slept': x}\n"


def task_file(tmp: Path, name: str, source: str, args: list[Any], **extra: Any) -> Path:
    """A task file ``tmp/NAME.yaml`` with one function from ``functions/NAME.py``."""
    write(tmp / "functions" / f"{name}.py", source)
    doc: dict[str, Any] = {
        "task_id": name,
        "functions": {name: {"path": f"functions/{name}.py"}},
        **extra,
    }
    if "calls_file" not in extra:
        doc["calls"] = [{"function": name, "args": [a]} for a in args]
    return write(tmp / f"{name}.json", json.dumps(doc))


# --- no server: the upload -------------------------------------------------------------------


def test_a_task_file_is_uploaded_with_its_sources_and_inline_calls(tmp_path: Path) -> None:
    path = task_file(
        tmp_path, "square", SQUARE, [1, 2, 3], instance="tenant-a", policy={"max_attempts": 2}
    )
    upload = prepare_upload(path)
    assert upload.document == {
        "task_id": "square",
        "instance": "tenant-a",
        "functions": {"square": {"source": SQUARE}},
        "policy": {"max_attempts": 2},
        "calls": [
            {"function": "square", "args": [1]},
            {"function": "square", "args": [2]},
            {"function": "square", "args": [3]},
        ],
    }
    assert upload.calls_file is None
    assert upload.spec is not None and upload.spec.label == str(path)


def test_a_dict_is_sent_as_is() -> None:
    doc = {"functions": {"f": {"source": "def _():\n    pass\n"}}, "calls_stream": True}
    upload = prepare_upload(doc)
    assert upload.document == doc and upload.calls_file is None and upload.spec is None


def test_a_calls_file_task_is_opened_as_a_stream_and_sent_in_batches(tmp_path: Path) -> None:
    lines = [json.dumps({"function": "square", "args": [i]}) for i in range(25)]
    # Blank lines are skipped; the last line has no newline.
    write(tmp_path / "calls.jsonl", "\n".join(lines[:10]) + "\n\n  \n" + "\n".join(lines[10:]))
    path = task_file(tmp_path, "square", SQUARE, [], calls_file="calls.jsonl")
    upload = prepare_upload(path)
    assert upload.document["calls_stream"] is True and "calls" not in upload.document
    assert upload.calls_file == tmp_path / "calls.jsonl"
    batches = list(iter_call_batches(upload.calls_file, max_lines=10))
    assert [count for _, count in batches] == [10, 10, 5]
    assert b"".join(body for body, _ in batches) == "".join(f"{line}\n" for line in lines).encode()
    # A byte budget cuts too (a line longer than it goes alone).
    by_bytes = list(iter_call_batches(upload.calls_file, max_bytes=len(lines[0]) * 3 + 3))
    assert all(count <= 3 for _, count in by_bytes) and sum(c for _, c in by_bytes) == 25


def test_a_bad_task_file_gives_the_messages_of_blockx_validate(tmp_path: Path) -> None:
    path = task_file(tmp_path, "square", SQUARE, [1], policy={"max_attempts": "three"})
    with pytest.raises(SpecError) as local:
        prepare_upload(path)
    with pytest.raises(SpecError) as validate:
        load_task_file(path)
    assert local.value.problems == validate.value.problems
    assert "policy.max_attempts" in str(local.value)
    cli = blockx("submit", path, "--server", "http://127.0.0.1:9")
    assert cli.returncode == 2, cli.stderr
    assert "policy.max_attempts: expected a positive integer" in cli.stderr
    assert "Traceback" not in cli.stderr and cli.stdout == ""


def test_a_syntax_error_is_reported_with_file_and_line_before_anything_is_sent(
    tmp_path: Path,
) -> None:
    path = task_file(tmp_path, "broken", "def _(x):\n    return (x\n", [1])
    with pytest.raises(SpecError) as caught:
        prepare_upload(path)
    assert re.search(r"functions/broken\.py:2:\d+: .*'broken'", str(caught.value)), caught.value


def test_an_io_section_is_left_out_with_a_warning(tmp_path: Path) -> None:
    path = task_file(tmp_path, "square", SQUARE, [1], io={"data_dir": "data"})
    upload = prepare_upload(path)
    assert "io" not in upload.document
    assert upload.warnings == (
        f"{path}: io: not sent: the server's IO configuration applies to a submitted task "
        "(blockx serve --config)",
    )


# --- no server: defaults, bookkeeping, messages ----------------------------------------------


def test_server_and_token_come_from_the_environment_unless_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("BLOCKX_SERVER", raising=False)
    monkeypatch.delenv("BLOCKX_TOKEN", raising=False)
    assert Client().url == DEFAULT_SERVER == "http://127.0.0.1:8470"
    assert Client().token is None
    monkeypatch.setenv("BLOCKX_SERVER", "http://example.test:9000/")
    monkeypatch.setenv("BLOCKX_TOKEN", "  s3cret\n")
    assert (Client().url, Client().token) == ("http://example.test:9000", "s3cret")
    assert AsyncClient().url == "http://example.test:9000" and AsyncClient().token == "s3cret"
    given = Client("127.0.0.1:1234", token="other")
    assert (given.url, given.token) == ("http://127.0.0.1:1234", "other")
    assert Client(token="").token is None  # an empty token is none
    with pytest.raises(ValueError, match="not a server URL"):
        Client("ftp://host")


def test_the_row_cursor_counts_whole_lines_and_backs_off_then_gives_up() -> None:
    cursor = RowCursor(5, max_failures=3)
    assert cursor.feed(b'{"a":1}\n{"a"') == (b'{"a":1}\n', 1)
    assert cursor.feed(b":2}\n") == (b'{"a":2}\n', 1)
    assert cursor.position == 7
    cursor.feed(b'{"cut')  # a partial line is dropped with the connection
    delays = [cursor.dropped(ConnectionResetError(), "http://x") for _ in range(3)]
    assert delays == [0.05, 0.1, 0.2] and cursor.partial == b"" and cursor.position == 7
    with pytest.raises(ClientError, match=r"gave up reading rows after 3 failed .*\?after=7"):
        cursor.dropped(ConnectionResetError("reset"), "http://x")
    cursor.opened()  # a successful reopening starts the count again
    assert cursor.failures == 0 and cursor.dropped(OSError(), "http://x") == 0.05
    assert cursor.reconnects == 5
    assert not cursor.ended({"state": "running", "rows": 7})
    assert not cursor.ended({"state": "succeeded", "rows": 9})
    assert cursor.ended({"state": "succeeded", "rows": 7})
    with pytest.raises(ValueError):
        RowCursor(-1)


def test_a_refusal_names_its_problems_and_a_401_the_token() -> None:
    body = json.dumps(
        {
            "type": "https://blockx.dev/problems/invalid-task",
            "title": "Invalid task",
            "status": 400,
            "detail": "the task is not valid: $.policy.max_attempts: bad (and 1 more)",
            "problems": [
                {"path": "$.policy.max_attempts", "message": "expected a positive integer"},
                {"path": "$.calls[0].function", "message": "'g' is not a function"},
            ],
        }
    ).encode()
    error = problem_error(400, "Bad Request", body, url="http://h", token_given=False)
    assert error.status == 400 and len(error.problems) == 2
    assert str(error).splitlines() == [
        "http://h: 400 Invalid task: the task is not valid",
        "  $.policy.max_attempts: expected a positive integer",
        "  $.calls[0].function: 'g' is not a function",
    ]
    missing = problem_error(401, "Unauthorized", b"{}", url="http://h", token_given=False)
    assert "needs a token" in str(missing) and "--token-file" in str(missing)
    wrong = problem_error(401, "Unauthorized", b"{}", url="http://h", token_given=True)
    assert "refused the token" in str(wrong)
    not_json = problem_error(
        502, "Bad Gateway", b"<html>oops</html>", url="http://h", token_given=False
    )
    assert "502 Bad Gateway: <html>oops</html>" in str(not_json)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_server_is_one_clear_line_without_a_traceback(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(ServerUnavailable, match=re.escape(url) + ".*`blockx serve`"):
        Client(url).task("t-0000000000000000").status()
    path = task_file(tmp_path, "square", SQUARE, [1])
    for args in (("submit", path), ("status", "t-0000000000000000"), ("tasks",)):
        cli = blockx(*args, "--server", url)
        assert cli.returncode == 1, cli
        assert cli.stderr.startswith(f"blockx: error: cannot reach the BlockX server at {url}")
        assert "blockx serve" in cli.stderr and "Traceback" not in cli.stderr


def test_usage_problems_exit_2(tmp_path: Path) -> None:
    empty = write(tmp_path / "token", "  \n")
    cli = blockx("status", "t-0000000000000000", "--token-file", empty)
    assert cli.returncode == 2 and "--token-file" in cli.stderr and "is empty" in cli.stderr
    cli = blockx("rows", "t-0000000000000000", "--after", "-3")
    assert cli.returncode == 2 and "expected an integer >= 0" in cli.stderr
    cli = blockx("tasks", "--state", "sleeping")
    assert cli.returncode == 2 and "invalid choice" in cli.stderr
    cli = blockx("tasks", "--server", "gopher://x")
    assert cli.returncode == 2 and "not a server URL" in cli.stderr


def test_import_blockx_and_blockx_help_stay_light() -> None:
    code = (
        "import sys, blockx; light = 'blockx.client' not in sys.modules; "
        "from blockx.cli import build_parser; build_parser(); "
        "print(light, 'blockx.client' in sys.modules, 'blockx.cli.remote' in sys.modules, "
        "blockx.Client.__module__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(), check=True
    )
    assert out.stdout.split() == ["True", "False", "False", "blockx.client.sync"]


# --- against a real server -------------------------------------------------------------------

TOKEN = "client-test-token"


class Server:
    """``blockx serve`` in a subprocess; its URL parsed from ``listening on ...``."""

    def __init__(self, data_dir: Path, token_file: Path, port: int = 0) -> None:
        command = [sys.executable, "-m", "blockx", "serve", "--port", str(port)]
        command += ["--data-dir", str(data_dir), "--executors", "2"]
        command += ["--token-file", str(token_file)]
        self.proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=clean_env(),
        )
        self.log: list[str] = []
        self.url = ""
        found = threading.Event()
        self.reader = threading.Thread(target=lambda: read(), daemon=True)

        def read() -> None:
            assert self.proc.stderr is not None
            for raw in self.proc.stderr:
                line = raw.decode("utf-8", "replace")
                self.log.append(line)
                match = re.search(r"listening on (http://\S+)", line)
                if match and not found.is_set():
                    self.url = match.group(1)
                    found.set()
            found.set()

        self.reader.start()
        if not found.wait(120) or not self.url:
            self.stop()
            raise AssertionError("the server did not start:\n" + "".join(self.log))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # executors attached: /readyz 200
            try:
                with Client(self.url) as probe:
                    probe.ready()
                return
            except ClientError:
                time.sleep(0.1)
        raise AssertionError("the server never became ready:\n" + "".join(self.log))

    def kill(self) -> None:
        """``kill -9``: no drain, no checkpoint."""
        self.proc.kill()
        self.proc.wait(60)
        self._close_stderr()

    def _close_stderr(self) -> None:
        self.reader.join(30)  # at EOF: every executor has exited too
        if self.proc.stderr is not None:
            self.proc.stderr.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._close_stderr()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    base = tmp_path_factory.mktemp("serve")
    token_file = write(base / "token", TOKEN + "\n")
    token_file.chmod(0o600)
    running = Server(base / "data", token_file)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def client(server: Server) -> Iterator[Client]:
    with Client(server.url, TOKEN) as c:
        yield c


def remote(server: Server, *args: str | os.PathLike[str]) -> subprocess.CompletedProcess[str]:
    """``blockx ARGS`` with the server and token in the environment."""
    env = clean_env(BLOCKX_SERVER=server.url, BLOCKX_TOKEN=TOKEN)
    return blockx(*args, env=env)


@pytest.mark.slow
def test_submit_then_every_row_exactly_once(server: Server, client: Client, tmp_path: Path) -> None:
    path = task_file(tmp_path, "square", SQUARE, list(range(40)))
    task = client.submit(path)
    assert re.fullmatch(r"t-[0-9a-f]{16}", task.id) and task.task_id == "square"
    rows = list(task.rows())
    assert sorted(r["x"] for r in rows) == list(range(40))
    assert all(r["square"] == r["x"] ** 2 for r in rows)
    status = task.wait(timeout=120)
    assert status["state"] == "succeeded" and status["rows"] == 40 and status["done"] == 40
    assert status["summary"]["exit_code"] == 0
    assert list(task.rows(after=35)) == rows[35:]  # after=N skips the first N
    lines = list(task.row_lines())
    assert [json.loads(line) for line in lines] == rows and all(
        line.endswith(b"\n") for line in lines
    )
    assert task.failures() == []


@pytest.mark.slow
def test_follow_writes_what_blockx_run_writes(server: Server, tmp_path: Path) -> None:
    path = task_file(tmp_path, "square", SQUARE, list(range(30)))
    local = blockx("run", path, "--executors", "1")
    assert local.returncode == 0, local.stderr
    followed = remote(server, "submit", path, "--follow")
    assert followed.returncode == 0, followed.stderr
    assert followed.stdout == local.stdout  # same rows, same order, same bytes
    assert re.search(r"blockx: submitted t-[0-9a-f]{16} \(task_id square\)", followed.stderr)
    assert re.search(r"task square: ok — 30 calls in [\d.]+ s .* on 2 executors", followed.stderr)
    assert "  outputs   30 rows → stdout" in followed.stderr
    # Without --follow: the id alone on stdout.
    plain = remote(server, "submit", path)
    assert plain.returncode == 0 and re.fullmatch(r"t-[0-9a-f]{16}\n", plain.stdout)


@pytest.mark.slow
def test_follow_of_failing_calls_reports_them_like_blockx_run(
    server: Server, tmp_path: Path
) -> None:
    path = task_file(tmp_path, "picky", PICKY, list(range(1, 20)), policy={"failure": "continue"})
    local = blockx("run", path, "--executors", "1")
    followed = remote(server, "submit", path, "--follow")
    assert (local.returncode, followed.returncode) == (1, 1), followed.stderr
    assert followed.stdout == local.stdout
    for expected in (
        "FAILED: 2 of 19 calls failed (failure: continue; the other calls' outputs were written)",
        "1) call #6: picky(7) — user_error after 1 attempt",
        "2) call #13: picky(14) — user_error",
        'functions/picky.py", line 3',  # the user's file and line, as blockx run names them
        "  failures  user_error 2",
    ):
        assert expected in followed.stderr, (expected, followed.stderr)
        assert expected in local.stderr, (expected, local.stderr)


@pytest.mark.slow
def test_follow_of_a_fast_fail_task_names_the_call_that_stopped_it(
    server: Server, tmp_path: Path
) -> None:
    path = task_file(tmp_path, "picky", PICKY, list(range(1, 20)), policy={"failure": "fast_fail"})
    followed = remote(server, "submit", path, "--follow")
    assert followed.returncode == 1, followed.stderr
    stopped = re.search(
        r"FAILED: call #(\d+) failed and stopped the task \(failure: fast_fail\); \d+ call\(s\) "
        r"were cancelled",
        followed.stderr,
    )
    assert stopped, followed.stderr
    reported = re.findall(r"\d+\) call #(\d+): picky", followed.stderr)
    assert stopped.group(1) in reported
    assert re.search(r"task picky: FAILED — 19 calls", followed.stderr)


@pytest.mark.slow
def test_a_calls_file_is_streamed_in_batches(server: Server, tmp_path: Path) -> None:
    write(
        tmp_path / "calls.jsonl",
        "".join(json.dumps({"function": "square", "args": [i]}) + "\n" for i in range(1000)),
    )
    path = task_file(tmp_path, "square", SQUARE, [], calls_file="calls.jsonl")
    with Client(server.url, TOKEN, batch_lines=100) as c:
        task = c.submit(path)  # 10 POSTs of 100 calls, then close
        rows = list(task.rows())
        status = task.wait(timeout=120)
    assert status["streamed"] is True and status["closed"] is True
    assert status["calls"] == 1000 and status["state"] == "succeeded"
    assert sorted(r["x"] for r in rows) == list(range(1000))
    local = blockx("run", path, "--executors", "1")
    followed = remote(server, "submit", path, "--follow")
    assert followed.returncode == local.returncode == 0, followed.stderr
    assert followed.stdout == local.stdout


@pytest.mark.slow
def test_rows_survive_a_connection_cut_in_the_middle(client: Client, tmp_path: Path) -> None:
    path = task_file(tmp_path, "wide", WIDE, list(range(300)))
    task = client.submit(path)
    stream = task.rows()
    seen: list[tuple[int, int]] = []
    for row in stream:
        seen.append((row["x"], row["i"]))
        if len(seen) in (50, 2000):
            stream._break_connection()  # as a network failure would
    assert stream.reconnects >= 1, "the cut did not reach the stream"
    assert len(seen) == len(set(seen)) == 6000 and stream.position == 6000
    assert seen == [(r["x"], r["i"]) for r in task.rows()]  # the server's one stable order


@pytest.mark.slow
def test_tokens_and_unknown_ids_are_clear_refusals(server: Server, tmp_path: Path) -> None:
    with Client(server.url) as c, pytest.raises(ClientError, match="needs a token") as missing:
        c.tasks()
    assert missing.value.status == 401
    with Client(server.url, "nope") as c, pytest.raises(ClientError, match="refused") as wrong:
        c.tasks()
    assert wrong.value.status == 401
    with Client(server.url, TOKEN) as c, pytest.raises(ClientError) as unknown:
        c.task("t-0123456789abcdef").status()
    assert unknown.value.status == 404 and "t-0123456789abcdef" in str(unknown.value)
    cli = blockx("tasks", "--server", server.url)
    assert cli.returncode == 2 and "token" in cli.stderr and "Traceback" not in cli.stderr
    token_file = write(tmp_path / "tok", f"\n {TOKEN} \n")
    cli = blockx("tasks", "--server", server.url, "--token-file", token_file)
    assert cli.returncode == 0, cli.stderr
    for args in (("status", "t-0123456789abcdef"), ("rows", "nonsense"), ("cancel", "t-1")):
        cli = remote(server, *args)
        assert cli.returncode == 2 and "404" in cli.stderr, cli


@pytest.mark.slow
def test_status_tasks_rows_and_cancel_commands(
    server: Server, client: Client, tmp_path: Path
) -> None:
    done = client.submit(task_file(tmp_path, "square", SQUARE, [1, 2, 3]))
    done.wait(timeout=120)
    sleepy = client.submit(task_file(tmp_path, "sleepy", SLEEPY, [600]))
    status = remote(server, "status", done.id)
    assert status.returncode == 0 and json.loads(status.stdout)["state"] == "succeeded"
    rows = remote(server, "rows", done.id, "--after", "1")
    assert rows.returncode == 0 and len(rows.stdout.splitlines()) == 2
    listing = remote(server, "tasks")
    assert listing.stdout.split("\n", 1)[0].split() == [
        "ID", "TASK_ID", "INSTANCE", "STATE", "DONE/CALLS", "ROWS",
    ]  # fmt: skip
    assert re.search(rf"{done.id}\s+square\s+-\s+succeeded\s+3/3\s+3", listing.stdout)
    assert sleepy.id in listing.stdout
    succeeded = remote(server, "tasks", "--state", "succeeded")
    assert done.id in succeeded.stdout and sleepy.id not in succeeded.stdout
    cancel = remote(server, "cancel", sleepy.id)
    assert cancel.returncode == 0 and f"{sleepy.id}: cancel requested" in cancel.stdout
    assert sleepy.wait(timeout=120)["state"] == "cancelled"
    again = remote(server, "cancel", sleepy.id)
    assert again.returncode == 0 and "already cancelled; nothing changed" in again.stdout


@pytest.mark.slow
def test_a_server_refusal_of_a_submitted_dict_lists_its_problems(client: Client) -> None:
    bad = {
        "functions": {"f": {"source": "def _(x):\n    return x\n"}},
        "calls": [{"function": "f", "args": [1]}],
        "policy": {"max_attempts": "three"},
    }
    with pytest.raises(ClientError) as refused:
        client.submit(bad)
    assert refused.value.status == 400
    assert any("max_attempts" in p["path"] for p in refused.value.problems), refused.value
    assert "max_attempts" in str(refused.value)


@pytest.mark.slow
def test_the_async_client_does_the_same(server: Server, tmp_path: Path) -> None:
    square = task_file(tmp_path, "square", SQUARE, list(range(20)))
    wide = task_file(tmp_path, "wide", WIDE, list(range(100)))
    sleepy_task = task_file(tmp_path, "sleepy", SLEEPY, [600])
    write(
        tmp_path / "calls.jsonl",
        "".join(json.dumps({"function": "square", "args": [i]}) + "\n" for i in range(30)),
    )
    calls_task = task_file(tmp_path / "streamed", "square", SQUARE, [], calls_file="../calls.jsonl")

    async def scenario() -> None:
        async with AsyncClient(server.url, TOKEN) as c:
            task = await c.submit(square)
            rows = [row async for row in task.rows()]
            assert sorted(r["x"] for r in rows) == list(range(20))
            status = await task.wait(timeout=120)
            assert status["state"] == "succeeded" and status["rows"] == 20
            assert [r async for r in task.rows(after=15)] == rows[15:]
            assert await task.failures() == []
            assert task.id in [t["id"] for t in await c.tasks("succeeded")]

            cut = await c.submit(wide)
            stream = cut.rows()
            seen = []
            async for row in stream:
                seen.append((row["x"], row["i"]))
                if len(seen) == 50:
                    stream._break_connection()
            assert stream.reconnects >= 1 and len(set(seen)) == len(seen) == 2000

            async with AsyncClient(server.url, TOKEN, batch_lines=7) as small_batches:
                streamed = await small_batches.submit(calls_task)  # 5 POSTs, then close
                got = [row async for row in streamed.rows()]
                assert sorted(r["x"] for r in got) == list(range(30))
                assert (await streamed.status())["calls"] == 30

            sleepy = await c.submit(sleepy_task)
            await sleepy.cancel()
            assert (await sleepy.wait(timeout=120))["state"] == "cancelled"

            async with AsyncClient(server.url) as no_token:
                with pytest.raises(ClientError, match="token"):
                    await no_token.tasks()
            with pytest.raises(ClientError) as unknown:
                await c.task("t-0123456789abcdef").status()
            assert unknown.value.status == 404

    asyncio.run(scenario())


@pytest.mark.slow
def test_ctrl_c_stops_following_and_leaves_the_task_running(
    server: Server, client: Client, tmp_path: Path
) -> None:
    path = task_file(tmp_path, "sleepy", SLEEPY, [0, 600])
    env = clean_env(BLOCKX_SERVER=server.url, BLOCKX_TOKEN=TOKEN)
    proc = subprocess.Popen(
        [sys.executable, "-m", "blockx", "submit", str(path), "--follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline().decode()
        match = re.search(r"submitted (t-[0-9a-f]{16})", first)
        assert match, first
        task = client.task(match.group(1))
        deadline = time.monotonic() + 120
        while task.status()["state"] != "running" and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        err = proc.communicate(timeout=60)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert f"task {task.id} goes on on the server" in err.decode()
    assert f"blockx cancel {task.id}" in err.decode() and "Traceback" not in err.decode()
    assert task.status()["state"] == "running"  # not cancelled by the client going away
    task.cancel()
    assert task.wait(timeout=120)["state"] == "cancelled"


@pytest.mark.slow
def test_rows_survive_a_server_killed_and_restarted(tmp_path: Path) -> None:
    """kill -9 of the server mid-stream; while it is down the stream's reopenings are
    refused; once it is back (same port, same data dir) the stream goes on at
    ``?after=N``: every row once."""
    token_file = write(tmp_path / "token", TOKEN)
    token_file.chmod(0o600)
    port = _closed_port()
    first = Server(tmp_path / "data", token_file, port)
    servers = [first]
    try:
        with Client(first.url, TOKEN, reconnect_attempts=200) as c:
            task = c.submit(task_file(tmp_path, "staggered", STAGGERED, list(range(200))))
            stream = task.rows()
            seen: list[tuple[int, int]] = []
            restart: threading.Thread | None = None
            for row in stream:
                seen.append((row["x"], row["i"]))
                if len(seen) == 30:
                    first.kill()

                    def start_again() -> None:
                        servers.append(Server(tmp_path / "data", token_file, port))

                    restart = threading.Thread(target=start_again)
                    restart.start()
            assert restart is not None
            restart.join()
            assert stream.reconnects >= 1
            assert len(seen) == len(set(seen)) == 600
            assert sorted(seen) == [(x, i) for x in range(200) for i in range(3)]
            assert seen == [(r["x"], r["i"]) for r in task.rows()]
            assert task.wait(timeout=120)["state"] == "succeeded"
    finally:
        for running in servers:
            running.stop()


def test_the_summary_io_lines_are_those_of_blockx_run() -> None:
    """The io line and table rebuilt from ``IOStats.as_dict()`` (what the server stores)
    read exactly as ``blockx run`` prints them from the IOStats itself."""
    from blockx.cli.console import indent
    from blockx.cli.remote import remote_summary_text
    from blockx.worker.io.stats import IOStats

    stats = IOStats()
    reads = stats.operation("blockdb", "get_row")
    for seconds in (0.001, 0.004, 0.002):
        reads.record_call(seconds, failed=False)
    reads.record_cache_hit()
    reads.record_join()
    writes = stats.operation("blockdb", "upsert_rows")
    writes.record_call(0.0005, failed=True)
    writes.record_local_hits(2)
    status = {
        "task_id": "t",
        "state": "succeeded",
        "summary": {
            "task_id": "t",
            "exit_code": 0,
            "calls": 3,
            "succeeded": 3,
            "task_wall_time_s": 0.5,
            "calls_per_s": 6.0,
            "failures_by_kind": {},
            "io": json.loads(json.dumps(stats.as_dict())),
        },
    }
    text = remote_summary_text(status, 3, 2, 1.25).splitlines()
    totals = stats.totals()
    mean = totals["total_ms"] / totals["backend_calls"]
    expected_io = (
        f"  io        {totals['requests']} requests: {totals['backend_calls']} backend calls, "
        f"1 cached, 1 joined, 1 errors; backend calls "
        f"mean {mean:,.2f} ms, max {totals['max_ms']:,.2f} ms; 2 more answered in the executors"
    )
    assert text[0] == "task t: ok — 3 calls in 0.50 s (6 calls/s) on 2 executors"
    assert text[1] == "  calls     3 succeeded, 0 failed, 0 cancelled; 0 sub-calls; 0 retries"
    assert text[2:4] == [
        "  outputs   3 rows → stdout",
        "  cache     0 call-cache hits, 0 singleflight joins",
    ]
    assert text[4] == expected_io
    assert "\n".join(text[5:-1]) == indent(stats.format_table(), "            ")
    assert text[-1] == "  time      1.25 s wall (from submission to the last row)"
