"""ProcessMetricsSampler: the executor's own RSS and CPU, for every Heartbeat.

Theory of operation
-------------------
* **Memory** is the resident set size: the second field of ``/proc/self/statm``
  (pages) times the page size. Reading it is one small ``read`` — cheap enough
  for every heartbeat. Where ``/proc`` is missing (macOS) it comes from psutil
  when installed, else from ``getrusage``'s *peak* RSS (:mod:`blockx.portability`,
  :func:`~blockx.portability.memory_readers`): the probe takes the first source
  that answers, and :attr:`ProcessMetricsSampler.memory_source` names it.
* **CPU** is ``time.process_time()`` (user + system seconds of every thread of
  the process). :meth:`ProcessMetricsSampler.sample_cpu` returns the cumulative
  seconds and the utilisation over the wall-clock interval since the previous
  sample, clamped to 0..1 (the reader and writer threads can briefly push the
  process above one core; the heartbeat field is defined as 0..1).
* :meth:`ProcessMetricsSampler.probe_capabilities` runs once at start-up, with
  retries: an executor that cannot report its memory from any source would be
  invisible to the worker's memory guard, so it refuses to start
  (:class:`MetricsProbeError`, naming every source tried).
* At run time a failed sample is logged (once per kind until it recovers) and
  the last good value is returned: a heartbeat is never lost to a metrics hiccup.

Thread-safety: the heartbeat thread is the usual caller; a lock keeps the CPU
interval bookkeeping consistent if the runtime samples from the main thread too.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from blockx.portability import MEMORY_SOURCES, memory_readers

__all__ = ["MetricsProbeError", "ProcessMetricsSampler"]

_log = logging.getLogger("blockx.executor.metrics")

# A sample taken sooner than this after the previous one reuses the last utilisation:
# dividing by a near-zero interval gives noise, not information.
_MIN_CPU_INTERVAL_S = 0.001


class MetricsProbeError(RuntimeError):
    """The start-up probe could not read this process's memory or CPU time."""


