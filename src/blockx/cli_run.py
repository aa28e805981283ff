"""``blockx run``: one task on an embedded worker — outputs, progress, summary, failure report.

Theory of operation
-------------------
Everything that can be wrong with the input is found before a process
starts: the task file (and every line of its calls file) is checked, the
configuration is built, the output file is opened. Then, on one event loop
(:func:`blockx.worker.app.run`: uvloop, GC tuned)::

    IOSubsystem(io config)                one per run; closed at the end
    Worker(worker config)                 N executor processes
      task = the task file's Task; task.io_handler = io.task_scope(task.task_id)
      one-shot (inline calls)  -> run to the end, rows written in call order
      stream (calls_file)      -> submit(collect=False); rows written as batches settle
    worker closed, then the output drained

Rows go to a :class:`~blockx.cli_output.RowWriter`: the loop encodes and
queues them, a thread of its own writes them, so the loop never waits for
stdout. Its queue is bounded (4 MiB); a full queue makes the row consumer
await room (the loop runs on), which pauses a stream at its credit window.

Streams: the calls file is read line by line by the worker's producer under
its credit window, and rows are taken from ``TaskHandle.rows()`` as they come,
so the process's memory does not grow with the number of calls.

Signals (:class:`_Interruption`): the first SIGINT/SIGTERM cancels the task;
the rows of the calls that ended are still queued, and once the worker is
down the output gets :data:`OUTPUT_GRACE_S` to drain — what a reader that
does not read leaves queued then is dropped, counted on stderr. A second
signal exits at once (``os._exit``), whatever the writer thread is stuck in.

Progress (stderr, only when it is a terminal): at most 8 redraws a second,
from the dispatcher's per-task counters (read-only: ``done/total``, retries,
failures) — ``total`` is the inline list's length or the calls file's line
count from the pre-run check.

Exit status: 0 every call succeeded; 1 the task failed or a call failed
(every failed call is reported, up to :data:`MAX_REPORTED`); 2 bad input;
130/143 interrupted (SIGINT/SIGTERM: the task is cancelled, its executors are
stopped); 141 the output pipe was closed.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import resource
import shutil
import signal
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, Final

from blockx.cli_config import Settings, UsageError, build_settings
from blockx.cli_output import PUT_SLICE_ROWS, OutputClosed, RowWriter
from blockx.taskspec import SpecError, TaskFile, audit_supported, load_task_file

__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_USAGE",
    "RunOptions",
    "run_command",
]

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
EXIT_SIGPIPE: Final = 141

#: The exit status of a run interrupted by a signal: 128 + its number.
_INTERRUPTED_STATUS: Final = {"SIGINT": 130, "SIGTERM": 143}

#: Failed calls shown in the report; the rest are counted ("… and N more").
MAX_REPORTED: Final = 20
#: Longest args text in the report.
MAX_ARGS_TEXT: Final = 200
#: Progress redraw interval (s): at most 8 redraws a second.
PROGRESS_INTERVAL_S: Final = 0.125
#: Give up when no executor has attached this long after start-up (s).
STARTUP_TIMEOUT_S: Final = 30.0
#: After an interruption, how long rows still queued may take to be written (s); then
#: they are dropped (a reader that does not drain cannot hold the process).
OUTPUT_GRACE_S: Final = 2.0

_log = logging.getLogger("blockx.cli")


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


# --- stderr: logging and the progress line ----------------------------------------------------


class _Console:
    """stderr: log records, the progress line (redrawn in place) and the final texts."""

    def __init__(self, stream: IO[str], *, tty: bool) -> None:
        self.stream = stream
        self.tty = tty
        self._line_shown = False

    def clear_progress(self) -> None:
        if self._line_shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._line_shown = False

    def show_progress(self, text: str) -> None:
        width = shutil.get_terminal_size((100, 24)).columns
        self.stream.write("\r" + text[: max(width - 1, 20)] + "\x1b[K")
        self.stream.flush()
        self._line_shown = True

    def print(self, text: str = "") -> None:
        self.clear_progress()
        self.stream.write(text + "\n")
        self.stream.flush()


class _ConsoleHandler(logging.Handler):
    """Log records on stderr, keeping the progress line intact; see :func:`_setup_logging`."""

    def __init__(self, console: _Console, *, verbose: bool, quiet: bool) -> None:
        super().__init__(logging.DEBUG)
        self.console = console
        self.verbose = verbose
        self.quiet = quiet

    def filter(self, record: logging.LogRecord) -> bool:
        name = record.name
        if name == "blockx.worker.executor" and record.levelno < logging.WARNING:
            # print() output of user code: shown unless --quiet; the executor's own logs: -v.
            user_output = getattr(record, "executorStream", None) == "stdout" and not hasattr(
                record, "executorLogger"
            )
            return self.verbose or (user_output and not self.quiet)
        if record.levelno < logging.WARNING:
            return self.verbose
        msg = str(record.msg)
        if name == "blockx.worker.code" and msg.startswith("function %s cannot run"):
            return False  # the CLI reports it with the file and line
        return not (self.quiet and record.levelno < logging.ERROR)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
            if record.name == "blockx.worker.executor" and record.levelno < logging.WARNING:
                line = text
            else:
                line = f"blockx: {record.levelname.lower()}: {text}"
            if record.exc_info and self.verbose:
                line += "\n" + logging.Formatter().formatException(record.exc_info)
            self.console.print(line)
        except Exception:  # pragma: no cover - logging must not raise
            self.handleError(record)


def _setup_logging(console: _Console, *, verbose: bool, quiet: bool) -> _ConsoleHandler:
    handler = _ConsoleHandler(console, verbose=verbose, quiet=quiet)
    logger = logging.getLogger("blockx")
    for old in list(logger.handlers):
        if isinstance(old, _ConsoleHandler):
            logger.removeHandler(old)
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)
    logger.propagate = False
    # Executors forward their output at INFO; the pool only formats what is enabled.
    logging.getLogger("blockx.worker.executor").setLevel(logging.INFO)
    return handler


def _count(n: int) -> str:
    return f"{n:,}"


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return (
        f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
        if seconds >= 3600
        else (f"{seconds // 60}:{seconds % 60:02d}")
    )


class _Progress:
    """The live progress line (see the module docstring)."""

    def __init__(self, console: _Console, total: int | None, executors: int) -> None:
        self.console = console
        self.total = total
        self.executors = executors
        self.started = time.monotonic()
        self._window: collections.deque[tuple[float, int]] = collections.deque()
        self.last: tuple[int, int, int] | None = None
        unicode = (getattr(console.stream, "encoding", "") or "").lower().startswith("utf")
        self._full, self._empty = ("█", "░") if unicode else ("#", "-")

    def render(self, done: int, retries: int, failed: int, attached: int) -> str:
        now = time.monotonic()
        window = self._window
        window.append((now, done))
        while len(window) > 2 and now - window[0][0] > 3.0:
            window.popleft()
        t0, d0 = window[0]
        rate = (done - d0) / (now - t0) if now - t0 > 0.2 else 0.0
        elapsed = now - self.started
        parts: list[str] = []
        total = self.total
        if attached < self.executors and done == 0:
            parts.append(f"starting executors {attached}/{self.executors}")
        if total:
            fraction = min(done / total, 1.0)
            width = 24
            filled = int(fraction * width)
            bar = self._full * filled + self._empty * (width - filled)
            parts.append(f"{fraction * 100:3.0f}% {bar} {_count(done)}/{_count(total)}")
        else:
            parts.append(f"{_count(done)} calls")
        parts.append(f"{rate:,.0f} calls/s")
        parts.append(f"retries {_count(retries)}")
        parts.append(f"failed {_count(failed)}")
        parts.append(_duration(elapsed))
        if total and rate > 0 and done < total:
            parts.append(f"ETA {_duration((total - done) / rate)}")
        return "  ".join(parts)


# --- the run ---------------------------------------------------------------------------------


@dataclass(slots=True)
class _Outcome:
    result: Any = None
    interrupted: str | None = None
    output_closed: bool = False
    #: Rows not written: stdout was not read within OUTPUT_GRACE_S after an interruption.
    rows_dropped: int = 0
    #: A streamed task: the calls its file holds (the pre-run check's count).
    calls_in_file: int | None = None
    io_stats: Any = None
    wall_s: float = 0.0
    problems: list[str] = field(default_factory=list)
    #: The exit status that goes with ``problems``.
    problem_status: int = EXIT_USAGE


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
    stdout: see :mod:`blockx.cli_output`).

    The first signal is noted in ``outcome.interrupted`` and cancels ``main`` while the
    task runs or the output drains; while the worker shuts down it is only noted (the
    drain that follows is then bounded). A second signal ends the process at once.
    """

    def __init__(self, outcome: _Outcome, main: asyncio.Task[Any]) -> None:
        self.outcome = outcome
        self.main = main
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
            os.write(2, f"\nblockx: {name} {again}: exiting at once\n".encode())
            os._exit(128 + signum)


