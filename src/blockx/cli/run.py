"""``blockx run``: one task on an embedded worker — input checks, the run, signals, the verdict.

Theory of operation
-------------------
Everything that can be wrong with the input is found before the run: the
task file (and every line of its calls file) is checked, the configuration is
built, the output paths are checked (:mod:`blockx.cli.paths`: writable, not a
directory, never one of the task's input files) and the output file is opened.
The executors boot meanwhile: the worker's configuration does not depend on the
task file (its ``io:`` holds IO knobs only), so when it is good
(:func:`early_worker_config`) the worker and its executor processes are
started first and the input is checked while they boot
(:func:`_start_then_check`); bad input then closes the worker -- no executor
is left -- and exits 2 with the same messages. Then, on one event loop
(:func:`blockx.worker.app.run`: uvloop, GC tuned)::

    Worker(worker config)                 N executor processes (started first)
    IOSubsystem(io config)                one per run; closed at the end
      task = the task file's Task; task.io_handler = io.task_scope(task.task_id)
      one-shot (inline calls)  -> run to the end, rows written in call order
      stream (calls_file)      -> submit(collect=False); rows written as batches settle
    worker closed, then the output drained

Rows go to a :class:`~blockx.cli.output.RowWriter`: the loop encodes and
queues them, a thread of its own writes them, so the loop never waits for
stdout. Its queue is bounded (4 MiB); a full queue makes the row consumer
await room (the loop runs on), which pauses a stream at its credit window.

Streams: the calls file is read (a chunk of lines at a time,
:mod:`blockx.cli.calls_file`) by the worker's producer under its credit window,
and rows are taken as batches settle (:func:`~blockx.cli.output.row_parts`: a
batch's raw outputs, written as they are when each is one object; a slice of up
to :data:`~blockx.cli.output.PUT_SLICE_ROWS` at a time), so the process's memory
does not grow with the number of calls.

Signals (:class:`_Interruption`): the first SIGINT/SIGTERM cancels the task;
the rows of the calls that ended are still queued, and once the worker is
down the output gets :data:`OUTPUT_GRACE_S` to drain — what a reader that
does not read leaves queued then is dropped, counted on stderr. A second
signal exits at once (``os._exit``), whatever the writer thread is stuck in.

stderr (log records, the progress line, the final texts) goes through a
:class:`~blockx.cli.console.StderrWriter` for the whole command: the loop never
waits for it either; a full queue (1 MiB) drops lines and counts them (diagnostics
must not slow the work). The final texts are never dropped; at the end stderr gets
:data:`~blockx.cli.console.STDERR_GRACE_S` without a byte taken before the command
gives up on it and exits with its status.

Progress (stderr, only when it is a terminal): at most 8 redraws a second,
drawn by :class:`~blockx.cli.console.Progress` from the dispatcher's
per-task counters, which the run's ticker reads (:func:`_task_progress`).

Exit status (the constants and the texts of the verdict — failure report,
summary, ``--summary-json``, ``--errors`` — are :mod:`blockx.cli.report`'s):
0 every call succeeded; 1 the task failed or a call failed (every failed
call is reported, up to :data:`~blockx.cli.report.MAX_REPORTED`), or the
calls file changed while it was read (:mod:`blockx.cli.run_verdict`); 2 bad
input; 130/143 interrupted (SIGINT/SIGTERM: the task is cancelled, its
executors are stopped); 141 the output pipe was closed (one line says so).

Ends: once every call is decided the IO backends get :data:`IO_CLOSE_GRACE_S`
to close; one still busy then (a SQLite write waiting for a lock another
process holds) is abandoned, and the summary says what was left.

This module owns the command's run on the worker and the signal handling; the
first step, the input checks (and :class:`RunOptions`), is
:mod:`blockx.cli.run_input`'s, the last, the verdict, :mod:`blockx.cli.run_verdict`'s. stderr
(log records, the progress line, its writer thread) is :mod:`blockx.cli.console`'s, the rows'
writer thread :mod:`blockx.cli.output`'s; ``blockx validate`` (the input
checks alone) is :mod:`blockx.cli.validate`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Final

from blockx.cli.console import (
    PROGRESS_INTERVAL_S,
    STDERR_GRACE_S,
    Console,
    Progress,
    StderrWriter,
    plural,
    setup_logging,
)
from blockx.cli.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_USAGE, INTERRUPTED_STATUS
from blockx.cli.run_input import (
    Checked,
    RunOptions,
    calls_until_a_bad_line,
    check_input,
    check_input_interruptibly,
    early_worker_config,
    start_executors,
)
from blockx.cli.run_verdict import OUTPUT_GRACE_S, verdict
from blockx.cli.settings import Settings

# The task file's modules, the output's and the verdict's are imported once the executors
# have been started (where they are used), not before: the executors boot meanwhile.
if TYPE_CHECKING:
    from blockx.cli.output import RowPart, RowWriter
    from blockx.cli.report import RunOutcome
    from blockx.cli.taskfile import TaskFile
    from blockx.worker.app import Worker
    from blockx.worker.config import WorkerConfig
    from blockx.worker.pool.early import EarlyExecutors

__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_USAGE",
    "RunOptions",
    "run_command",
]

#: Give up when no executor has attached this long after start-up (s).
STARTUP_TIMEOUT_S: Final = 30.0
#: Once the task is over, how long the IO backends may take to close (s): an operation
#: still running then (a write waiting for a lock held elsewhere) is abandoned.
IO_CLOSE_GRACE_S: Final = 1.0


# --- the run ---------------------------------------------------------------------------------


def _task_progress(worker: Any, handle: Any) -> tuple[int, int, int] | None:
    """(done, retries, failed) from the dispatcher's counters of the task (read-only)."""
    try:
        state = worker.orchestrator.core.task_state(handle.run_state.task_id)
    except Exception:
        return None
    if state is None:
        return None
    return (
        int(state.succeeded + state.failed + state.cancelled),
        int(state.retries),
        int(state.failed),
    )