class ProcessMetricsSampler:
    """Samples RSS (``/proc/self/statm``, else psutil, else ``getrusage``) and CPU
    (``time.process_time``).

    ``statm_path``, ``page_size``, ``memory_sources`` (a subset of
    :data:`~blockx.portability.MEMORY_SOURCES`, in the order tried), ``cpu_clock`` and
    ``wall_clock`` are injectable for tests; the defaults are the real process's.
    """

    def __init__(
        self,
        *,
        statm_path: str = "/proc/self/statm",
        page_size: int | None = None,
        memory_sources: tuple[str, ...] = MEMORY_SOURCES,
        cpu_clock: Callable[[], float] = time.process_time,
        wall_clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._statm_path = statm_path
        self._page_size = page_size if page_size is not None else _system_page_size()
        self._readers = memory_readers(statm_path, self._page_size, memory_sources)
        #: The source memory is read from: the first of ``memory_sources`` that answered
        #: the probe (until then the first available).
        self.memory_source = self._readers[0][0] if self._readers else "none"
        self._read_memory: Callable[[], int] = (
            self._readers[0][1] if self._readers else _no_memory_source
        )
        self._cpu_clock = cpu_clock
        self._wall_clock = wall_clock
        self._lock = threading.Lock()
        # Last good values, returned when a sample fails.
        self._last_memory_bytes = 0
        self._last_cpu_seconds = 0.0
        self._last_utilization = 0.0
        # Start of the current CPU interval; None until the first sample (or the probe).
        self._interval_cpu: float | None = None
        self._interval_wall = 0.0
        self._memory_failing = False
        self._cpu_failing = False

    def __repr__(self) -> str:
        return (
            f"ProcessMetricsSampler(memory={self._last_memory_bytes}B from {self.memory_source}, "
            f"cpu={self._last_cpu_seconds:.3f}s, utilization={self._last_utilization:.2f})"
        )

    # --- start-up -------------------------------------------------------------------

    def probe_capabilities(self, *, attempts: int = 3, retry_delay_s: float = 0.05) -> None:
        """Check once, with retries, that both samples work; start the CPU interval.

        Raises :class:`MetricsProbeError` naming what failed after ``attempts``
        tries. Call it before the first heartbeat.
        """
        last_error: Exception | None = None
        for attempt in range(1, max(attempts, 1) + 1):
            try:
                memory = self._probe_memory(final=attempt >= attempts)
                cpu = float(self._cpu_clock())
                wall = float(self._wall_clock())
            except (OSError, ValueError, IndexError) as exc:
                last_error = exc
                _log.warning(
                    "process metrics probe failed (attempt %d of %d): %s", attempt, attempts, exc
                )
                if attempt < attempts:
                    time.sleep(retry_delay_s)
                continue
            with self._lock:
                self._last_memory_bytes = memory
                self._last_cpu_seconds = cpu
                self._interval_cpu = cpu
                self._interval_wall = wall
            return
        tried = ", ".join(name for name, _read in self._readers) or "no memory source"
        raise MetricsProbeError(
            f"cannot sample process metrics (memory: {tried}; CPU: process_time) after "
            f"{attempts} attempts: {last_error}"
        )

    def _probe_memory(self, *, final: bool) -> int:
        """The RSS from the first source that gives a positive one; that source is kept
        for every later sample. Raises the last source's error when none does.

        A source that is missing (no such file: no ``/proc``) is passed over at once; one
        that is there but fails is passed over only on the ``final`` attempt (before
        that its error is raised, and the probe retries it): a hiccup at start-up must
        not leave a Linux executor on ``getrusage``'s peak for life."""
        problems: list[str] = []
        for name, read in self._readers:
            try:
                memory = read()
            except (OSError, ValueError, IndexError) as exc:
                if not final and not isinstance(exc, FileNotFoundError):
                    raise
                problems.append(f"{name}: {exc}")
                continue
            if memory <= 0:
                problems.append(f"{name} reports an RSS of {memory} bytes")
                continue
            if name != self.memory_source:
                _log.info("process memory read from %s (%s)", name, "; ".join(problems))
            self.memory_source, self._read_memory = name, read
            return memory
        raise OSError("; ".join(problems) or "no memory source on this platform")

    # --- sampling ------------------------------------------------------------------

    def sample_memory_bytes(self) -> int:
        """Resident set size in bytes; the last good value if the read fails."""
        try:
            memory = self._read_rss_bytes()
        except (OSError, ValueError, IndexError) as exc:
            if not self._memory_failing:
                self._memory_failing = True
                _log.warning("RSS sample failed, reporting the last value: %s", exc)
            return self._last_memory_bytes
        if self._memory_failing:
            self._memory_failing = False
            _log.info("RSS sampling recovered")
        self._last_memory_bytes = memory
        return memory

    def sample_cpu(self) -> tuple[float, float]:
        """``(utilization, cpu_seconds_total)``.

        ``utilization`` is the process's CPU time over wall time since the
        previous sample, in 0..1; ``cpu_seconds_total`` is cumulative. A failed
        read returns the last values and keeps the interval open.
        """
        with self._lock:
            try:
                cpu = float(self._cpu_clock())
                wall = float(self._wall_clock())
            except (OSError, ValueError) as exc:
                if not self._cpu_failing:
                    self._cpu_failing = True
                    _log.warning("CPU sample failed, reporting the last value: %s", exc)
                return self._last_utilization, self._last_cpu_seconds
            self._cpu_failing = False
            if self._interval_cpu is None:
                self._interval_cpu, self._interval_wall = cpu, wall
                self._last_cpu_seconds = cpu
                return self._last_utilization, cpu
            elapsed = wall - self._interval_wall
            if elapsed >= _MIN_CPU_INTERVAL_S:
                used = max(cpu - self._interval_cpu, 0.0)
                self._last_utilization = min(max(used / elapsed, 0.0), 1.0)
                self._interval_cpu, self._interval_wall = cpu, wall
            self._last_cpu_seconds = cpu
            return self._last_utilization, cpu

    # --- reading ---------------------------------------------------------------------

    def _read_rss_bytes(self) -> int:
        return self._read_memory()


def _no_memory_source() -> int:
    raise OSError("no memory source on this platform")


def _system_page_size() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):  # pragma: no cover - every Linux has it
        return 4096