async def _run_task(
    spec: TaskFile,
    settings: Settings,
    sink: RowWriter,
    console: _Console,
    progress_total: int | None,
    show_progress: bool,
) -> _Outcome:
    outcome = _Outcome()
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    assert main is not None
    interruption = _Interruption(outcome, main)
    interruption.install(loop)
    t0 = time.monotonic()
    try:
        try:
            await _run_on_worker(
                spec, settings, sink, console, progress_total, show_progress, outcome, interruption
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
    console: _Console,
    progress_total: int | None,
    show_progress: bool,
    outcome: _Outcome,
    interruption: _Interruption,
) -> None:
    """Start the worker, run the task, hand its rows to the writer, stop the worker."""
    from blockx.worker.app import Worker
    from blockx.worker.io.registry import IOSubsystem

    loop = asyncio.get_running_loop()
    t0 = time.monotonic()
    io = IOSubsystem(settings.io)
    worker = Worker(settings.worker)
    handle = None
    progress: _Progress | None = None
    ticker: asyncio.Task[None] | None = None
    one_shot_rows_put = 0  # of a one-shot task's outputs, how many went to the writer
    stream_rows: AsyncIterator[Any] | None = None
    try:
        await worker.start()
        task = spec.to_task()
        scope = io.task_scope(task.task_id)
        task.io_handler = scope
        outcome.io_stats = scope.stats
        stream = spec.is_stream
        handle = worker.submit(task, collect=not stream)
        if show_progress:
            progress = _Progress(console, progress_total, settings.worker.pool.executor_count)

        async def tick() -> None:
            attached_once = False
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
                    snap = _task_progress(worker, handle)
                    if snap is not None:
                        progress.last = snap
                    done, retries, failed = progress.last or (0, 0, 0)
                    try:
                        attached = len(worker.adapter.attached_executor_ids())
                    except Exception:
                        attached = progress.executors
                    console.show_progress(progress.render(done, retries, failed, attached))
                if sink.reader_gone:  # the writer saw it, maybe while no row was coming
                    outcome.output_closed = True
                    handle.cancel("the output pipe was closed")
                    return

        ticker = loop.create_task(tick(), name="blockx-cli-ticker")
        try:
            if stream:
                stream_rows = handle.rows()
                async for row in stream_rows:
                    if not outcome.output_closed:
                        sink.put_rows((row,))
                        if sink.full:  # the loop runs on; the stream pauses at its window
                            await sink.wait_for_room()
            result = await handle.result()
            if not stream and not outcome.output_closed:
                for start in range(0, len(result.outputs), PUT_SLICE_ROWS):
                    if sink.full:
                        await sink.wait_for_room()
                    chunk = result.outputs[start : start + PUT_SLICE_ROWS]
                    sink.put_rows(chunk)
                    one_shot_rows_put += len(chunk)
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
                if spec.is_stream:
                    # the rest of the batch being taken, then the batches settled since
                    rest = [row async for row in stream_rows] if stream_rows else []
                    rest += [row async for row in handle.rows()]
                else:
                    rest = outcome.result.outputs[one_shot_rows_put:]
                try:
                    sink.put_rows(rest)
                except OutputClosed:
                    outcome.output_closed = True
    except SpecError as exc:  # the calls file changed while it was streamed
        outcome.problems = exc.problems
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
            await io.close()
            interruption.cancel_main = True


