"""Containment: what one bad call may do to its executor process, and no more.

Theory of operation
-------------------
The executor runs untrusted calls side by side in one process. The language
layers (budgets, the auditor) bound what Python code does; this module bounds
what the *process* may become, and makes its end say why (docs/security.md
"Containment"). The process shell (``__main__``) calls each part once:

* :func:`become_subreaper` — ``prctl(PR_SET_CHILD_SUBREAPER)``: a process user
  code starts stays below the executor however it detaches (``setsid``, a
  double fork), so :func:`kill_descendants` finds it by walking
  ``/proc/<pid>/task/*/children``. Every exit path the executor controls kills
  them all before the process goes (a ``SIGKILL`` from outside cannot; the
  worker's process-group kill covers that).
* :func:`limit_open_files` — ``RLIMIT_NOFILE`` soft and hard, never above the
  inherited hard limit. A call that fails for want of descriptors
  (:func:`is_descriptor_exhaustion`) makes the executor recycle itself after
  its ``CallFailed`` is sent (exit :data:`~blockx.wire.blackbox.EXIT_DESCRIPTORS_EXHAUSTED`).
* Memory (``--memory-limit-mb``), two measures because neither is enough alone:

  - :func:`limit_address_space` sets ``RLIMIT_AS`` to the address space the
    process has reserved at start (thread stacks, malloc arenas, libraries:
    reserved, mostly never touched) plus the limit. A single huge allocation
    (``bytearray(8 GiB)``, ``[0] * 10**10``) then fails at once with
    ``MemoryError`` instead of taking the host's memory inside one C call that
    holds the GIL, where no watchdog thread could run;
  - :class:`ProcessWatchdog` reads the resident set (``/proc/self/statm``) every
    :data:`WATCHDOG_INTERVAL_S` and ends the process as soon as it passes the
    limit (an allocation storm of small objects never hits ``RLIMIT_AS`` early).

  Either way — and when a call gets ``MemoryError`` — :func:`exit_now` sets the
  black box cause, leaves the running call named in it (that call is the
  suspect), kills the descendants and ``os._exit``s with
  :data:`~blockx.wire.blackbox.EXIT_MEMORY_EXCEEDED` at once: no frame, no
  clean-up that could allocate.
* Pauses: a process stopped from outside (``SIGSTOP`` … ``SIGCONT``) must not
  charge the stopped time to the call it was running. The watchdog thread also
  ticks a :class:`PauseClock`; a ``SIGCONT`` handler measures how long the ticks
  stopped and the runtime credits that back (``ExecutorRuntime.credit_pause``).
  The budget alarm holds its fire while the ticks are stale
  (:meth:`PauseClock.stale`), so the ``SIGALRM`` that comes due during the stop
  — delivered just before ``SIGCONT``'s handler runs — does not end the call first.

Linux only where it says so (prctl, ``/proc``). Elsewhere (macOS: README, "Supported
platforms") the subreaper and ``RLIMIT_AS`` parts do nothing, the
descendants are walked with psutil when installed, and the watchdog reads the
resident set from psutil, else the peak from ``getrusage``
(:mod:`blockx.portability`).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import resource
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Final

from blockx.portability import load_psutil, memory_readers, proc_available
from blockx.wire.blackbox import (
    CAUSE_MEMORY_EXCEEDED,
    EXIT_MEMORY_EXCEEDED,
    BlackboxWriter,
)

__all__ = [
    "MIN_OPEN_FILES",
    "PAUSE_CLOCK",
    "WATCHDOG_INTERVAL_S",
    "PauseClock",
    "ProcessWatchdog",
    "become_subreaper",
    "exit_now",
    "is_descriptor_exhaustion",
    "is_memory_exhaustion",
    "kill_descendants",
    "limit_address_space",
    "limit_open_files",
    "memory_exit",
    "resident_bytes",
]

_log = logging.getLogger("blockx.executor")

_PR_SET_CHILD_SUBREAPER: Final = 36
#: How often the watchdog thread reads the resident set and ticks the pause clock.
WATCHDOG_INTERVAL_S: Final = 0.05
#: Ticks older than this mean the watchdog thread could not run: the process was
#: stopped, or one C call held the GIL.
_STALE_AFTER_S: Final = 0.5
#: How long after a long gap between ticks the budget alarm still holds its fire.
_GAP_HOLD_S: Final = 1.0
_DESCRIPTOR_ERRNOS: Final = frozenset({errno.EMFILE, errno.ENFILE})


# --- children ------------------------------------------------------------------------


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux); False elsewhere
    or when the kernel refuses."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return _psutil_children(pid) if not proc_available() else found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children", "rb") as f:
                found.extend(int(word) for word in f.read().split())
        except (OSError, ValueError):
            continue
    return found


def kill_descendants(rounds: int = 20) -> int:
    """SIGKILL every descendant of this process (Linux ``/proc``); return how many were
    signalled. Repeated until a walk finds none alive: a child killed mid-fork leaves
    its own children to this process (a subreaper), and the next round finds them.
    Zombies among them are reaped."""
    me = os.getpid()
    killed = 0
    for _ in range(rounds):
        seen: set[int] = set()
        stack = _children(me)
        while stack:
            pid = stack.pop()
            if pid in seen:
                continue
            seen.add(pid)
            stack.extend(_children(pid))
        alive = [pid for pid in seen if not _is_zombie(pid)]
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except OSError:
                pass
        _reap_children()
        if not alive:
            break
        time.sleep(0.01)
    return killed


def _psutil_children(pid: int) -> list[int]:
    """``pid``'s children from psutil (no ``/proc``: macOS); none without psutil."""
    psutil = load_psutil()
    if psutil is None:
        return []
    try:
        return [child.pid for child in psutil.Process(pid).children()]
    except (psutil.Error, OSError):
        return []


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        psutil = None if proc_available() else load_psutil()
        if psutil is None:
            return True  # gone
        try:
            return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
        except (psutil.Error, OSError):
            return True  # gone
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] in (b"Z", b"X")


