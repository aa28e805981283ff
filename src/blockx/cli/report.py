"""How a ``blockx run`` ends: its outcome, its exit status and what it says about them.

Theory of operation
-------------------
The run (:mod:`blockx.cli.run`) fills one :class:`RunOutcome` as it goes —
the task's result, the signal that interrupted it, whether the output pipe
closed, the rows dropped, the IO statistics, the problems found while it ran
— and :func:`blockx.cli.run.run_command` turns it into an exit status and
the texts made here from the outcome and the task file (nothing here touches
the worker)::

    failure_report(spec, result)      every failed call (up to MAX_REPORTED): its
                                      call, kind, message and the stack of user code
    failure_records(spec, result)     the same as log records, one per failed call
                                      (--log-format json)
    summary_text(spec, outcome, ...)  the end-of-run summary on stderr
    summary_json(outcome, ...)        the same as data (--summary-json FILE)
    write_errors(path, spec, errors)  every failed call as JSON Lines (--errors FILE)

Locations of user code in messages and stacks go through
:meth:`blockx.cli.taskfile.TaskFile.user_locations` (the real file and line, not
the executor's ``<blockx:ID>``), and a stack in the report drops the frames
of BlockX's own code.

Exit status: :data:`EXIT_OK` every call succeeded; :data:`EXIT_FAILED` the
task failed or a call failed (every failed call is reported, up to
:data:`MAX_REPORTED`); :data:`EXIT_USAGE` bad input; 130/143 interrupted
(:data:`INTERRUPTED_STATUS`: the task is cancelled, its executors are
stopped); :data:`EXIT_SIGPIPE` the output pipe was closed.
"""

from __future__ import annotations

import collections
import json
import os
import re
import resource
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from blockx.cli.console import count_text, indent, plural
from blockx.cli.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_SIGPIPE, EXIT_USAGE, INTERRUPTED_STATUS
from blockx.cli.output import RowWriter
from blockx.cli.taskfile import TaskFile

__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_SIGPIPE",
    "EXIT_USAGE",
    "INTERRUPTED_STATUS",
    "MAX_ARGS_TEXT",
    "MAX_REPORTED",
    "RunOutcome",
    "collapse_repeats",
    "failure_records",
    "failure_report",
    "summary_json",
    "summary_text",
    "write_errors",
]

#: Failed calls shown in the report; the rest are counted ("… and N more").
MAX_REPORTED: Final = 20
#: Longest args text in the report.
MAX_ARGS_TEXT: Final = 200


@dataclass(slots=True)
class RunOutcome:
    """What one run left for the verdict: filled by :mod:`blockx.cli.run` while it runs."""

    result: Any = None
    interrupted: str | None = None
    output_closed: bool = False
    #: Rows not written: stdout was not read within blockx.cli.run_verdict.OUTPUT_GRACE_S after an
    #: interruption.
    rows_dropped: int = 0
    #: A streamed task: the calls its file holds (the pre-run check's count).
    calls_in_file: int | None = None
    io_stats: Any = None
    wall_s: float = 0.0
    problems: list[str] = field(default_factory=list)
    #: IO backends still busy after the task ended, abandoned (one line each).
    io_abandoned: list[str] = field(default_factory=list)
    #: A streamed task's calls file changed while it was read (a bad line): what was wrong.
    stream_problem: str | None = None
    #: The verdict's message when the stream read fewer calls than the file held (the run
    #: failed, however well its calls went).
    stream_short: str | None = None
    #: The exit status that goes with ``problems``.
    problem_status: int = EXIT_USAGE
    #: A cluster run (``--ray``): per-node figures ``{ray_node_id: {"calls": n, ...}}``
    #: and the calls dispatched again because their node was lost.
    nodes: dict[str, dict[str, Any]] | None = None
    node_lost: int = 0


def _json_text(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=repr)
    except (TypeError, ValueError):
        return repr(value)


def _args_text(args: Any) -> str:
    """The arguments as the function received them: a list is positional (``f(1, "x")``,
    no arguments ``f()``), anything else the one argument."""
    if type(args) is list:
        text = ", ".join(_json_text(arg) for arg in args)
    else:
        text = _json_text(args)
    if len(text) > MAX_ARGS_TEXT:
        text = text[: MAX_ARGS_TEXT - 1] + "…"
    return text


#: A path segment (``['d']``, ``[0]``, or a short run of them) repeated 4 times or more.
#: (Compiled on first use, by re's cache: only a failure report needs it.)
_REPEATED_PATH: Final = r"((?:\[[^\[\]\n]{1,40}\]){1,3}?)\1{3,}"


