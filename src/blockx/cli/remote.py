"""``blockx submit / status / rows / cancel / tasks``: the client of ``blockx serve``.

Theory of operation
-------------------
Each command makes one :class:`blockx.client.Client` (``--server`` else
``$BLOCKX_SERVER`` else ``http://127.0.0.1:8470``; the token from ``--token-file``,
its content with surrounding whitespace stripped, else ``$BLOCKX_TOKEN``) and
speaks the HTTP API of docs/serve.md; nothing here imports the worker.

``blockx submit TASK`` reads and checks the task file here (the messages of
``blockx validate``; exit 2), uploads it (a calls file in batches) and prints the
task's id. With ``--follow`` the id goes to stderr and stdout carries the rows
only, byte for byte as the server sends them (the lines ``blockx run`` writes),
through a :class:`blockx.client.RowStream` that reopens at ``?after=N`` when the
connection drops. When the task ends, stderr gets the failure report and the
summary in the shape ``blockx run`` prints them (:func:`remote_summary_text`; the
report is :func:`blockx.cli.report.failure_report` itself, fed the server's
``/failures`` records), and the exit status is ``blockx run``'s: 0 every call
succeeded, 1 the task or a call failed, 2 a bad task file (here, or the server's
400), 130 on Ctrl-C — which leaves the task running on the server and says so.

Errors are one ``blockx: error:`` paragraph, never a traceback: exit 2 for what
the user can fix (usage, a 4xx answer: bad task, unknown id, token), 1 when the
server cannot be reached or fails (5xx).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any, Final

from blockx.cli.console import count_text, indent, plural
from blockx.cli.exit_codes import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_SIGPIPE,
    EXIT_USAGE,
    INTERRUPTED_STATUS,
)
from blockx.client import Client, ClientError, RemoteTask, TaskUpload, prepare_upload
from blockx.client.common import FINISHED_STATES

__all__ = ["REMOTE_COMMANDS", "remote_command", "remote_summary_text"]

#: The commands this module runs.
REMOTE_COMMANDS: Final = ("submit", "status", "rows", "cancel", "tasks")


class _Usage(Exception):
    """A problem with the command line or its files (exit 2)."""


def _err(text: str) -> None:
    print(f"blockx: error: {text}", file=sys.stderr, flush=True)


def _client(args: argparse.Namespace) -> Client:
    token = None
    if args.token_file:
        try:
            with open(args.token_file, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as exc:
            raise _Usage(f"--token-file {args.token_file}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise _Usage(f"--token-file {args.token_file}: not UTF-8 text") from None
        if not token:
            raise _Usage(f"--token-file {args.token_file}: the file is empty")
    try:
        return Client(args.server, token)
    except ValueError as exc:
        raise _Usage(f"--server: {exc}") from None


def _error_status(exc: ClientError) -> int:
    """4xx: something the user can fix (2); no answer, 5xx or 429 (the queue is full, try
    later): 1."""
    if exc.status is not None and 400 <= exc.status < 500 and exc.status != 429:
        return EXIT_USAGE
    return EXIT_FAILED


def remote_command(args: argparse.Namespace) -> int:
    """Run ``args.command`` (one of :data:`REMOTE_COMMANDS`); the exit status."""
    try:
        client = _client(args)
        with client:
            if args.command == "submit":
                return _submit(client, args)
            if args.command == "status":
                print(json.dumps(client.task(args.id).status(), indent=2))
                return EXIT_OK
            if args.command == "rows":
                return _rows(client.task(args.id), args.after)
            if args.command == "cancel":
                return _cancel(client.task(args.id))
            return _tasks(client, args.state)
    except _Usage as exc:
        _err(str(exc))
        return EXIT_USAGE
    except ClientError as exc:
        _err(str(exc))
        return _error_status(exc)
    except KeyboardInterrupt:
        print("blockx: interrupted", file=sys.stderr)
        return INTERRUPTED_STATUS["SIGINT"]


# --- blockx status / rows / cancel / tasks ------------------------------------------------------


class _Copied:
    """Rows written to stdout so far (whole lines the write and flush returned from): where
    to read on after an interruption."""

    __slots__ = ("rows",)

    def __init__(self, rows: int = 0) -> None:
        self.rows = rows

    def __repr__(self) -> str:
        return f"_Copied(rows={self.rows})"


def _copy_rows(stream: Any, out: IO[bytes], copied: _Copied) -> None:
    """Write a row stream's blocks to ``out`` as they come, counting them in ``copied``."""
    for block in stream:
        out.write(block)
        out.flush()
        copied.rows += block.count(b"\n")


