"""ProcessMetricsSampler: real /proc readings, the probe with retries, utilisation over
an interval, and the last value kept when a sample fails."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from blockx.executor.process_metrics import MetricsProbeError, ProcessMetricsSampler


class FakeClock:
    def __init__(self, start: float) -> None:
        self.now = start
        self.fail = False

    def __call__(self) -> float:
        if self.fail:
            raise OSError("clock unavailable")
        return self.now


def _statm(tmp_path: Path, resident_pages: int) -> Path:
    path = tmp_path / "statm"
    path.write_text(f"12345 {resident_pages} 300 4 0 600 0\n")
    return path


def test_real_rss_matches_proc_status() -> None:
    sampler = ProcessMetricsSampler()
    sampler.probe_capabilities()
    rss = sampler.sample_memory_bytes()
    with open("/proc/self/status") as status:
        vm_rss_kib = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    assert rss > 1 << 20
    assert abs(rss - vm_rss_kib * 1024) < 16 << 20


def test_real_rss_grows_with_allocation() -> None:
    sampler = ProcessMetricsSampler()
    before = sampler.sample_memory_bytes()
    block = bytearray(64 << 20)
    block[::4096] = b"x" * len(block[::4096])  # touch every page
    after = sampler.sample_memory_bytes()
    del block
    assert after - before > 48 << 20


def test_real_cpu_counts_busy_time() -> None:
    import time

    sampler = ProcessMetricsSampler()
    sampler.probe_capabilities()
    _, start_total = sampler.sample_cpu()
    wall_start, cpu_start = time.monotonic(), time.process_time()
    while time.process_time() - cpu_start < 0.1:  # 100 ms of CPU, however long that takes
        pass
    utilization, total = sampler.sample_cpu()
    share = (time.process_time() - cpu_start) / (time.monotonic() - wall_start)
    assert total - start_total >= 0.1
    assert 0.0 < utilization <= 1.0
    assert utilization >= 0.5 * min(share, 1.0)  # what this process really got of a core


def test_memory_is_resident_pages_times_page_size(tmp_path: Path) -> None:
    sampler = ProcessMetricsSampler(statm_path=str(_statm(tmp_path, 2500)), page_size=4096)
    sampler.probe_capabilities()
    assert sampler.sample_memory_bytes() == 2500 * 4096


def test_default_page_size_is_the_systems(tmp_path: Path) -> None:
    sampler = ProcessMetricsSampler(statm_path=str(_statm(tmp_path, 10)))
    assert sampler.sample_memory_bytes() == 10 * os.sysconf("SC_PAGE_SIZE")


def test_utilization_is_cpu_over_wall_time_since_the_last_sample(tmp_path: Path) -> None:
    cpu, wall = FakeClock(10.0), FakeClock(1000.25)
    sampler = ProcessMetricsSampler(
        statm_path=str(_statm(tmp_path, 1)), cpu_clock=cpu, wall_clock=wall
    )
    sampler.probe_capabilities()
    cpu.now, wall.now = 10.5, 1002.25  # 0.5 s CPU over 2 s
    assert sampler.sample_cpu() == (0.25, 10.5)
    cpu.now, wall.now = 11.5, 1003.25  # 1 s over 1 s
    assert sampler.sample_cpu() == (1.0, 11.5)
    cpu.now, wall.now = 13.5, 1004.25  # 2 s over 1 s (several threads): clamped
    assert sampler.sample_cpu() == (1.0, 13.5)
    wall.now = 1005.25  # idle second
    assert sampler.sample_cpu() == (0.0, 13.5)


def test_a_sample_right_after_another_keeps_the_last_utilization(tmp_path: Path) -> None:
    cpu, wall = FakeClock(1.0), FakeClock(50.0)
    sampler = ProcessMetricsSampler(
        statm_path=str(_statm(tmp_path, 1)), cpu_clock=cpu, wall_clock=wall
    )
    sampler.probe_capabilities()
    cpu.now, wall.now = 1.5, 51.0
    assert sampler.sample_cpu() == (0.5, 1.5)
    cpu.now, wall.now = 1.5001, 51.0001
    assert sampler.sample_cpu() == (0.5, 1.5001)


def test_cpu_without_a_probe_starts_the_interval_at_the_first_sample(tmp_path: Path) -> None:
    cpu, wall = FakeClock(3.0), FakeClock(7.0)
    sampler = ProcessMetricsSampler(
        statm_path=str(_statm(tmp_path, 1)), cpu_clock=cpu, wall_clock=wall
    )
    assert sampler.sample_cpu() == (0.0, 3.0)
    cpu.now, wall.now = 3.25, 8.0
    assert sampler.sample_cpu() == (0.25, 3.25)


def test_a_failed_memory_sample_keeps_the_last_value(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    statm = _statm(tmp_path, 100)
    sampler = ProcessMetricsSampler(statm_path=str(statm), page_size=4096)
    sampler.probe_capabilities()
    statm.unlink()
    assert sampler.sample_memory_bytes() == 100 * 4096
    assert sampler.sample_memory_bytes() == 100 * 4096
    assert sum("RSS sample failed" in r.getMessage() for r in caplog.records) == 1
    statm.write_text("garbage")
    assert sampler.sample_memory_bytes() == 100 * 4096
    _statm(tmp_path, 200)
    assert sampler.sample_memory_bytes() == 200 * 4096


def test_a_failed_cpu_sample_keeps_the_last_values(tmp_path: Path) -> None:
    cpu, wall = FakeClock(1.0), FakeClock(10.0)
    sampler = ProcessMetricsSampler(
        statm_path=str(_statm(tmp_path, 1)), cpu_clock=cpu, wall_clock=wall
    )
    sampler.probe_capabilities()
    cpu.now, wall.now = 1.5, 11.0
    assert sampler.sample_cpu() == (0.5, 1.5)
    cpu.fail = True
    assert sampler.sample_cpu() == (0.5, 1.5)
    cpu.fail = False
    cpu.now, wall.now = 2.0, 13.0  # the interval stayed open over the failure: 0.5 s / 2 s
    assert sampler.sample_cpu() == (0.25, 2.0)


def test_probe_retries_then_succeeds(tmp_path: Path) -> None:
    statm = tmp_path / "statm"
    attempts = {"n": 0}

    class FlakyClock:
        def __call__(self) -> float:
            attempts["n"] += 1
            if attempts["n"] < 3:
                raise OSError("not yet")
            return 1.0

    _statm(tmp_path, 5)
    sampler = ProcessMetricsSampler(statm_path=str(statm), page_size=4096, cpu_clock=FlakyClock())
    sampler.probe_capabilities(attempts=3, retry_delay_s=0)
    assert attempts["n"] == 3
    assert sampler.sample_memory_bytes() == 5 * 4096


def test_probe_failure_is_a_clear_start_up_error(tmp_path: Path) -> None:
    """With no source that answers (here: only a missing statm file), start-up fails."""
    sampler = ProcessMetricsSampler(statm_path=str(tmp_path / "nope"), memory_sources=("statm",))
    with pytest.raises(
        MetricsProbeError, match=r"cannot sample process metrics .*nope.* after 3 attempts"
    ):
        sampler.probe_capabilities(attempts=3, retry_delay_s=0)


def test_probe_refuses_a_zero_rss(tmp_path: Path) -> None:
    sampler = ProcessMetricsSampler(statm_path=str(_statm(tmp_path, 0)), memory_sources=("statm",))
    with pytest.raises(MetricsProbeError, match="RSS of 0"):
        sampler.probe_capabilities(attempts=2, retry_delay_s=0)


def test_repr_shows_the_last_values(tmp_path: Path) -> None:
    sampler = ProcessMetricsSampler(statm_path=str(_statm(tmp_path, 3)), page_size=1000)
    sampler.probe_capabilities()
    assert "memory=3000B" in repr(sampler)