def collapse_repeats(text: str) -> str:
    """``$['d']['d']…`` (a value that contains itself, 254 levels deep) written once with
    its count: ``$['d']×254 (a value that contains itself?)``."""

    def once(match: re.Match[str]) -> str:
        unit = match.group(1)
        count = len(match.group(0)) // len(unit)
        return f"{unit}×{count} (a value that contains itself?)"

    return re.sub(_REPEATED_PATH, once, text)


def _calls_not_read(spec: TaskFile, result: Any, calls_in_file: int | None) -> int:
    """The calls of a streamed task's file that were never read (the task stopped first)."""
    if not spec.is_stream or calls_in_file is None:
        return 0
    return max(calls_in_file - int(result.stats.calls), 0)


def failure_report(
    spec: TaskFile, result: Any, *, limit: int = MAX_REPORTED, calls_in_file: int | None = None
) -> str:
    """The readable report of a task's failed calls (every one, up to ``limit``).

    ``calls_in_file``: a streamed task's line count, to say how many were not read."""
    header, blocks, more = _failure_parts(spec, result, limit=limit, calls_in_file=calls_in_file)
    lines = list(header)
    for _error, block in blocks:
        lines.append("")
        lines.extend(block)
    if more:
        lines.append("")
        lines.append(more)
    return "\n".join(lines)


def failure_records(
    spec: TaskFile, result: Any, *, limit: int = MAX_REPORTED, calls_in_file: int | None = None
) -> list[tuple[str, dict[str, Any]]]:
    """The failure report as log records (``--log-format json``): (message, fields) — the
    headline, then one per failed call (up to ``limit``: its ``call_id``, ``call_index``,
    ``function``, ``error_kind``, ``attempts``, ``error``; the message is the call's part
    of :func:`failure_report`), then how many more when there are."""
    header, blocks, more = _failure_parts(spec, result, limit=limit, calls_in_file=calls_in_file)
    task_id = result.task_id
    failure = result.failure
    records: list[tuple[str, dict[str, Any]]] = []
    if header:
        records.append(
            (
                "\n".join(header),
                {
                    "task_id": task_id,
                    "failure": None if failure is None else failure.kind,
                    "failed_calls": len(result.errors),
                },
            )
        )
    for error, block in blocks:
        records.append(
            (
                "\n".join(
                    line[3:] if line.startswith("   ") else line
                    for line in "\n".join(block).split("\n")
                ),
                {
                    "task_id": task_id,
                    "call_id": error.call_id,
                    "call_index": error.index,
                    "function": error.function_id,
                    "error_kind": error.kind,
                    "attempts": error.attempts,
                    "retryable": error.retryable,
                    "error": collapse_repeats(spec.user_locations(error.message or "")),
                },
            )
        )
    if more:
        records.append((more, {"task_id": task_id, "failed_calls": len(result.errors)}))
    return records


def _failure_parts(
    spec: TaskFile, result: Any, *, limit: int, calls_in_file: int | None
) -> tuple[list[str], list[tuple[Any, list[str]]], str | None]:
    """The report's headline lines, each reported call's lines, the "… and N more" line."""
    errors = list(result.errors)
    stats = result.stats
    not_read = _calls_not_read(spec, result, calls_in_file)
    unread = f"; {plural(not_read, 'call')} of {spec.calls_label} not read" if not_read else ""
    policy = spec.policy.get("failure", "fast_fail")
    header: list[str] = []
    failure = result.failure
    if failure is not None and failure.kind == "OUTPUT_BYTES_EXCEEDED":
        header.append(
            "FAILED: the outputs grew past max_output_bytes; the task was stopped "
            f"({failure.message})"
        )
    elif failure is not None and failure.kind == "CANCELLED":
        header.append(f"FAILED: the task was cancelled ({failure.message})")
    elif failure is not None and failure.kind == "CALL_FAILED":
        which = f"call #{failure.call_index}" if failure.call_index is not None else "a call"
        header.append(
            f"FAILED: {which} failed and stopped the task (failure: fast_fail); "
            f"{count_text(stats.cancelled)} call(s) were cancelled{unread}"
        )
    elif errors:
        header.append(
            f"FAILED: {count_text(len(errors))} of {count_text(stats.calls)} calls failed "
            f"(failure: {policy}; the other calls' outputs were written)"
        )
    elif failure is not None:
        header.append(f"FAILED: {failure.kind}: {failure.message}")
    blocks: list[tuple[Any, list[str]]] = []
    seen: dict[tuple[str, str, str], int] = {}
    for n, error in enumerate(errors[:limit], 1):
        attempts = f"{error.attempts} attempt{'s' if error.attempts != 1 else ''}"
        lines = [
            f"{n}) call #{error.index}: {error.function_id}({_args_text(error.args)}) — "
            f"{error.kind} after {attempts}"
        ]
        blocks.append((error, lines))
        message = collapse_repeats(spec.user_locations(error.message or ""))
        stack = (
            collapse_repeats(_user_frames(spec.user_locations(error.stack))) if error.stack else ""
        )
        key = (error.kind, message, stack)
        if key in seen:
            lines.append(f"   the same error and stack as {seen[key]})")
            continue
        seen[key] = n
        last_stack_line = stack.rstrip("\n").rsplit("\n", 1)[-1].strip() if stack else ""
        tail = message.split(": ", 1)[-1].strip()
        if message and not (last_stack_line and tail and last_stack_line.endswith(tail)):
            lines.append(indent(message, "   "))
        if stack:
            lines.append(indent(stack, "   "))
        captured = result.debug_output.get(error.index) if result.debug_output else None
        if captured:
            lines.append("   output of the call (policy.debug):")
            lines.append(indent(captured, "   | "))
    more = (
        f"… and {count_text(len(errors) - limit)} more failed call(s) (--errors FILE lists all)"
        if len(errors) > limit
        else None
    )
    return header, blocks, more