async def _drain_output(sink: RowWriter, outcome: _Outcome, main: asyncio.Task[Any]) -> None:
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


# --- reports -----------------------------------------------------------------------------------


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


def _indent(text: str, prefix: str) -> str:
    return "\n".join(prefix + line if line else line for line in text.rstrip("\n").splitlines())


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
    errors = list(result.errors)
    stats = result.stats
    not_read = _calls_not_read(spec, result, calls_in_file)
    unread = f"; {_plural(not_read, 'call')} of {spec.calls_label} not read" if not_read else ""
    policy = spec.policy.get("failure", "fast_fail")
    lines: list[str] = []
    failure = result.failure
    if failure is not None and failure.kind == "OUTPUT_BYTES_EXCEEDED":
        lines.append(
            "FAILED: the outputs grew past max_output_bytes; the task was stopped "
            f"({failure.message})"
        )
    elif failure is not None and failure.kind == "CANCELLED":
        lines.append(f"FAILED: the task was cancelled ({failure.message})")
    elif failure is not None and failure.kind == "CALL_FAILED":
        which = f"call #{failure.call_index}" if failure.call_index is not None else "a call"
        lines.append(
            f"FAILED: {which} failed and stopped the task (failure: fast_fail); "
            f"{_count(stats.cancelled)} call(s) were cancelled{unread}"
        )
    elif errors:
        lines.append(
            f"FAILED: {_count(len(errors))} of {_count(stats.calls)} calls failed "
            f"(failure: {policy}; the other calls' outputs were written)"
        )
    elif failure is not None:
        lines.append(f"FAILED: {failure.kind}: {failure.message}")
    seen: dict[tuple[str, str, str], int] = {}
    for n, error in enumerate(errors[:limit], 1):
        attempts = f"{error.attempts} attempt{'s' if error.attempts != 1 else ''}"
        lines.append("")
        lines.append(
            f"{n}) call #{error.index}: {error.function_id}({_args_text(error.args)}) — "
            f"{error.kind} after {attempts}"
        )
        message = spec.user_locations(error.message or "")
        stack = _user_frames(spec.user_locations(error.stack)) if error.stack else ""
        key = (error.kind, message, stack)
        if key in seen:
            lines.append(f"   the same error and stack as {seen[key]})")
            continue
        seen[key] = n
        last_stack_line = stack.rstrip("\n").rsplit("\n", 1)[-1].strip() if stack else ""
        tail = message.split(": ", 1)[-1].strip()
        if message and not (last_stack_line and tail and last_stack_line.endswith(tail)):
            lines.append(_indent(message, "   "))
        if stack:
            lines.append(_indent(stack, "   "))
        captured = result.debug_output.get(error.index) if result.debug_output else None
        if captured:
            lines.append("   output of the call (policy.debug):")
            lines.append(_indent(captured, "   | "))
    if len(errors) > limit:
        lines.append("")
        lines.append(
            f"… and {_count(len(errors) - limit)} more failed call(s) (--errors FILE lists all)"
        )
    return "\n".join(lines)


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
    return ", ".join(f"{kind} {_count(n)}" for kind, n in counts.most_common())


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