def _reap_children() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        except OSError:
            return
        if pid == 0:
            return


# --- descriptors ---------------------------------------------------------------------


#: The fewest descriptors the executor itself needs (its socket, pipes, imports, logs).
MIN_OPEN_FILES: Final = 32


def limit_open_files(limit: int) -> int:
    """Set ``RLIMIT_NOFILE`` soft and hard to ``limit`` (at least :data:`MIN_OPEN_FILES`),
    never above the inherited hard limit; return the limit in force (0: ``limit`` was
    0, nothing changed)."""
    if limit <= 0:
        return 0
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = max(limit, MIN_OPEN_FILES)
    value = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (value, value))
    return value


def is_descriptor_exhaustion(error: BaseException | None) -> bool:
    """``error``, or an exception it was raised from or while handling, is an
    ``OSError`` for want of file descriptors (``EMFILE`` / ``ENFILE``)."""
    seen = 0
    while error is not None and seen < 32:
        if isinstance(error, OSError) and error.errno in _DESCRIPTOR_ERRNOS:
            return True
        seen += 1
        error = error.__cause__ or error.__context__
    return False


def is_memory_exhaustion(error: BaseException | None) -> bool:
    """``error``, or an exception it was raised from or while handling, is a
    ``MemoryError`` (a call that turned it into another error is still out of memory)."""
    seen = 0
    while error is not None and seen < 32:
        if isinstance(error, MemoryError):
            return True
        seen += 1
        error = error.__cause__ or error.__context__
    return False


# --- memory --------------------------------------------------------------------------


#: Where ``/proc/self/statm`` is missing: the RSS readers tried, in order.
_FALLBACK_MEMORY_SOURCES: Final = ("psutil", "getrusage")


def _statm_fields() -> list[bytes]:
    with open("/proc/self/statm", "rb") as f:
        return f.read().split()


