"""``python -m blockx.executor``: the executor process shell.

Theory of operation
-------------------
1. Parse the flags (:mod:`.cli`), set up JSON logging (:mod:`.logging_setup`).
2. Probe the process metrics (:mod:`.process_metrics`); a probe that fails is a
   start-up error.
3. Connect to the worker's socket (:class:`.uds_session.UDSSession`, retrying
   while its listener is not there yet); a failure is a clear error and a
   non-zero exit.
4. Build the :class:`~blockx.executor.runtime.ExecutorRuntime` (imported late:
   the flags and the socket are checked before the heavier runtime loads),
   start the heartbeat thread (its first heartbeat attaches the connection on
   the worker side) and run the main loop::

       while session.is_connected():
           runtime.run_until_idle()
           session.wait_for_message(timeout=runtime.next_scheduler_delay(None))

5. Leave it on

   * SIGTERM / SIGINT: ``runtime.shutdown()``, flush, exit 0. A second signal
     exits at once (143) — for a call stuck in a loop that no budget bounds;
   * the connection ending (EOF, a protocol error, a failed write):
     ``runtime.on_transport_lost()``, exit 1. The executor never reconnects; the
     worker's pool starts a new one;
   * a call failed for want of file descriptors: its ``CallFailed`` is flushed,
     the black box cause set, exit 88 (``EXIT_DESCRIPTORS_EXHAUSTED``);
   * past ``--memory-limit-mb`` (the watchdog thread, or a call's ``MemoryError``):
     exit 87 at once from wherever it was found (``containment.exit_now``).

   Every one of these first SIGKILLs the processes user code started: the
   executor is their subreaper (:mod:`.containment`).

6. Exit at once (:func:`_exit_now`): the standard streams flushed, then
   ``os._exit`` with the status, skipping the interpreter's finalization. By then
   the session is closed, the logs flushed and user code's processes killed;
   tearing down every module and object (a task's too) took ~20 ms at the end of
   every ``blockx run``, which the worker waits through before it exits, and a
   thread user code left running would have held the exit until the worker's
   SIGKILL.

Containment (docs/security.md): ``--max-open-files`` is applied first, the black
box (``--blackbox-path``) opened before the runtime is built and handed to it,
and ``RLIMIT_AS`` set last, once every thread of the executor has started.

Signals: the Python-level handler only records the request (it takes no lock,
so it cannot deadlock against the main thread it interrupts). The wake-up
reaches a main loop blocked in ``wait_for_message`` through
``signal.set_wakeup_fd`` and a small watcher thread that records the request
too and calls ``session.wake()``: the kernel may deliver SIGTERM to any thread,
and then the Python handler would run only once the main thread runs again.

Nothing from ``blockx.worker`` is imported: the executor starts fast and small.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final, NoReturn

from blockx import method_cache
from blockx.msgspec_import import import_msgspec

import_msgspec()  # before anything imports msgspec (blockx.msgspec_import)
method_cache.install()  # before the dataclasses of blockx.wire and the runtime

from .cli import ExecutorArgs, parse_args  # noqa: E402 - after import_msgspec()
from .logging_setup import configure_logging  # noqa: E402

if TYPE_CHECKING:
    from .heartbeat import HeartbeatThread
    from .uds_session import UDSSession

__all__ = [
    "EXIT_CONNECT_FAILED",
    "EXIT_INTERNAL_ERROR",
    "EXIT_OK",
    "EXIT_STARTUP_FAILED",
    "EXIT_TRANSPORT_LOST",
    "main",
]

EXIT_OK: Final = 0
#: The connection to the worker ended (EOF, protocol error, failed write).
EXIT_TRANSPORT_LOST: Final = 1
#: (2 is argparse's: a bad flag.)
#: The worker's socket could not be reached.
EXIT_CONNECT_FAILED: Final = 3
#: Start-up failed before the main loop (metrics probe, runtime construction).
EXIT_STARTUP_FAILED: Final = 4
#: The main loop raised: a bug in the executor.
EXIT_INTERNAL_ERROR: Final = 70
#: A second SIGTERM/SIGINT while the first was being handled.
_EXIT_FORCED: Final = 143

_SHUTDOWN_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT)

_log = logging.getLogger("blockx.executor")


class _ShutdownSignals:
    """Records SIGTERM/SIGINT and wakes the main loop without taking a lock in the handler."""

    def __init__(self) -> None:
        self.requested: str | None = None
        self._handled = 0
        self._session: UDSSession | None = None
        self._read_fd = -1
        self._write_fd = -1
        self._previous_wakeup_fd = -1
        self._watcher: threading.Thread | None = None
        self._previous: dict[int, object] = {}

    def install(self, session: UDSSession) -> None:
        self._session = session
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)
        self._previous_wakeup_fd = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        for signum in _SHUTDOWN_SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)
        self._watcher = threading.Thread(
            target=self._watch, name="blockx-signal-watcher", daemon=True
        )
        self._watcher.start()

    def uninstall(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
        self._previous.clear()
        if self._write_fd >= 0:
            signal.set_wakeup_fd(self._previous_wakeup_fd)
            os.close(self._write_fd)  # the watcher's read sees EOF and ends
            self._write_fd = -1
        if self._watcher is not None:
            self._watcher.join(1.0)
            self._watcher = None
        if self._read_fd >= 0:
            os.close(self._read_fd)
            self._read_fd = -1

    def _handle(self, signum: int, _frame: object) -> None:
        # Runs on the main thread at its next bytecode (possibly inside a call's greenlet).
        self._handled += 1
        name = signal.Signals(signum).name
        if self._handled > 1:
            os.write(2, f"blockx.executor: second {name}, exiting now\n".encode())
            from .containment import kill_descendants

            kill_descendants()
            os._exit(_EXIT_FORCED)
        if self.requested is None:
            self.requested = name

    def _watch(self) -> None:
        # The C-level handler writes each signal's number here before the Python handler
        # runs — and the kernel may have delivered the signal to another thread, leaving
        # a main thread blocked in wait_for_message unaware. So this thread records the
        # request itself and wakes the main loop.
        while True:
            try:
                data = os.read(self._read_fd, 64)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                if signum in _SHUTDOWN_SIGNALS and self.requested is None:
                    self.requested = signal.Signals(signum).name
            if self._session is not None:
                self._session.wake()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the executor; return the process exit status."""
    from blockx.portability import platform_problem

    problem = platform_problem()  # Windows: refused before anything POSIX-only runs
    if problem is not None:
        sys.stderr.write(f"blockx executor: start-up refused: {problem}\n")
        return EXIT_STARTUP_FAILED
    args = parse_args(argv)
    configure_logging(args.executor_id)
    try:
        return _run(args)
    finally:
        logging.shutdown()


