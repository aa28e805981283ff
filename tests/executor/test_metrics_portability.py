"""Memory figures where ``/proc`` is missing (issue #22, item 5): psutil when installed,
else ``getrusage``'s peak RSS. On Linux the missing ``/proc/self/statm`` is a path that
does not exist; the fallbacks then read this very process for real."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from blockx.executor.process_metrics import MetricsProbeError, ProcessMetricsSampler
from blockx.portability import memory_readers


def _real_rss() -> int:
    with open("/proc/self/statm", "rb") as f:
        import os

        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_without_statm_memory_comes_from_psutil(tmp_path: Path) -> None:
    pytest.importorskip("psutil", reason="psutil is in the test extra")
    sampler = ProcessMetricsSampler(statm_path=str(tmp_path / "no-proc" / "statm"))
    sampler.probe_capabilities(attempts=1)
    assert sampler.memory_source == "psutil"
    memory = sampler.sample_memory_bytes()
    # The same process's RSS read two ways a moment apart: the same order of magnitude.
    assert memory > 0
    assert 0.5 < memory / _real_rss() < 2, (memory, _real_rss())
    assert "from psutil" in repr(sampler)


def test_without_statm_or_psutil_memory_is_the_peak_from_getrusage(tmp_path: Path) -> None:
    sampler = ProcessMetricsSampler(
        statm_path=str(tmp_path / "nope"), memory_sources=("statm", "getrusage")
    )
    sampler.probe_capabilities(attempts=1)
    assert sampler.memory_source == "getrusage (peak RSS)"
    peak = sampler.sample_memory_bytes()
    assert peak >= _real_rss() * 0.9  # a peak: never below the current RSS


def test_the_getrusage_peak_follows_a_growing_process(tmp_path: Path) -> None:
    """A process that grows 64 MiB past its peak shows it. In a child process: Linux
    carries the parent's peak across fork and exec, so the child grows past that first."""
    script = f"""
import os
from blockx.executor.process_metrics import ProcessMetricsSampler
s = ProcessMetricsSampler(statm_path={str(tmp_path / "nope")!r}, memory_sources=("getrusage",))
s.probe_capabilities(attempts=1)
before = s.sample_memory_bytes()
with open("/proc/self/statm", "rb") as f:
    rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
ballast = bytearray(max(before - rss, 0) + (64 << 20))
for i in range(0, len(ballast), 4096):
    ballast[i] = 1
print(before, s.sample_memory_bytes())
"""
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    before, after = map(int, proc.stdout.split())
    assert after - before >= 48 << 20, (before, after)


def test_statm_is_preferred_where_it_exists(tmp_path: Path) -> None:
    statm = tmp_path / "statm"
    statm.write_text("100 7 0 0 0 0 0\n")
    sampler = ProcessMetricsSampler(statm_path=str(statm), page_size=4096)
    sampler.probe_capabilities(attempts=1)
    assert sampler.memory_source.startswith("statm")
    assert sampler.sample_memory_bytes() == 7 * 4096


def test_the_probe_names_every_source_it_tried(tmp_path: Path) -> None:
    sampler = ProcessMetricsSampler(
        statm_path=str(tmp_path / "nope"), memory_sources=("statm",), page_size=4096
    )
    with pytest.raises(MetricsProbeError, match=r"memory: statm \(.*nope\)"):
        sampler.probe_capabilities(attempts=1, retry_delay_s=0)


def test_unknown_source_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown memory source"):
        memory_readers(sources=("proc",))


def test_the_watchdog_enforces_the_memory_limit_without_proc(tmp_path: Path) -> None:
    """No ``/proc/self/statm`` to open: the watchdog reads psutil's RSS (else getrusage's
    peak) and still ends a process over its limit (here: a limit of one byte)."""
    import threading

    from blockx.executor.containment import PauseClock, ProcessWatchdog

    seen: list[int] = []
    fired = threading.Event()

    def exceeded(resident: int) -> None:
        seen.append(resident)
        fired.set()

    watchdog = ProcessWatchdog(
        memory_limit_bytes=1,
        on_memory_exceeded=exceeded,
        pause_clock=PauseClock(),
        interval_s=0.01,
        statm_path=str(tmp_path / "no-proc" / "statm"),
    )
    watchdog.start()
    try:
        assert fired.wait(60), "the watchdog never read the resident set"
    finally:
        watchdog.stop()
    assert seen[0] > 1 << 20


def test_resident_bytes_has_a_value_everywhere() -> None:
    from blockx.executor.containment import resident_bytes

    assert resident_bytes() > 1 << 20


def test_a_statm_hiccup_is_retried_not_abandoned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A statm that is there but unreadable for a moment is tried again: the sampler does
    not settle on a fallback for life. A statm still failing at the last attempt is left."""
    import blockx.executor.process_metrics as pm

    statm = tmp_path / "statm"
    statm.write_text("garbage\n")  # there, but no second field: IndexError
    sampler = ProcessMetricsSampler(statm_path=str(statm), page_size=4096)
    pauses: list[float] = []

    def fix_then_wait(delay: float) -> None:  # the retry's pause: the file is fixed meanwhile
        pauses.append(delay)
        statm.write_text("100 9 0 0 0 0 0\n")

    monkeypatch.setattr(pm.time, "sleep", fix_then_wait)
    sampler.probe_capabilities(attempts=3, retry_delay_s=0.01)
    monkeypatch.undo()
    assert pauses == [0.01]
    assert sampler.memory_source.startswith("statm")
    assert sampler.sample_memory_bytes() == 9 * 4096

    statm.write_text("garbage\n")
    stuck = ProcessMetricsSampler(statm_path=str(statm), memory_sources=("statm", "getrusage"))
    stuck.probe_capabilities(attempts=2, retry_delay_s=0)
    assert stuck.memory_source == "getrusage (peak RSS)"