def summary_text(spec: TaskFile, outcome: _Outcome, sink: RowWriter, executors: int) -> str:
    result = outcome.result
    stats = result.stats
    if outcome.interrupted:
        status = f"interrupted ({outcome.interrupted})"
    elif result.success and not result.errors:
        status = "ok"
    else:
        status = "FAILED"
    not_read = _calls_not_read(spec, result, outcome.calls_in_file)
    calls = _plural(stats.calls, "call")
    if not_read:  # the stream stopped early: N is what was read, not what the file holds
        calls = f"{_count(stats.calls)} of {_plural(stats.calls + not_read, 'call')}"
    lines = [
        f"task {result.task_id}: {status} — {calls} in "
        f"{stats.wall_time_s:,.2f} s ({stats.calls_per_s:,.0f} calls/s) on {executors} "
        f"executor{'s' if executors != 1 else ''}",
        f"  calls     {_count(stats.succeeded)} succeeded, {_count(stats.failed)} failed, "
        f"{_count(stats.cancelled)} cancelled; {_count(stats.subcalls)} sub-calls; "
        f"{_count(stats.retries)} retries",
    ]
    if not_read:
        lines.append(
            f"  stream    stopped after {_plural(stats.calls, 'call')} read; the rest of "
            f"{spec.calls_label} ({_plural(not_read, 'call')}) was not read"
        )
    if result.errors:
        lines.append(f"  failures  {_failures_by_kind(result.errors)}")
    outputs = f"  outputs   {_plural(sink.rows, 'row')} → {sink.label}"
    if outcome.rows_dropped:
        outputs += f"; {_count(outcome.rows_dropped)} not written ({sink.label} was not read)"
    lines.append(outputs)
    lines.append(
        f"  cache     {_count(stats.cache_hits)} call-cache hits, "
        f"{_count(stats.singleflight_hits)} singleflight joins"
    )
    io_stats = outcome.io_stats
    if io_stats is not None and len(io_stats):
        totals = io_stats.totals()
        calls = totals["backend_calls"]
        mean = totals["total_ms"] / calls if calls else 0.0
        lines.append(
            f"  io        {_count(totals['requests'])} requests: {_count(calls)} backend calls, "
            f"{_count(totals['cache_hits'])} cached, {_count(totals['singleflight_joins'])} "
            f"joined, {_count(totals['errors'])} errors; backend calls mean {mean:,.2f} ms, "
            f"max {totals['max_ms']:,.2f} ms"
        )
        lines.append(_indent(io_stats.format_table(), "            "))
    else:
        lines.append("  io        none")
    own, children = _peak_rss_kb()
    lines.append(
        f"  time      {outcome.wall_s:,.2f} s wall; "
        f"peak RSS: worker {_mb(own)}, largest executor {_mb(children)}"
    )
    return "\n".join(lines)


