"""``blockx run``'s last step, the verdict: the failure report, the summary, ``--errors``
and ``--summary-json``, and the exit status (see :mod:`blockx.cli.run`, whose run --
and ``blockx run --ray``'s, :mod:`blockx.cli.run_cluster` -- fills the
:class:`~blockx.cli.report.RunOutcome` read here). The texts themselves are
:mod:`blockx.cli.report`'s.
"""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Final

from blockx.cli.console import Console, count_text, plural, print_problems
from blockx.cli.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_SIGPIPE, INTERRUPTED_STATUS
from blockx.cli.run_input import Checked, RunOptions

if TYPE_CHECKING:
    from blockx.cli.output import RowWriter
    from blockx.cli.report import RunOutcome
    from blockx.cli.taskfile import TaskFile

__all__ = ["OUTPUT_GRACE_S", "verdict"]

#: After an interruption, how long rows still queued may take to be written (s); then
#: they are dropped (a reader that does not drain cannot hold the process).
OUTPUT_GRACE_S: Final = 2.0


def verdict(options: RunOptions, console: Console, c: Checked, outcome: RunOutcome) -> int:
    """Step 3: the failure report, the summary, ``--errors``/``--summary-json``; the exit
    status (also the verdict of a cluster run: :mod:`blockx.cli.run_cluster`)."""
    spec, total, settings, sink = c.spec, c.total, c.settings, c.sink
    executors = settings.worker.pool.executor_count
    from blockx.cli.report import failure_records, failure_report, summary_json, summary_text

    outcome.calls_in_file = total if spec.is_stream else None
    result = outcome.result
    if outcome.output_closed and options.output is None:
        try:  # nothing more may reach the closed pipe, not even at interpreter exit
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except OSError:  # pragma: no cover
            pass
        code = INTERRUPTED_STATUS.get(outcome.interrupted or "", EXIT_SIGPIPE)
        why = f"interrupted ({outcome.interrupted}), and " if outcome.interrupted else ""
        console.print(
            f"blockx: {why}stdout's reader went away after {plural(sink.rows, 'row')}: "
            f"the task was cancelled (exit status {code})"
        )
        if result is not None:
            _write_files(options, console, spec, outcome, sink, code)
        return code
    if outcome.problems:
        print_problems(console, outcome.problems)
        return outcome.problem_status
    if outcome.rows_dropped:
        at_most = "" if sink.drop_count_exact else "at most "
        torn = "; the last line written is cut short" if sink.torn else ""
        console.print(
            f"blockx: warning: {sink.label} was not read for {OUTPUT_GRACE_S:.0f} s after the "
            f"interruption: {at_most}{plural(outcome.rows_dropped, 'row')} dropped, not "
            f"written{torn}"
        )
    if result is None:
        console.print("blockx: error: the task did not end in time after it was cancelled")
        return INTERRUPTED_STATUS.get(outcome.interrupted or "", EXIT_FAILED)
    short_stream = outcome.stream_short = _short_stream(spec, outcome, total)
    if outcome.interrupted:
        code = INTERRUPTED_STATUS[outcome.interrupted]
    elif result.success and not result.errors and short_stream is None:
        code = EXIT_OK
    else:
        code = EXIT_FAILED
    if short_stream is not None:
        console.print(f"blockx: error: {short_stream}")
    # The failure report: for failed calls, or a task that failed by itself (a stream cut
    # short has said why in its line above).
    if (code == EXIT_FAILED and (short_stream is None or result.errors)) or (
        outcome.interrupted and result.errors
    ):
        if console.json:
            for message, fields in failure_records(
                spec, result, calls_in_file=outcome.calls_in_file
            ):
                console.record("error", message, fields, logger="blockx.cli.report")
        else:
            console.print(failure_report(spec, result, calls_in_file=outcome.calls_in_file))
            console.print()
    if not options.quiet:
        text = summary_text(spec, outcome, sink, executors)
        if console.json:  # one record: the headline, the figures as data under "summary"
            data = summary_json(outcome, sink, code)
            data["stderr_lines_dropped"] = _lines_dropped(console)
            fields = {"task_id": result.task_id, "summary": data}
            console.record("info", text.split("\n", 1)[0], fields, logger="blockx.cli.summary")
        else:
            console.print(text)
    return _write_files(options, console, spec, outcome, sink, code)


def _lines_dropped(console: Console) -> int:
    """Lines of log and print() output dropped so far because stderr was not read."""
    return 0 if console.writer is None else console.writer.lines_dropped


def _short_stream(spec: TaskFile, outcome: RunOutcome, total: int) -> str | None:
    """Why a streamed task read fewer calls than its file held when it was checked (the
    file changed while it was read), or None. A task that stopped by itself (fast_fail,
    its deadline, a signal) reads less on purpose: that is not this."""
    result = outcome.result
    if not spec.is_stream or result is None or outcome.interrupted:
        return None
    read = int(result.stats.calls)
    label = spec.calls_label
    if outcome.stream_problem is not None:
        return (
            f"{label} changed while it was read — "
            f"{outcome.stream_problem.removeprefix(label + ': ')}: the task was "
            f"stopped after {plural(read, 'call')} read of the {count_text(total)} checked"
        )
    if result.failure is None and read < total:
        return (
            f"{label} changed while it was read: it ended after {plural(read, 'call')}, "
            f"but held {count_text(total)} when it was checked"
        )
    return None


def _write_files(
    options: RunOptions,
    console: Console,
    spec: TaskFile,
    outcome: RunOutcome,
    sink: RowWriter,
    code: int,
) -> int:
    """``--errors`` and ``--summary-json`` (checked before the run; a failure now — a full
    disk — is one line, and a successful run's status becomes 1). Returns the status."""
    from blockx.cli.report import summary_json, write_errors

    result = outcome.result
    if options.errors_out is not None and result is not None:
        try:
            write_errors(options.errors_out, spec, result.errors)
        except OSError as exc:
            console.print(f"blockx: error: --errors {options.errors_out}: {exc.strerror or exc}")
            code = EXIT_FAILED if code == EXIT_OK else code
    if options.summary_json is not None:
        data = summary_json(outcome, sink, code)
        data["stderr_lines_dropped"] = _lines_dropped(console)
        try:
            with open(options.summary_json, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=2)
                f.write("\n")
        except OSError as exc:
            console.print(
                f"blockx: error: --summary-json {options.summary_json}: {exc.strerror or exc}"
            )
            code = EXIT_FAILED if code == EXIT_OK else code
    return code