class _Interruption:
    """SIGINT/SIGTERM during the run, handled on the event loop (which never waits for
    stdout or stderr: see :mod:`blockx.cli.output`, :mod:`blockx.cli.console`).

    The first signal is noted in ``outcome.interrupted`` and cancels ``main`` while the
    task runs or the output drains; while the worker shuts down it is only noted (the
    drain that follows is then bounded). A second signal ends the process at once.
    """

    def __init__(self, outcome: RunOutcome, main: asyncio.Task[Any], console: Console) -> None:
        self.outcome = outcome
        self.main = main
        self.console = console
        self.cancel_main = True
        self.installed: list[int] = []

    def __repr__(self) -> str:
        return (
            f"_Interruption(interrupted={self.outcome.interrupted}, "
            f"cancel_main={self.cancel_main}, installed={self.installed})"
        )

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        for signum, name in ((signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "SIGINT")):
            try:
                loop.add_signal_handler(signum, self.on_signal, name, signum)
                self.installed.append(signum)
            except (NotImplementedError, RuntimeError, ValueError):  # pragma: no cover
                pass

    def uninstall(self, loop: asyncio.AbstractEventLoop) -> None:
        for signum in self.installed:
            loop.remove_signal_handler(signum)
        self.installed.clear()

    def on_signal(self, name: str, signum: int) -> None:
        if self.outcome.interrupted is None:
            self.outcome.interrupted = name
            if self.cancel_main:
                self.main.cancel()
        else:
            # A second one: leave now, whatever the writer thread is stuck in (executors
            # die with us: parent-death signal, and their sockets close).
            again = (
                "again" if name == self.outcome.interrupted else f"after {self.outcome.interrupted}"
            )
            self.console.write_at_once(f"\nblockx: {name} {again}: exiting at once\n")
            os._exit(128 + signum)


async def _run_task(
    spec: TaskFile,
    settings: Settings,
    sink: RowWriter,
    console: Console,
    progress_total: int | None,
    show_progress: bool,
    worker: Worker | None = None,
    trace_file: str | None = None,
    *,
    metrics_port: int | None = None,
) -> RunOutcome:
    from blockx.cli.output import OutputClosed
    from blockx.cli.report import RunOutcome

    outcome = RunOutcome()
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    assert main is not None
    interruption = _Interruption(outcome, main, console)
    interruption.install(loop)
    t0 = time.monotonic()
    try:
        try:
            await _run_on_worker(
                spec,
                settings,
                sink,
                console,
                progress_total,
                show_progress,
                outcome,
                interruption,
                worker,
                trace_file,
                metrics_port=metrics_port,
            )
        except asyncio.CancelledError:  # a first signal that came while a handler settled
            if outcome.interrupted is None:
                raise
            main.uncancel()
        # The worker is down; what is left is the output.
        try:
            await _drain_output(sink, outcome, main)
        except OutputClosed:
            outcome.output_closed = True
    finally:
        outcome.wall_s = time.monotonic() - t0
        interruption.uninstall(loop)
    return outcome


