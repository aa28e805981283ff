"""``blockx run``'s first step: everything that can be wrong with the input, checked
before anything runs (see :mod:`blockx.cli.run` for the three steps).

:func:`check_input` loads the task file and its settings (the calls file
scanned), checks the output paths, warns about functions that cannot run, and
opens the output: its problems are printed and :data:`EXIT_USAGE` returned, or
a :class:`Checked` is handed to the run. :func:`early_worker_config` is the
worker's configuration before the task file is read (the executors start while
the input is checked); :func:`check_input_interruptibly` runs the check on the
event loop with Ctrl-C raising at once.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from blockx.cli.console import Console, indent, print_problems
from blockx.cli.exit_codes import EXIT_USAGE
from blockx.cli.settings import Settings, UsageError, build_settings, load_task_and_settings

if TYPE_CHECKING:
    from blockx.cli.output import RowWriter
    from blockx.cli.report import RunOutcome
    from blockx.cli.taskfile import TaskFile
    from blockx.worker.config import WorkerConfig
    from blockx.worker.pool.early import EarlyExecutors

__all__ = [
    "Checked",
    "RunOptions",
    "calls_until_a_bad_line",
    "check_input",
    "check_input_interruptibly",
    "early_worker_config",
    "start_executors",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOptions:
    task: str
    output: str | None = None
    executors: int | None = None
    config: str | None = None
    sets: Sequence[str] = ()
    quiet: bool = False
    verbose: bool = False
    errors_out: str | None = None
    summary_json: str | None = None
    progress: bool | None = None  # None: when stderr is a terminal
    metrics_port: int | None = None  # serve /metrics on 127.0.0.1 while the task runs
    log_format: str | None = None  # json | text; None: BLOCKX_LOG_FORMAT, else text
    trace_file: str | None = None  # --trace-file (else $BLOCKX_TRACE_FILE; None: no file)
    ray: str | None = None  # --ray auto|ADDRESS: one worker per Ray node (docs/cluster.md)
    executors_per_node: int | None = None  # --executors-per-node (None: the node's CPUs)


@dataclass(frozen=True, slots=True)
class Checked:
    """What step 1 leaves for the run: the checked task file, its number of calls, the
    settings and the open output."""

    spec: TaskFile
    total: int
    settings: Settings
    sink: RowWriter


def _env_trace_file(options: RunOptions) -> str | None:
    """The trace file ``BLOCKX_TRACE_FILE`` names when ``--trace-file`` does not."""
    if options.trace_file is not None:
        return None
    return os.environ.get("BLOCKX_TRACE_FILE") or None


def check_input(options: RunOptions, console: Console) -> Checked | int:
    """Step 1: everything that can be wrong with the input; its problems are printed and
    :data:`EXIT_USAGE` returned."""
    from blockx.cli.output import RowWriter
    from blockx.cli.paths import check_output_paths
    from blockx.cli.taskfile import SpecError, audit_supported

    try:
        spec, total, settings = load_task_and_settings(
            options.task,
            config_file=options.config,
            sets=options.sets,
            executors=options.executors,
            keep_calls=True,
        )
    except (SpecError, UsageError) as exc:
        print_problems(console, exc.problems)
        return EXIT_USAGE
    path_problems = check_output_paths(
        spec,
        (
            ("-o", options.output),
            ("--errors", options.errors_out),
            ("--summary-json", options.summary_json),
            ("--trace-file", options.trace_file),
            ("BLOCKX_TRACE_FILE", _env_trace_file(options)),
        ),
    )
    if path_problems:
        print_problems(console, path_problems)
        return EXIT_USAGE
    for problem in spec.code_problems():
        warning = (
            f"blockx: warning: function {problem.function_id!r} cannot run — its calls will "
            f"fail: {problem.message}"
        )
        excerpt = indent(problem.excerpt, "    ") if problem.excerpt and not options.quiet else ""
        if console.json:  # one record, the excerpt in it
            console.print(f"{warning}\n{excerpt}" if excerpt else warning)
            continue
        console.print(warning)
        if excerpt:
            console.print(excerpt)
    if spec.audit and not audit_supported() and not options.quiet:
        console.print(
            "blockx: note: audit: true is accepted, but this worker has no audit gate yet: "
            "the functions run unaudited"
        )
    try:
        sink = RowWriter(options.output)
    except OSError as exc:
        where = f"-o {options.output}" if options.output is not None else "stdout"
        print_problems(console, [f"{where}: {exc.strerror or exc}"])
        return EXIT_USAGE
    return Checked(spec, total, settings, sink)


def early_worker_config(options: RunOptions) -> WorkerConfig | None:
    """The worker's configuration before the task file is read, or None.

    It comes from the config file, the environment, ``--set`` and ``--executors``
    alone (a task file's ``io:`` holds IO knobs only), so the executors can start
    while the task file and its calls file are read. None when it has a problem: step 1
    then reports it, in its order, before anything starts.
    """
    try:
        return build_settings(
            config_file=options.config, sets=options.sets, executors=options.executors
        ).worker
    except UsageError:
        return None


def start_executors(config: WorkerConfig) -> EarlyExecutors | None:
    """The executors for ``config``, spawned now, before the rest of the worker is
    imported and the task file read (``blockx/worker/pool/early.py``); None when that
    fails: the worker then spawns them itself, and says what is wrong."""
    from blockx.worker.pool.early import EarlyExecutors

    try:
        return EarlyExecutors(config)
    except Exception:
        return None


def check_input_interruptibly(options: RunOptions, console: Console) -> Checked | int:
    """Step 1 on the event loop, Ctrl-C raising ``KeyboardInterrupt`` at once as it does
    before the loop: asyncio's own SIGINT handler only cancels the main task, which a
    check that never awaits (a long calls file: seconds) would notice once it is over."""
    if threading.current_thread() is not threading.main_thread():  # pragma: no cover
        return check_input(options, console)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        # A Ctrl-C that came before the swap (while the worker started) went to asyncio's
        # handler, which only asked the task to cancel: honour it now, or a check that
        # never awaits (a FIFO nobody writes) would block with the request pending.
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            task.uncancel()  # the worker's close, on the way out, must not be cancelled
            raise KeyboardInterrupt
        return check_input(options, console)
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def calls_until_a_bad_line(
    spec: TaskFile, outcome: RunOutcome, batches: bool = False
) -> Iterator[Any]:
    """The calls of a streamed task's file (``batches``: as ``CallBatch`` items, a chunk
    of lines each); a bad line (the file changed since it was checked) ends the stream
    there, quietly for the worker, and is kept for the verdict (``blockx.cli.run``'s verdict):
    the calls read so far run to their end and are reported."""
    from blockx.cli.taskfile import SpecError

    try:
        yield from spec.iter_call_batches() if batches else spec.iter_calls_file()
    except SpecError as exc:
        outcome.stream_problem = "; ".join(exc.problems)
    except OSError as exc:
        outcome.stream_problem = f"cannot read it: {exc.strerror or exc}"