def _stdout_gone() -> int:
    """stdout's reader went away: nothing more may reach it, not even at exit."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except OSError:  # pragma: no cover
        pass
    return EXIT_SIGPIPE


def _rows(task: RemoteTask, after: int) -> int:
    stream = task.row_blocks(after)
    try:
        _copy_rows(stream, sys.stdout.buffer, _Copied(after))
    except BrokenPipeError:
        stream.close()
        return _stdout_gone()
    return EXIT_OK


def _cancel(task: RemoteTask) -> int:
    before = task.status()
    if before.get("state") in FINISHED_STATES:
        print(f"{task.id}: already {before.get('state')}; nothing changed")
        return EXIT_OK
    status = task.cancel()
    print(f"{task.id}: cancel requested (state: {status.get('state')})")
    return EXIT_OK


def _tasks(client: Client, state: str | None) -> int:
    tasks = client.tasks(state)
    header = ("ID", "TASK_ID", "INSTANCE", "STATE", "DONE/CALLS", "ROWS")
    table = [header] + [
        (
            str(t.get("id")),
            str(t.get("task_id") or "-"),
            str(t.get("instance") or "-"),
            str(t.get("state")),
            f"{t.get('done', 0)}/{t.get('calls', 0)}" + ("+" if not t.get("closed", True) else ""),
            str(t.get("rows", 0)),
        )
        for t in tasks
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return EXIT_OK


# --- blockx submit ------------------------------------------------------------------------------


def _submit(client: Client, args: argparse.Namespace) -> int:
    from blockx.cli.taskfile import SpecError

    started = time.monotonic()
    try:
        upload = prepare_upload(args.task)
    except SpecError as exc:
        for problem in exc.problems:
            _err(problem)
        return EXIT_USAGE
    for warning in upload.warnings:
        print(f"blockx: warning: {warning}", file=sys.stderr)
    if not args.follow:
        task = client.submit_upload(upload)
        print(task.id, flush=True)
        return EXIT_OK
    task = client.create(upload)
    uploader = _Uploader(client, task, upload) if upload.calls_file is not None else None
    stream = task.row_blocks()
    copied = _Copied()
    try:
        named = f" (task_id {task.task_id})" if task.task_id else ""
        print(f"blockx: submitted {task.id}{named} to {client.url}", file=sys.stderr, flush=True)
        _copy_rows(stream, sys.stdout.buffer, copied)
    except BrokenPipeError:
        stream.close()
        code = _stdout_gone()
        print(
            f"blockx: stdout's reader went away after {plural(copied.rows, 'row')}; task "
            f"{task.id} goes on on the server (`blockx cancel {task.id}` stops it)",
            file=sys.stderr,
        )
        return code
    except KeyboardInterrupt:
        stream.close()
        if uploader is not None and uploader.alive:
            try:  # its calls only half sent, the task would wait for the rest forever
                task.cancel()
            except ClientError:
                pass
            print(
                f"blockx: interrupted while the calls were being sent: task {task.id} was "
                "cancelled",
                file=sys.stderr,
            )
            return INTERRUPTED_STATUS["SIGINT"]
        print(
            f"blockx: interrupted after {plural(copied.rows, 'row')}: task {task.id} goes "
            f"on on the server (`blockx rows {task.id} --after {copied.rows}` reads on, "
            f"`blockx cancel {task.id}` stops it)",
            file=sys.stderr,
        )
        return INTERRUPTED_STATUS["SIGINT"]
    error = uploader.join() if uploader is not None else None
    if error is not None:
        _err(f"sending the calls of {task.id} failed (the task was cancelled): {error}")
        return _error_status(error) if isinstance(error, ClientError) else EXIT_FAILED
    status = task.wait()
    wall_s = time.monotonic() - started
    return _verdict(client, task, upload, status, copied.rows, wall_s, args.quiet)


class _Uploader:
    """A calls file sent in a thread of its own, on a :class:`Client` of its own, while the
    main thread follows the rows: the first rows come while the rest is still being sent.
    On a failure the task is cancelled (so the row stream ends) and ``error`` says why."""

    def __init__(self, client: Client, task: RemoteTask, upload: TaskUpload) -> None:
        import threading

        assert upload.calls_file is not None
        self.error: BaseException | None = None
        self._own = Client(
            client.url,
            client.token,
            timeout=client.timeout,
            reconnect_attempts=client.reconnect_attempts,
            batch_lines=client.batch_lines,
            batch_bytes=client.batch_bytes,
        )
        self._calls_file = upload.calls_file
        self._task = task
        self._thread = threading.Thread(target=self._run, name="blockx-upload", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            with self._own:
                self._own.upload_calls(self._task, self._calls_file)
        except BaseException as exc:  # reported by the main thread
            self.error = exc

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def join(self) -> BaseException | None:
        self._thread.join()
        return self.error


def _verdict(
    client: Client,
    task: RemoteTask,
    upload: TaskUpload,
    status: Mapping[str, Any],
    rows: int,
    wall_s: float,
    quiet: bool,
) -> int:
    """The failure report and the summary on stderr, as ``blockx run`` ends; the status."""
    summary = status.get("summary") or {}
    if "exit_code" in summary:
        code = int(summary["exit_code"])
    else:
        ok = status.get("state") == "succeeded" and not status.get("failed")
        code = EXIT_OK if ok else EXIT_FAILED
    if code != EXIT_OK:
        errors = task.failures()
        if upload.spec is not None:
            from blockx.cli.report import failure_report

            result = _remote_result(status, errors)
            print(failure_report(upload.spec, result), file=sys.stderr)
            print(file=sys.stderr)
    if not quiet:
        executors: int | None
        try:
            executors = int(client.ready()["executors"])
        except (ClientError, KeyError, TypeError, ValueError):
            executors = None
        print(remote_summary_text(status, rows, executors, wall_s), file=sys.stderr)
    return code


@dataclass(frozen=True, slots=True)
class _RemoteError:
    """A ``/failures`` record with the attribute names of the worker's ``CallFailure``."""

    index: int
    function_id: str
    args: Any
    kind: str
    message: str
    stack: str | None
    attempts: int
    retryable: bool