async def _run_on_worker(
    spec: TaskFile,
    settings: Settings,
    sink: RowWriter,
    console: Console,
    progress_total: int | None,
    show_progress: bool,
    outcome: RunOutcome,
    interruption: _Interruption,
    started: Worker | None = None,
    trace_file: str | None = None,
    *,
    metrics_port: int | None = None,
) -> None:
    """Start the worker (unless ``started``: one started while the input was checked),
    run the task, hand its rows to the writer, stop the worker."""
    from blockx.cli.output import PUT_SLICE_ROWS, OutputClosed, row_parts
    from blockx.cli.taskfile import SpecError
    from blockx.observability.tracing import Tracing
    from blockx.worker.app import Worker
    from blockx.worker.io.registry import IOSubsystem

    loop = asyncio.get_running_loop()
    t0 = time.monotonic()
    io = IOSubsystem(settings.io)
    worker = (
        started
        if started is not None
        else Worker(
            settings.worker,
            tracing=Tracing.from_env(trace_file),
            metrics_port=metrics_port,
        )
    )
    worker.observe_io(io)  # its task scopes' statistics, in the metrics
    handle = None
    progress: Progress | None = None
    ticker: asyncio.Task[None] | None = None
    batches: AsyncIterator[RowPart] | None = None
    unput: list[RowPart] = []  # the rest of the batch being put, not put yet
    try:
        if started is None:
            await worker.start()
        if metrics_port == 0 and worker.metrics_port is not None:
            console.print(f"blockx: metrics at http://127.0.0.1:{worker.metrics_port}/metrics")
        calls = calls_until_a_bad_line(spec, outcome, batches=True) if spec.is_stream else None
        task = spec.to_task(calls)
        scope = io.task_scope(task.task_id)
        task.io_handler = scope
        outcome.io_stats = scope.stats
        # Inline or streamed, the rows come from TaskHandle.row_batches() (collect=False): a
        # one-shot task's in call order once it ends, a stream's as its batches settle.
        # One path for both, so that what is written never depends on which it is: the
        # rows of the calls that succeeded are written even when the task was stopped
        # (max_output_bytes drops only the rows a *collecting* caller would have kept).
        handle = worker.submit(task, collect=False)
        if show_progress:
            progress = Progress(console, progress_total, settings.worker.pool.executor_count)

        def draw(progress: Progress) -> None:
            snap = _task_progress(worker, handle)
            if snap is not None:
                progress.last = snap
            done, retries, failed = progress.last or (0, 0, 0)
            try:
                attached = len(worker.adapter.attached_executor_ids())
            except Exception:
                attached = progress.executors
            console.show_progress(progress.render(done, retries, failed, attached))

        async def tick() -> None:
            attached_once = False
            if progress is not None:
                draw(progress)  # at once: a run shorter than one interval shows it too
            while True:
                await asyncio.sleep(PROGRESS_INTERVAL_S)
                if not attached_once:
                    attached_once = bool(worker.adapter.attached_executor_ids())
                    if not attached_once and time.monotonic() - t0 > STARTUP_TIMEOUT_S:
                        outcome.problems = [
                            f"no executor started within {STARTUP_TIMEOUT_S:.0f} s "
                            "(see the errors above); the task was cancelled"
                        ]
                        outcome.problem_status = EXIT_FAILED
                        handle.cancel("no executor started")
                        return
                if progress is not None:
                    draw(progress)
                if sink.reader_gone:  # the writer saw it, maybe while no row was coming
                    outcome.output_closed = True
                    handle.cancel("the output pipe was closed")
                    return

        ticker = loop.create_task(tick(), name="blockx-cli-ticker")
        try:
            # A batch's rows are queued a slice at a time, the queue's bound checked
            # between slices: its raw outputs joined when each is one object (they are
            # the rows' JSON already), else decoded and encoded with one call a slice.
            batches = row_parts(handle)
            async for raw, batch in batches:
                if outcome.output_closed:
                    continue
                for start in range(0, len(batch), PUT_SLICE_ROWS):
                    end = start + PUT_SLICE_ROWS
                    whole = start == 0 and end >= len(batch)
                    sink.put_part((raw, batch if whole else batch[start:end]))
                    if sink.full:  # the loop runs on; the stream pauses at its window
                        unput = [(raw, batch[end:])]
                        await sink.wait_for_room()
                        unput = []
            result = await handle.result()
        except OutputClosed:
            outcome.output_closed = True
            handle.cancel("the output pipe was closed")
            result = await _settle(handle)
        outcome.result = result
    except asyncio.CancelledError:
        if outcome.interrupted is None:
            raise
        interruption.main.uncancel()
        if handle is not None:
            handle.cancel(f"interrupted ({outcome.interrupted})")
            if outcome.result is None:
                outcome.result = await _settle(handle)
            if outcome.result is not None and not outcome.output_closed:
                # The rows of the calls that ended before the interruption and are not
                # written yet, queued at once: they are in memory already (a stream's:
                # its settled batches, at most its window), and the drain that follows
                # is bounded.
                # the rest of the batch being put, of the batches being taken, then the
                # batches settled since
                rest = list(unput)
                if batches is not None:
                    rest += [part async for part in batches]
                rest += [part async for part in row_parts(handle)]
                try:
                    for part in rest:
                        sink.put_part(part)
                except OutputClosed:
                    outcome.output_closed = True
    except SpecError as exc:  # the calls file changed while it was streamed
        outcome.stream_problem = "; ".join(exc.problems)
        if handle is not None:
            outcome.result = await _settle(handle)
    finally:
        interruption.cancel_main = False  # nothing here may be cut short
        if ticker is not None:
            ticker.cancel()
            await asyncio.gather(ticker, return_exceptions=True)
        console.clear_progress()
        try:
            await worker.close()
        finally:
            # Every call is decided: a backend still busy (a SQLite lock held elsewhere)
            # gets IO_CLOSE_GRACE_S, then is abandoned — the summary says so.
            outcome.io_abandoned = await io.close(grace_s=IO_CLOSE_GRACE_S)
            interruption.cancel_main = True