#: BlockX's own package directory (``blockx/``, the parent of this ``blockx/cli/``): its
#: frames are left out of a failure report.
_PACKAGE_DIR: Final = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _user_frames(stack: str) -> str:
    """A traceback without the frames of BlockX's own code (the SDK under ``Table`` & co.)."""
    out: list[str] = []
    skipping = False
    for line in stack.splitlines():
        stripped = line.lstrip()
        if stripped.startswith('File "'):
            path = stripped[6:].split('"', 1)[0]
            skipping = os.path.abspath(path).startswith(_PACKAGE_DIR + os.sep)
            if not skipping:
                out.append(line)
            continue
        if skipping and line.startswith("    ") and not line.startswith("Traceback"):
            continue  # the source line (and caret) of a skipped frame
        skipping = False
        out.append(line)
    return "\n".join(out) + ("\n" if stack.endswith("\n") else "")


def _failures_by_kind(errors: Sequence[Any]) -> str:
    counts = collections.Counter(e.kind for e in errors)
    return ", ".join(f"{kind} {count_text(n)}" for kind, n in counts.most_common())


def _mb(kilobytes: int) -> str:
    return f"{kilobytes / 1024:,.0f} MB"


def _peak_rss_kb() -> tuple[int, int]:
    """(this process's peak RSS, the largest reaped child's) in KiB (Linux units)."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if sys.platform == "darwin":  # pragma: no cover - bytes there
        own //= 1024
        children //= 1024
    return own, children


def summary_text(spec: TaskFile, outcome: RunOutcome, sink: RowWriter, executors: int) -> str:
    """The end-of-run summary (stderr): status, calls, failures, outputs, cache, IO, time."""
    result = outcome.result
    stats = result.stats
    if outcome.interrupted:
        status = f"interrupted ({outcome.interrupted})"
    elif result.success and not result.errors and outcome.stream_short is None:
        status = "ok"
    else:
        status = "FAILED"
    not_read = _calls_not_read(spec, result, outcome.calls_in_file)
    calls = plural(stats.calls, "call")
    if not_read:  # the stream stopped early: N is what was read, not what the file holds
        calls = f"{count_text(stats.calls)} of {plural(stats.calls + not_read, 'call')}"
    lines = [
        f"task {result.task_id}: {status} — {calls} in "
        f"{stats.wall_time_s:,.2f} s ({stats.calls_per_s:,.0f} calls/s) on {executors} "
        f"executor{'s' if executors != 1 else ''}",
        f"  calls     {count_text(stats.succeeded)} succeeded, {count_text(stats.failed)} failed, "
        f"{count_text(stats.cancelled)} cancelled; {count_text(stats.subcalls)} sub-calls; "
        f"{count_text(stats.retries)} retries",
    ]
    if not_read:
        lines.append(
            f"  stream    stopped after {plural(stats.calls, 'call')} read; the rest of "
            f"{spec.calls_label} ({plural(not_read, 'call')}) was not read"
        )
    if result.errors:
        lines.append(f"  failures  {_failures_by_kind(result.errors)}")
    outputs = f"  outputs   {plural(sink.rows, 'row')} → {sink.label}"
    if outcome.rows_dropped:
        outputs += f"; {count_text(outcome.rows_dropped)} not written ({sink.label} was not read)"
    lines.append(outputs)
    lines.append(
        f"  cache     {count_text(stats.cache_hits)} call-cache hits, "
        f"{count_text(stats.singleflight_hits)} singleflight joins"
    )
    io_stats = outcome.io_stats
    if io_stats is not None and len(io_stats):
        totals = io_stats.totals()
        calls = totals["backend_calls"]
        mean = totals["total_ms"] / calls if calls else 0.0
        # Reads cancelled because nobody waited for them any more: only when there were some.
        abandoned = totals["abandoned"]
        gone = f", {count_text(abandoned)} abandoned" if abandoned else ""
        # Reads the executors answered themselves (immutable answers they kept): only when
        # there were some; they never reached the worker, so they are not among the requests.
        local = totals["local_hits"]
        kept = f"; {count_text(local)} more answered in the executors" if local else ""
        # Reads a rate limit slowed down (the node's 429s or io.rpc.max_requests_per_s).
        throttled = totals.get("throttled", 0)
        slowed = f", {count_text(throttled)} throttled" if throttled else ""
        lines.append(
            f"  io        {count_text(totals['requests'])} requests: "
            f"{count_text(calls)} backend calls, {count_text(totals['cache_hits'])} cached, "
            f"{count_text(totals['singleflight_joins'])} joined{gone}, "
            f"{count_text(totals['errors'])} errors{slowed}; backend calls mean {mean:,.2f} ms, "
            f"max {totals['max_ms']:,.2f} ms{kept}"
        )
        lines.append(indent(io_stats.format_table(), "            "))
    else:
        lines.append("  io        none")
    for note in outcome.io_abandoned:
        lines.append(f"  abandoned {note}")
    if outcome.nodes is not None:  # a cluster run (docs/cluster.md)
        lines.append(
            f"  nodes     {plural(len(outcome.nodes), 'Ray node')}; "
            f"{plural(outcome.node_lost, 'call')} dispatched again (node_lost)"
        )
        for node_id, n in sorted(outcome.nodes.items()):
            gone = "" if n.get("alive", True) else ", lost"
            lines.append(
                f"            {node_id[:12]}  {count_text(n.get('calls', 0))} calls in "
                f"{count_text(n.get('batches', 0))} batches on {n.get('executors', 0)} "
                f"executors{gone}"
            )
    own, children = _peak_rss_kb()
    lines.append(
        f"  time      {outcome.wall_s:,.2f} s wall; "
        f"peak RSS: worker {_mb(own)}, largest executor {_mb(children)}"
    )
    return "\n".join(lines)


def summary_json(outcome: RunOutcome, sink: RowWriter, exit_code: int) -> dict[str, Any]:
    """The summary as data, for ``--summary-json FILE`` (``outcome.result`` may be None)."""
    result = outcome.result
    own, children = _peak_rss_kb()
    data: dict[str, Any] = {
        "exit_code": exit_code,
        "interrupted": outcome.interrupted,
        "output_rows": sink.rows,
        "output_bytes": sink.bytes,
        "output_rows_dropped": outcome.rows_dropped,
        "wall_time_s": round(outcome.wall_s, 4),
        "worker_peak_rss_bytes": own * 1024,
        "executor_peak_rss_bytes": children * 1024,
    }
    if result is not None:
        stats = result.stats
        data.update(
            task_id=result.task_id,
            success=result.success,
            failure=None if result.failure is None else result.failure.kind,
            calls=stats.calls,
            calls_in_file=outcome.calls_in_file,
            succeeded=stats.succeeded,
            failed=stats.failed,
            cancelled=stats.cancelled,
            retries=stats.retries,
            subcalls=stats.subcalls,
            cache_hits=stats.cache_hits,
            singleflight_hits=stats.singleflight_hits,
            io_calls=stats.io_calls,
            task_wall_time_s=round(stats.wall_time_s, 4),
            calls_per_s=round(stats.calls_per_s, 1),
            failures_by_kind=dict(collections.Counter(e.kind for e in result.errors)),
        )
    if outcome.io_stats is not None:
        data["io"] = outcome.io_stats.as_dict()
    data["io_abandoned"] = list(outcome.io_abandoned)
    if outcome.nodes is not None:  # a cluster run: {ray_node_id: {"calls": n, ...}}
        data["nodes"] = outcome.nodes
        data["node_lost"] = outcome.node_lost
    return data


def write_errors(path: str, spec: TaskFile, errors: Sequence[Any]) -> None:
    """Every failed call as one JSON line of ``path`` (``--errors FILE``), user locations real."""
    with open(path, "w", encoding="utf-8") as f:
        for e in errors:
            record = {
                "index": e.index,
                "function": e.function_id,
                "args": e.args,
                "kind": e.kind,
                "message": collapse_repeats(spec.user_locations(e.message or "")),
                "stack": spec.user_locations(e.stack) if e.stack else None,
                "attempts": e.attempts,
                "retryable": e.retryable,
            }
            f.write(json.dumps(record, ensure_ascii=False, default=repr) + "\n")