@dataclass(frozen=True, slots=True)
class _RemoteFailure:
    kind: str
    message: str
    call_index: int | None


@dataclass(frozen=True, slots=True)
class _RemoteStats:
    calls: int
    cancelled: int


@dataclass(frozen=True, slots=True)
class _RemoteResult:
    """What :func:`blockx.cli.report.failure_report` reads of a ``TaskResult``."""

    errors: list[_RemoteError]
    stats: _RemoteStats
    failure: _RemoteFailure | None
    debug_output: None = None


def _remote_result(status: Mapping[str, Any], records: Sequence[Mapping[str, Any]]) -> Any:
    errors = [
        _RemoteError(
            index=int(r.get("index", 0)),
            function_id=str(r.get("function")),
            args=r.get("args"),
            kind=str(r.get("kind")),
            message=str(r.get("message") or ""),
            stack=r.get("stack"),
            attempts=int(r.get("attempts") or 1),
            retryable=bool(r.get("retryable")),
        )
        for r in records
    ]
    failure = None
    raw = status.get("failure")
    if isinstance(raw, Mapping):
        message = str(raw.get("message") or "")
        failure = _RemoteFailure(str(raw.get("kind")), message, _failing_call(raw, errors))
    stats = _RemoteStats(
        calls=int(status.get("calls") or 0), cancelled=int(status.get("cancelled") or 0)
    )
    return _RemoteResult(errors=errors, stats=stats, failure=failure)


def _failing_call(failure: Mapping[str, Any], errors: Sequence[_RemoteError]) -> int | None:
    """The index of the call that stopped a task (fast_fail), for the report's first line.

    The status's ``failure`` may say (``call_index``); else its message names the call
    (``call TASK#N/c13 failed: ...``), believed when a failure record has that index;
    else a task with one failed call; else unknown (the report says "a call")."""
    given = failure.get("call_index")
    if isinstance(given, int):
        return given
    indices = {e.index for e in errors}
    match = re.search(r"/c(\d+) failed", str(failure.get("message") or ""))
    if match and int(match.group(1)) in indices:
        return int(match.group(1))
    return errors[0].index if len(errors) == 1 else None