async def _drain_output(sink: RowWriter, outcome: RunOutcome, main: asyncio.Task[Any]) -> None:
    """Wait for the writer to write every row put; after an interruption (before or
    during this wait) only OUTPUT_GRACE_S more, then drop the rest."""
    if outcome.output_closed:
        return
    if outcome.interrupted is None:
        try:
            await sink.wait_drained()
            return
        except asyncio.CancelledError:
            if outcome.interrupted is None:
                raise
            main.uncancel()
    try:
        await asyncio.wait_for(sink.wait_drained(), OUTPUT_GRACE_S)
    except TimeoutError:
        outcome.rows_dropped = sink.abandon()


async def _settle(handle: Any) -> Any:
    """The result of a task being cancelled (None when it does not converge in time)."""
    try:
        return await asyncio.wait_for(asyncio.shield(handle.result()), 10.0)
    except Exception:
        return None


# --- the command -------------------------------------------------------------------------------


def run_command(options: RunOptions) -> int:
    """``blockx run``; returns the exit status.

    stderr is written by a :class:`~blockx.cli.console.StderrWriter` from start to end
    (when stderr is open): at the end it gets :data:`~blockx.cli.console.STDERR_GRACE_S`
    without a byte read before the command gives up on it and exits with its status.
    """
    from blockx.observability.logs import LogFormatError, executors_write_json, resolve_log_format

    stderr = sys.stderr
    tty = stderr.isatty()
    try:
        log_format = resolve_log_format(options.log_format)
    except LogFormatError as exc:
        print(f"blockx: error: {exc}", file=stderr)
        return EXIT_USAGE
    if log_format == "json":
        executors_write_json()  # the executors started from here on inherit it
    console = Console(stderr, tty=tty, log_format=log_format)
    try:
        console.attach(StderrWriter(stderr, json_lines=console.json))
    except OSError:  # stderr is closed: nothing to wait for
        pass
    setup_logging(console, verbose=options.verbose, quiet=options.quiet)
    try:
        code = _run_command(options, console)
    except KeyboardInterrupt:  # Ctrl-C outside the run's own handling
        code = INTERRUPTED_STATUS["SIGINT"]
    finally:  # the executors' fork server, unless a pool took it (it closed it then)
        if (fork_server := sys.modules.get("blockx.worker.pool.fork_server")) is not None:
            fork_server.discard_early()
    try:
        console.detach(STDERR_GRACE_S)
    except KeyboardInterrupt:  # while waiting for stderr's reader: stop waiting, the run's
        pass  # status stands
    return code


