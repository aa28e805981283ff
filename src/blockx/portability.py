"""Platforms: where BlockX runs, and a process's figures where ``/proc`` is missing.

Theory of operation
-------------------
BlockX runs on **Linux** (everything) and **macOS** (README, "Supported
platforms"). An executor needs ``fork``/``exec``, Unix domain sockets and POSIX
signals (``SIGALRM`` budgets, ``SIGSTOP``/``SIGCONT``), so **Windows is
refused at start** with a message that says so (:func:`check_platform`: the
worker's start, ``blockx run``/``serve`` and the executor process call it),
rather than failing later on a missing ``AF_UNIX`` or signal. Other POSIX
systems are not refused, and not tested.

Linux-only parts (each module says so): ``/proc`` (memory, process trees,
executor marks), ``prctl`` (subreaper, parent-death signal), cgroups and
the bubblewrap sandbox. Where ``/proc`` is missing the figures come from:

* **psutil**, when installed (a dependency on non-Linux platforms: pyproject):
  the resident set, a process's children, parent, start time and environment;
* else **resource** (``getrusage``): the *peak* resident set (``ru_maxrss``,
  bytes on macOS, KiB on Linux) — never falling, so a memory guard fed with it
  is conservative, not blind;
* CPU time is ``time.process_time()`` everywhere.

:func:`memory_readers` lists the RSS readers in that order for
:class:`blockx.executor.process_metrics.ProcessMetricsSampler` and the
executor's watchdog. Nothing here imports psutil before it is needed (an
executor on Linux never does).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any, Final

__all__ = [
    "MEMORY_SOURCES",
    "SUPPORTED_PLATFORMS",
    "UnsupportedPlatformError",
    "check_platform",
    "load_psutil",
    "memory_readers",
    "peak_rss_bytes",
    "platform_problem",
    "proc_available",
]

#: ``sys.platform`` prefixes BlockX supports.
SUPPORTED_PLATFORMS: Final = ("linux", "darwin")
#: The RSS readers, in the order tried (:func:`memory_readers`).
MEMORY_SOURCES: Final = ("statm", "psutil", "getrusage")

_WINDOWS: Final = ("win32", "cygwin", "msys")


class UnsupportedPlatformError(RuntimeError):
    """BlockX cannot run on this platform (Windows)."""


def platform_problem(platform: str | None = None) -> str | None:
    """Why BlockX cannot run on ``platform`` (default: this one), or None."""
    name = sys.platform if platform is None else platform
    if name.startswith(_WINDOWS):
        return (
            f"BlockX does not run on Windows (sys.platform is {name!r}): its executors need "
            "fork, Unix domain sockets and POSIX signals. Supported platforms: Linux and "
            "macOS. On Windows, run it inside WSL 2 (a Linux) or a Linux container."
        )
    return None


def check_platform(platform: str | None = None) -> None:
    """Raise :class:`UnsupportedPlatformError` on Windows (see :func:`platform_problem`)."""
    problem = platform_problem(platform)
    if problem is not None:
        raise UnsupportedPlatformError(problem)


def proc_available(root: str = "/proc") -> bool:
    """Whether ``root`` is a Linux-style process table (``/proc/self/stat`` readable)."""
    return os.path.exists(os.path.join(root, "self", "stat"))


def load_psutil() -> Any:
    """The psutil module, or None when it is not installed."""
    try:
        import psutil  # type: ignore[import-not-found,import-untyped,unused-ignore]
    except ImportError:
        return None
    return psutil


def peak_rss_bytes() -> int:
    """This process's peak resident set (``getrusage``): bytes on macOS, KiB elsewhere."""
    import resource

    peak = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return peak if sys.platform == "darwin" else peak * 1024


def _statm_reader(statm_path: str, page_size: int) -> Callable[[], int]:
    def read() -> int:
        with open(statm_path, "rb") as statm:
            fields = statm.read(256).split()
        return int(fields[1]) * page_size

    return read


def _psutil_reader() -> Callable[[], int] | None:
    """psutil's RSS reader when psutil is installed, else None. psutil is imported at the
    first read, not here: listing the sources is free where ``statm`` answers (an
    executor on Linux never reads psutil, and importing it cost ~20 ms per start)."""
    import importlib.util

    if importlib.util.find_spec("psutil") is None:
        return None
    process: Any = None

    def read() -> int:
        nonlocal process
        psutil = load_psutil()
        if psutil is None:  # pragma: no cover - found above, gone at the first read
            raise OSError("psutil: not importable")
        try:
            if process is None:
                process = psutil.Process()
            return int(process.memory_info().rss)
        except (psutil.Error, OSError) as exc:  # the process table refused: a failed read
            raise OSError(f"psutil: {exc}") from exc

    return read


def memory_readers(
    statm_path: str = "/proc/self/statm",
    page_size: int = 4096,
    sources: tuple[str, ...] = MEMORY_SOURCES,
) -> list[tuple[str, Callable[[], int]]]:
    """``(name, read)`` for each RSS source of ``sources`` available here, in order:
    ``statm`` (the current RSS, Linux), ``psutil`` (the current RSS, when installed),
    ``getrusage`` (the peak RSS, every POSIX system). ``read()`` returns bytes and
    raises ``OSError``/``ValueError``/``IndexError`` when it cannot."""
    readers: list[tuple[str, Callable[[], int]]] = []
    for name in sources:
        if name == "statm":
            readers.append((f"statm ({statm_path})", _statm_reader(statm_path, page_size)))
        elif name == "psutil":
            reader = _psutil_reader()
            if reader is not None:
                readers.append(("psutil", reader))
        elif name == "getrusage":
            try:
                import resource  # noqa: F401 - POSIX only
            except ImportError:  # pragma: no cover - Windows is refused before this
                continue
            readers.append(("getrusage (peak RSS)", peak_rss_bytes))
        else:
            raise ValueError(f"unknown memory source {name!r} (known: {MEMORY_SOURCES})")
    return readers