def remote_summary_text(
    status: Mapping[str, Any], rows: int, executors: int | None, wall_s: float
) -> str:
    """The end-of-run summary ``blockx run`` prints, from a finished task's status (its
    ``summary`` figures): the same lines, less what only the local process knows (peak
    memory)."""
    summary: Mapping[str, Any] = status.get("summary") or {}

    def n(key: str) -> int:
        value = summary.get(key, status.get(key))
        return int(value) if isinstance(value, (int, float)) else 0

    ok = summary.get("exit_code", 1 if status.get("state") != "succeeded" else 0) == 0
    on = f" on {executors} executor{'s' if executors != 1 else ''}" if executors else ""
    wall = float(summary.get("task_wall_time_s") or 0.0)
    rate = float(summary.get("calls_per_s") or 0.0)
    task_id = summary.get("task_id") or status.get("task_id") or status.get("id")
    lines = [
        f"task {task_id}: {'ok' if ok else 'FAILED'} — {plural(n('calls'), 'call')} in "
        f"{wall:,.2f} s ({rate:,.0f} calls/s){on}",
        f"  calls     {count_text(n('succeeded'))} succeeded, {count_text(n('failed'))} failed, "
        f"{count_text(n('cancelled'))} cancelled; {count_text(n('subcalls'))} sub-calls; "
        f"{count_text(n('retries'))} retries",
    ]
    by_kind = summary.get("failures_by_kind") or {}
    if by_kind:
        counts = Counter({str(k): int(v) for k, v in by_kind.items()})
        text = ", ".join(f"{kind} {count_text(c)}" for kind, c in counts.most_common())
        lines.append(f"  failures  {text}")
    lines.append(f"  outputs   {plural(rows, 'row')} → stdout")
    lines.append(
        f"  cache     {count_text(n('cache_hits'))} call-cache hits, "
        f"{count_text(n('singleflight_hits'))} singleflight joins"
    )
    lines.extend(_io_lines(summary.get("io")))
    lines.append(f"  time      {wall_s:,.2f} s wall (from submission to the last row)")
    return "\n".join(lines)


def _io_lines(io: Any) -> list[str]:
    """The summary's ``io`` line and table (``blockx run``'s) from ``IOStats.as_dict()``."""
    operations = io.get("operations") if isinstance(io, Mapping) else None
    totals = io.get("totals") if isinstance(io, Mapping) else None
    if not operations or not isinstance(totals, Mapping):
        return ["  io        none"]
    calls = int(totals.get("backend_calls", 0))
    mean = float(totals.get("total_ms", 0.0)) / calls if calls else 0.0
    abandoned = int(totals.get("abandoned", 0))
    gone = f", {count_text(abandoned)} abandoned" if abandoned else ""
    local = int(totals.get("local_hits", 0))
    kept = f"; {count_text(local)} more answered in the executors" if local else ""
    line = (
        f"  io        {count_text(int(totals.get('requests', 0)))} requests: "
        f"{count_text(calls)} backend calls, {count_text(int(totals.get('cache_hits', 0)))} "
        f"cached, {count_text(int(totals.get('singleflight_joins', 0)))} joined{gone}, "
        f"{count_text(int(totals.get('errors', 0)))} errors; backend calls mean {mean:,.2f} ms, "
        f"max {float(totals.get('max_ms', 0.0)):,.2f} ms{kept}"
    )
    header = (
        f"{'backend/operation':<32} {'requests':>9} {'calls':>8} {'cached':>8} "
        f"{'joined':>7} {'abandoned':>9} {'errors':>7} {'p50 ms':>8} {'p95 ms':>8} "
        f"{'max ms':>8}" + (f" {'in executor':>11}" if local else "")
    )
    table = [header]
    for s in operations:
        name = f"{s.get('backend')}/{s.get('operation')}"
        table.append(
            f"{name:<32} {s.get('requests', 0):>9} {s.get('backend_calls', 0):>8} "
            f"{s.get('cache_hits', 0):>8} {s.get('singleflight_joins', 0):>7} "
            f"{s.get('abandoned', 0):>9} {s.get('errors', 0):>7} "
            f"{float(s.get('p50_ms', 0.0)):>8.2f} {float(s.get('p95_ms', 0.0)):>8.2f} "
            f"{float(s.get('max_ms', 0.0)):>8.2f}"
            + (f" {s.get('local_hits', 0):>11}" if local else "")
        )
    return [line, indent("\n".join(table), "            ")]