def _run(args: ExecutorArgs) -> int:
    from .containment import become_subreaper, kill_descendants

    # A child user code starts (however it detaches) stays below this process, and
    # every exit path below kills it (docs/security.md "Containment").
    become_subreaper()
    try:
        return _run_contained(args)
    finally:
        kill_descendants()


def _run_contained(args: ExecutorArgs) -> int:
    from blockx.wire.blackbox import (
        CAUSE_DESCRIPTORS_EXHAUSTED,
        EXIT_DESCRIPTORS_EXHAUSTED,
        BlackboxWriter,
    )

    from .containment import (
        PAUSE_CLOCK,
        ProcessWatchdog,
        is_descriptor_exhaustion,
        limit_address_space,
        limit_open_files,
        memory_exit,
    )
    from .process_metrics import MetricsProbeError, ProcessMetricsSampler

    if args.max_open_files:
        try:
            limit_open_files(args.max_open_files)
        except (ValueError, OSError) as exc:
            _log.critical("executor start-up failed: cannot set RLIMIT_NOFILE: %s", exc)
            return EXIT_STARTUP_FAILED
    blackbox: BlackboxWriter | None = None
    if args.blackbox_path:
        try:
            blackbox = BlackboxWriter(args.blackbox_path)
        except OSError as exc:
            _log.critical("executor start-up failed: cannot open the black box: %s", exc)
            return EXIT_STARTUP_FAILED

    sampler = ProcessMetricsSampler()
    try:
        sampler.probe_capabilities()
    except MetricsProbeError as exc:
        _log.critical("executor start-up failed: %s", exc)
        return EXIT_STARTUP_FAILED

    from .uds_session import SessionConnectError, UDSSession

    try:
        session = UDSSession(
            args.socket_path,
            executor_id=args.executor_id,
            connect_timeout=args.connect_timeout,
        )
    except SessionConnectError as exc:
        _log.critical("executor start-up failed: %s", exc)
        return EXIT_CONNECT_FAILED

    signals = _ShutdownSignals()
    signals.install(session)
    heartbeat: HeartbeatThread | None = None
    try:
        try:
            from .runtime import ExecutorRuntime

            runtime = ExecutorRuntime(
                args.executor_id,
                session=session,
                max_inflight=args.executor_max_inflight,
                max_runnable=args.executor_max_runnable,
                metrics=sampler,
                blackbox=blackbox,
            )
        except Exception:
            _log.critical("executor start-up failed: cannot build the runtime", exc_info=True)
            return EXIT_STARTUP_FAILED

        from .heartbeat import HeartbeatThread

        heartbeat = HeartbeatThread(
            session,
            runtime.build_heartbeat,
            executor_id=args.executor_id,
            interval_s=args.heartbeat_interval,
        )
        heartbeat.start()
        limit_mb = args.memory_limit_mb
        on_memory_exceeded = memory_exit(blackbox, limit_mb)
        watchdog = ProcessWatchdog(
            memory_limit_bytes=limit_mb << 20, on_memory_exceeded=on_memory_exceeded
        )
        watchdog.start()
        signal.signal(signal.SIGCONT, lambda _signum, _frame: runtime.credit_pause(PAUSE_CLOCK))
        if limit_mb:
            runtime.set_memory_exit(on_memory_exceeded)
            # Last: every thread the executor needs has reserved its stack by now.
            limit_address_space(limit_mb << 20)
        # The dataclass methods compiled so far kept for the next executor (this one
        # leaves with os._exit); nothing user code compiles from here on is recorded.
        method_cache.save(stop=True)
        _log.info(
            "executor started",
            extra={
                "pid": os.getpid(),
                "socketPath": args.socket_path,
                "maxInflight": args.executor_max_inflight,
                "heartbeatIntervalS": args.heartbeat_interval,
                "memoryLimitMb": limit_mb,
                "maxOpenFiles": args.max_open_files,
                "blackboxPath": args.blackbox_path,
            },
        )

        descriptors_exhausted = False
        try:
            while session.is_connected() and signals.requested is None:
                runtime.run_until_idle()
                if signals.requested is not None or runtime.descriptors_exhausted:
                    break
                session.wait_for_message(timeout=runtime.next_scheduler_delay(None))
        except Exception as exc:
            if not is_descriptor_exhaustion(exc):
                _log.critical("executor main loop crashed", exc_info=True)
                watchdog.stop()
                heartbeat.stop()
                _end_runtime(runtime.on_transport_lost)
                return EXIT_INTERNAL_ERROR
            descriptors_exhausted = True
        watchdog.stop()

        if descriptors_exhausted or runtime.descriptors_exhausted:
            # Recycle: the failed call's CallFailed is queued; session.close (below)
            # flushes it. The calls still resident here are the worker's to place again.
            _log.error("executor out of file descriptors, exiting to be replaced")
            heartbeat.stop()
            _end_runtime(runtime.on_transport_lost)
            if blackbox is not None:
                blackbox.set_cause(CAUSE_DESCRIPTORS_EXHAUSTED)
            return EXIT_DESCRIPTORS_EXHAUSTED

        if signals.requested is not None:
            _log.info("executor shutting down on %s", signals.requested)
            heartbeat.stop()
            _end_runtime(runtime.shutdown)
            session.close(flush_timeout=2.0)
            return EXIT_OK

        _log.error(
            "executor lost its connection to the worker, exiting",
            extra={"reason": session.disconnect_reason},
        )
        heartbeat.stop()
        _end_runtime(runtime.on_transport_lost)
        return EXIT_TRANSPORT_LOST
    finally:
        if heartbeat is not None:
            heartbeat.stop()
        session.close(flush_timeout=2.0)
        signals.uninstall()


def _end_runtime(end: Callable[[], object]) -> None:
    """Run ``runtime.shutdown`` / ``on_transport_lost``; a failure there is logged, not raised."""
    try:
        end()
    except Exception:
        _log.exception("executor runtime did not end cleanly")


def _exit_now(status: int) -> NoReturn:
    """Flush stdout and stderr, then leave without the interpreter's finalization
    (step 6 of the module docstring)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed or broken stream: nothing more to say on it
            pass
    os._exit(status)


if __name__ == "__main__":
    _exit_now(main())