def resident_bytes() -> int:
    """This process's resident set size; where ``/proc`` is missing, psutil's, else the
    peak from ``getrusage`` (:func:`blockx.portability.memory_readers`); 0 if none."""
    try:
        return int(_statm_fields()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    for _name, read in memory_readers(sources=_FALLBACK_MEMORY_SOURCES):
        try:
            return read()
        except (OSError, ValueError, IndexError):
            continue
    return 0


def limit_address_space(limit_bytes: int) -> int:
    """Set ``RLIMIT_AS`` to the address space reserved now plus ``limit_bytes`` (never
    above an inherited limit); return it (0: not set). Call once every thread the
    executor itself needs has started (their stacks are reserved then)."""
    if limit_bytes <= 0:
        return 0
    try:
        reserved = int(_statm_fields()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    value = reserved + limit_bytes
    for inherited in (soft, hard):  # never loosen a limit set from outside (a sandbox's)
        if inherited != resource.RLIM_INFINITY:
            value = min(value, inherited)
    try:
        resource.setrlimit(resource.RLIMIT_AS, (value, hard))
    except (ValueError, OSError):
        _log.warning("could not set RLIMIT_AS", exc_info=True)
        return 0
    return value


def exit_now(status: int, cause: int, blackbox: BlackboxWriter | None, message: str) -> None:
    """End the process at once: the black box cause set (the running call stays
    named), ``message`` on stderr, every descendant killed, ``os._exit(status)``.
    Safe from any thread; allocates as little as it can."""
    try:
        if blackbox is not None:
            blackbox.set_cause(cause)
        os.write(2, message.encode("utf-8", "replace") + b"\n")
        kill_descendants()
    finally:
        os._exit(status)


class PauseClock:
    """The watchdog's ticks, read to tell a stopped process from a slow call.

    ``last_tick`` is the monotonic time of the latest tick (0.0: nobody ticks);
    ``recent_gap`` the longest gap between two ticks seen lately (cleared once
    credited). Written by the watchdog thread, read by signal handlers on the main
    thread: single float stores, no lock.
    """

    __slots__ = ("interval_s", "last_tick", "recent_gap", "recent_gap_at")

    def __init__(self) -> None:
        self.last_tick = 0.0
        self.recent_gap = 0.0
        self.recent_gap_at = 0.0
        self.interval_s = WATCHDOG_INTERVAL_S

    def __repr__(self) -> str:
        return f"PauseClock(last_tick={self.last_tick:.3f}, recent_gap={self.recent_gap:.3f})"

    def tick(self, now: float) -> None:
        last = self.last_tick
        if last:
            gap = now - last
            if gap > _STALE_AFTER_S and gap > self.recent_gap:
                self.recent_gap = gap
                self.recent_gap_at = now
        self.last_tick = now

    def stale(self, now: float) -> bool:
        """The ticks stopped (the process was stopped, or a C call held the GIL) now, or
        a long gap was seen within the last second and no ``SIGCONT`` took it yet: the
        budget alarm holds its fire then (the watchdog thread may tick before the main
        thread runs the ``SIGCONT`` handler). A gap no ``SIGCONT`` follows delays the
        alarm by a second at most."""
        last = self.last_tick
        if not last:
            return False
        if now - last > _STALE_AFTER_S:
            return True
        return bool(self.recent_gap) and now - self.recent_gap_at < _GAP_HOLD_S

    def take_pause(self, now: float) -> float:
        """On ``SIGCONT``: how long the process was stopped (seconds, 0.0 if unknown):
        the silence since the last tick, or the long gap a tick saw just after the
        resume, less one tick interval."""
        last = self.last_tick
        if not last:
            return 0.0
        gap = now - last
        if self.recent_gap and now - self.recent_gap_at < _GAP_HOLD_S and self.recent_gap > gap:
            gap = self.recent_gap
        self.recent_gap = 0.0
        paused = gap - self.interval_s
        return paused if paused > 0.0 else 0.0


#: The process's pause clock (ticked only while a :class:`ProcessWatchdog` runs).
PAUSE_CLOCK: Final = PauseClock()


class ProcessWatchdog:
    """A daemon thread: every ``interval_s`` it ticks the pause clock and, with a
    memory limit, ends the process (``on_memory_exceeded``) once the resident set
    passes ``memory_limit_bytes``."""

    def __init__(
        self,
        *,
        memory_limit_bytes: int,
        on_memory_exceeded: Callable[[int], None],
        pause_clock: PauseClock = PAUSE_CLOCK,
        interval_s: float = WATCHDOG_INTERVAL_S,
        statm_path: str = "/proc/self/statm",
    ) -> None:
        self.memory_limit_bytes = memory_limit_bytes
        #: Where the resident set is read (Linux); when it cannot be opened, psutil or
        #: getrusage (``_FALLBACK_MEMORY_SOURCES``) instead.
        self.statm_path = statm_path
        self._on_memory_exceeded = on_memory_exceeded
        self._pause_clock = pause_clock
        self._interval_s = interval_s
        pause_clock.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:
        return (
            f"ProcessWatchdog(limit={self.memory_limit_bytes >> 20} MiB, "
            f"every {self._interval_s:g}s)"
        )

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="blockx-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(1.0)

    def _run(self) -> None:
        limit = self.memory_limit_bytes
        page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        fd = -1
        fallback: Callable[[], int] | None = None
        if limit:
            try:
                fd = os.open(self.statm_path, os.O_RDONLY)
            except OSError:
                # No /proc (macOS): psutil's RSS, else getrusage's peak (never falls: a
                # process that once passed the limit is ended, which errs on the safe side).
                readers = memory_readers(sources=_FALLBACK_MEMORY_SOURCES)
                if readers:
                    name, fallback = readers[0]
                    _log.info("memory limit enforced from %s (no %s)", name, self.statm_path)
                else:
                    _log.error("memory limit not enforced by RSS: no way to read it here")
        clock = self._pause_clock
        monotonic = time.monotonic
        wait = self._stop.wait
        interval = self._interval_s
        try:
            while not wait(interval):
                clock.tick(monotonic())
                if fd >= 0:
                    try:
                        resident = int(os.pread(fd, 128, 0).split()[1]) * page
                    except (OSError, ValueError, IndexError):
                        continue
                    if resident > limit:
                        self._on_memory_exceeded(resident)
                elif fallback is not None:
                    try:
                        resident = fallback()
                    except (OSError, ValueError, IndexError):
                        continue
                    if resident > limit:
                        self._on_memory_exceeded(resident)
        finally:
            if fd >= 0:
                os.close(fd)


def memory_exit(blackbox: BlackboxWriter | None, limit_mb: int) -> Callable[[int], None]:
    """The action on a memory limit passed (``resident``: bytes, 0 when a call got
    ``MemoryError``): :func:`exit_now` with :data:`EXIT_MEMORY_EXCEEDED`."""

    def end(resident: int) -> None:
        what = f"resident set {resident >> 20} MiB" if resident else "a call got MemoryError"
        exit_now(
            EXIT_MEMORY_EXCEEDED,
            CAUSE_MEMORY_EXCEEDED,
            blackbox,
            f"blockx.executor: memory limit of {limit_mb} MB exceeded ({what}), exiting",
        )

    return end