async def _start_then_check(
    options: RunOptions,
    console: Console,
    config: WorkerConfig,
    checked: list[Checked],
    early: EarlyExecutors | None,
) -> RunOutcome | int:
    """Start the worker and its executors with ``config``, check the input while they
    boot (step 1, on the loop: the executors' processes start meanwhile, and attach
    once it is done), then run. Bad input: the worker is closed -- no executor is left
    -- and :data:`EXIT_USAGE` returned. A worker that could not start is reported only
    once the input is known to be good (bad input is exit status 2 whatever the worker
    did). ``checked`` receives step 1's result for the caller's ends.

    The worker's start runs up to its first wait (for the executors' spawns: the fork
    server's first forks come ~60 ms after its own start) before the check, and ends
    after it: the check and that wait overlap. Awaited in turn, a one-call run waited
    for the fork server 2-20 ms, then checked its input for ~10 ms."""
    from blockx.observability.tracing import Tracing
    from blockx.worker.app import Worker, tune_gc

    try:
        tracing = Tracing.from_env(options.trace_file)
    except OSError:  # an unwritable trace file: check_input says so (exit 2) below
        tracing = None
    worker = Worker(config, tracing=tracing, metrics_port=options.metrics_port, early=early)
    starting = asyncio.ensure_future(worker.start())
    start_error: Exception | None = None
    try:
        await asyncio.sleep(0)  # start() runs to its first wait
        result = check_input_interruptibly(options, console)
        try:
            await starting
        except Exception as exc:  # closed by start() itself
            start_error = exc
        # The worker process's GC setting (blockx.worker.app.tune_gc), applied once the
        # executors are spawned rather than before (_run_command's gc_tuning=False).
        tune_gc()
    except BaseException:
        await _abandon_start(starting)
        await worker.close()
        raise
    if isinstance(result, int):
        await worker.close()
        return result
    checked.append(result)
    if start_error is not None:
        await worker.close()
        raise start_error
    started: Worker | None = worker
    if result.settings.worker != config:  # pragma: no cover - io: holds IO knobs only
        await worker.close()
        started = None  # _run_task starts one with the settings'
    return await _run_task(
        result.spec,
        result.settings,
        result.sink,
        console,
        result.total,
        _shows_progress(options, console),
        started,
        options.trace_file,
        metrics_port=options.metrics_port,
    )


async def _abandon_start(starting: asyncio.Future[None]) -> None:
    """Stop a worker's start still running (it closes what it started on its way out)
    and wait for it; its outcome is dropped: the worker is closed next, and the
    exception that brought us here is what the caller raises."""
    if not starting.done():
        starting.cancel()
    try:
        await starting
    except BaseException:  # its failure or cancellation: see above
        pass


def _shows_progress(options: RunOptions, console: Console) -> bool:
    show = options.progress if options.progress is not None else console.tty
    return show and not options.quiet and not console.json  # never mixed into JSON lines


def _run_command(options: RunOptions, console: Console) -> int:
    from blockx.worker.loop import run  # not worker.app: the executors start before it loads

    if options.ray is not None:  # one worker per Ray node (docs/cluster.md)
        from blockx.cli.run_cluster import RunParts, run_on_ray

        parts = RunParts(
            verdict, _Interruption, _drain_output, calls_until_a_bad_line, OUTPUT_GRACE_S
        )
        return run_on_ray(options, console, parts)

    # 1. Everything that can be wrong with the input, before the run; the executors are
    # started first when the worker's configuration is good (it needs no task file).
    config = early_worker_config(options)
    early = None if config is None else start_executors(config)
    checked: list[Checked] = []
    if config is None:
        first = check_input(options, console)
        if isinstance(first, int):
            return first
        checked.append(first)

    # 2. The run.
    ran: RunOutcome | int
    try:
        if config is None:
            c = checked[0]
            ran = run(
                _run_task(
                    c.spec,
                    c.settings,
                    c.sink,
                    console,
                    c.total,
                    _shows_progress(options, console),
                    trace_file=options.trace_file,
                    metrics_port=options.metrics_port,
                )
            )
        else:
            ran = run(_start_then_check(options, console, config, checked, early), gc_tuning=False)
    except KeyboardInterrupt:  # a second Ctrl-C
        console.print("blockx: interrupted")
        return INTERRUPTED_STATUS["SIGINT"]
    except Exception as exc:  # the worker could not start or broke down: say what, briefly
        console.print(f"blockx: error: the run failed: {type(exc).__name__}: {exc}")
        if options.verbose:
            import traceback

            trace = "".join(traceback.format_exception(exc)).rstrip()
            console.print(f"blockx: error: {trace}" if console.json else trace)
        else:
            console.print("blockx: (run with -v for the traceback)")
        return EXIT_FAILED
    finally:
        if early is not None:
            early.discard()  # unless the worker took them (it closed them then)
        if checked:
            if console.writer is not None:  # the final texts: bounded, and the loop is gone
                console.writer.keep_all()
            # Drained already unless the run broke down: then what is queued gets a moment.
            sink = checked[0].sink
            dropped = sink.close(timeout=OUTPUT_GRACE_S)
            if dropped:
                console.print(
                    f"blockx: warning: {plural(dropped, 'row')} not written to {sink.label}"
                )
    if isinstance(ran, int):  # bad input, found while the executors started
        return ran
    # 3. The verdict.
    return verdict(options, console, checked[0], ran)