def summary_json(outcome: _Outcome, sink: RowWriter, exit_code: int) -> dict[str, Any]:
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
    return data


def _write_errors(path: str, spec: TaskFile, errors: Sequence[Any]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for e in errors:
            record = {
                "index": e.index,
                "function": e.function_id,
                "args": e.args,
                "kind": e.kind,
                "message": spec.user_locations(e.message or ""),
                "stack": spec.user_locations(e.stack) if e.stack else None,
                "attempts": e.attempts,
                "retryable": e.retryable,
            }
            f.write(json.dumps(record, ensure_ascii=False, default=repr) + "\n")


# --- the command -------------------------------------------------------------------------------


def _print_problems(console: _Console, problems: Sequence[str]) -> None:
    for problem in problems:
        console.print(f"blockx: error: {problem}")


def run_command(options: RunOptions) -> int:
    """``blockx run``; returns the exit status."""
    stderr = sys.stderr
    tty = stderr.isatty()
    console = _Console(stderr, tty=tty)
    _setup_logging(console, verbose=options.verbose, quiet=options.quiet)

    # 1. Everything that can be wrong with the input, before anything starts.
    try:
        spec = load_task_file(options.task)
        total = spec.scan_calls_file() if spec.is_stream else len(spec.calls or ())
        settings = build_settings(
            config_file=options.config,
            sets=options.sets,
            executors=options.executors,
            task_io=spec.io,
            task_label=spec.label,
            task_dir=str(spec.path.resolve().parent),
        )
    except (SpecError, UsageError) as exc:
        _print_problems(console, exc.problems)
        return EXIT_USAGE
    for path_option, flag in (
        (options.output, "-o"),
        (options.errors_out, "--errors"),
        (options.summary_json, "--summary-json"),
    ):
        if path_option is not None:
            parent = os.path.dirname(os.path.abspath(path_option))
            if not os.path.isdir(parent):
                _print_problems(console, [f"{flag} {path_option}: no such directory {parent}"])
                return EXIT_USAGE
    for problem in spec.code_problems():
        console.print(
            f"blockx: warning: function {problem.function_id!r} cannot run — its calls will "
            f"fail: {problem.message}"
        )
        if problem.excerpt and not options.quiet:
            console.print(_indent(problem.excerpt, "    "))
    if spec.audit and not audit_supported() and not options.quiet:
        console.print(
            "blockx: note: audit: true is accepted, but this worker has no audit gate yet: "
            "the functions run unaudited"
        )
    try:
        sink = RowWriter(options.output)
    except OSError as exc:
        where = f"-o {options.output}" if options.output is not None else "stdout"
        _print_problems(console, [f"{where}: {exc.strerror or exc}"])
        return EXIT_USAGE

    # 2. The run.
    from blockx.worker.app import run

    show_progress = options.progress if options.progress is not None else tty
    show_progress = show_progress and not options.quiet
    executors = settings.worker.pool.executor_count
    try:
        outcome = run(_run_task(spec, settings, sink, console, total, show_progress))
    except KeyboardInterrupt:  # a second Ctrl-C
        console.print("blockx: interrupted")
        return 130
    except Exception as exc:  # the worker could not start or broke down: say what, briefly
        console.print(f"blockx: error: the run failed: {type(exc).__name__}: {exc}")
        if options.verbose:
            import traceback

            console.print("".join(traceback.format_exception(exc)).rstrip())
        else:
            console.print("blockx: (run with -v for the traceback)")
        return EXIT_FAILED
    finally:
        # Drained already unless the run broke down: then what is queued gets a moment.
        dropped = sink.close(timeout=OUTPUT_GRACE_S)
        if dropped:
            console.print(f"blockx: warning: {_plural(dropped, 'row')} not written to {sink.label}")

    # 3. The verdict.
    outcome.calls_in_file = total if spec.is_stream else None
    if outcome.output_closed and options.output is None:
        try:  # nothing more may reach the closed pipe, not even at interpreter exit
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except OSError:  # pragma: no cover
            pass
        return EXIT_SIGPIPE
    if outcome.problems:
        _print_problems(console, outcome.problems)
        return outcome.problem_status
    if outcome.rows_dropped:
        at_most = "" if sink.drop_count_exact else "at most "
        torn = "; the last line written is cut short" if sink.torn else ""
        console.print(
            f"blockx: warning: {sink.label} was not read for {OUTPUT_GRACE_S:.0f} s after the "
            f"interruption: {at_most}{_plural(outcome.rows_dropped, 'row')} dropped, not "
            f"written{torn}"
        )
    result = outcome.result
    if result is None:
        console.print("blockx: error: the task did not end in time after it was cancelled")
        return _INTERRUPTED_STATUS.get(outcome.interrupted or "", EXIT_FAILED)
    if outcome.interrupted:
        code = _INTERRUPTED_STATUS[outcome.interrupted]
    elif result.success and not result.errors:
        code = EXIT_OK
    else:
        code = EXIT_FAILED
    if options.errors_out is not None:
        _write_errors(options.errors_out, spec, result.errors)
    if code == EXIT_FAILED or (outcome.interrupted and result.errors):
        console.print(failure_report(spec, result, calls_in_file=outcome.calls_in_file))
        console.print()
    if not options.quiet:
        console.print(summary_text(spec, outcome, sink, executors))
    if options.summary_json is not None:
        with open(options.summary_json, "w", encoding="utf-8") as f:
            json.dump(summary_json(outcome, sink, code), f, indent=2)
            f.write("\n")
    return code


def validate_command(
    task: str, *, config: str | None = None, sets: Sequence[str] = (), quiet: bool = False
) -> int:
    """``blockx validate``; returns the exit status (0 valid, 2 not)."""
    console = _Console(sys.stderr, tty=False)
    try:
        spec = load_task_file(task)
        count = spec.scan_calls_file() if spec.is_stream else len(spec.calls or ())
        build_settings(
            config_file=config,
            sets=sets,
            task_io=spec.io,
            task_label=spec.label,
            task_dir=str(spec.path.resolve().parent),
        )
    except (SpecError, UsageError) as exc:
        _print_problems(console, exc.problems)
        return EXIT_USAGE
    problems = spec.code_problems()
    for problem in problems:
        console.print(f"blockx: error: {problem.message}")
        if problem.excerpt:
            console.print(_indent(problem.excerpt, "    "))
    warnings = _subcall_warnings(spec)
    for warning in warnings:
        console.print(f"blockx: warning: {warning}")
    if problems:
        return EXIT_USAGE
    if not quiet:
        source = f"streamed from {spec.calls_label}" if spec.is_stream else "inline"
        names = ", ".join(spec.functions)
        print(
            f"{spec.label}: ok — {len(spec.functions)} function(s) ({names}), "
            f"{_count(count)} call(s) {source}"
        )
    return EXIT_OK


def _subcall_warnings(spec: TaskFile) -> list[str]:
    """``function.call("name", ...)`` with a literal name the task does not define."""
    import ast

    out: list[str] = []
    for fid, fn in spec.functions.items():
        try:
            tree = ast.parse(fn.source)
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "call"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "function"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
                and node.args[0].value not in spec.functions
            ):
                file, line = fn.locate(node.lineno)
                out.append(
                    f"{file}:{line}: function.call({node.args[0].value!r}) names no function "
                    f"of this task (functions: {', '.join(spec.functions)}); in function {fid!r}"
                )
    return out
