"""Containment inside the runtime (issue 15): the black box names the call holding the
thread at every switch, a call's ``MemoryError`` ends the process with that call named,
a call failing for want of descriptors marks the executor for recycling, and time the
process stood stopped is credited back to the running call."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from executor_harness import Harness

from blockx.executor.containment import PauseClock, is_descriptor_exhaustion
from blockx.wire import keys
from blockx.wire.blackbox import BLACKBOX_SIZE, BlackboxWriter, read_blackbox


def _boxed(make_harness: Any, tmp_path: Path) -> tuple[Harness, str, dict[str, Any]]:
    path = str(tmp_path / "box")
    holder: dict[str, Any] = {"path": path, "read": read_blackbox}
    h = make_harness(blackbox=BlackboxWriter(path), prelude={"holder": holder}, max_inflight=0)
    holder["rt"] = h.rt
    return h, path, holder


class TestBlackbox:
    def test_the_box_names_the_call_while_it_runs_and_no_call_between(
        self, make_harness: Any, tmp_path: Path
    ) -> None:
        h, path, _ = _boxed(make_harness, tmp_path)
        source = "def _(p):\n    r = holder['read'](holder['path'])\n    return [r.call_id, r.attempt_seq]\n"
        h.execute("t1/c1", source, None, attempt_seq=4)
        h.execute("t1/c2", source, None)
        h.run()
        assert h.output("t1/c1") == ["t1/c1", 4]
        assert h.output("t1/c2") == ["t1/c2", 1]
        record = read_blackbox(path)
        assert record is not None and record.call_id is None

    def test_a_resumed_call_is_named_again(self, make_harness: Any, tmp_path: Path) -> None:
        h, _, _ = _boxed(make_harness, tmp_path)
        source = (
            "from blockx.sdk import db\n\n"
            "def _(p):\n"
            "    db.get('t', 1)\n"
            "    return holder['read'](holder['path']).call_id\n"
        )
        h.execute("t1/a", source, None)
        h.execute("t1/b", source, None)
        h.run()
        h.resume(h.last_wait("t1/a"), 1)
        h.run()
        assert h.output("t1/a") == "t1/a"

    def test_a_long_call_id_is_encoded_once(self, make_harness: Any, tmp_path: Path) -> None:
        h, _, _ = _boxed(make_harness, tmp_path)
        h.execute("t1/é" * 50, "def _(p):\n    return 1\n", None)
        h.run()
        assert h.output("t1/é" * 50) == 1


class TestMemoryError:
    def test_a_call_getting_memory_error_ends_the_process_with_the_call_named(
        self, make_harness: Any, tmp_path: Path
    ) -> None:
        h, path, _ = _boxed(make_harness, tmp_path)
        seen: list[Any] = []

        def end(resident: int) -> None:  # the real one os._exit()s
            seen.append((resident, read_blackbox(path)))

        h.rt.set_memory_exit(end)
        h.execute("t1/hog", "def _(p):\n    raise MemoryError()\n", None)
        h.run()
        ((resident, record),) = seen
        assert resident == 0 and record.call_id == "t1/hog"

    def test_a_memory_error_turned_into_another_error_still_ends_the_process(
        self, make_harness: Any, tmp_path: Path
    ) -> None:
        h, _, _ = _boxed(make_harness, tmp_path)
        seen: list[int] = []
        h.rt.set_memory_exit(seen.append)
        source = (
            "def _(p):\n"
            "    try:\n"
            "        raise MemoryError()\n"
            "    except MemoryError:\n"
            "        raise ValueError('no room')\n"
        )
        h.execute("t1/hog", source, None)
        h.run()
        assert seen == [0]

    def test_without_a_limit_a_memory_error_just_fails_the_call(self, h: Harness) -> None:
        h.execute("c1", "def _(p):\n    raise MemoryError()\n", None)
        h.run()
        assert h.failure("c1")[keys.FP_ERROR_KIND] == keys.ERR_USER_ERROR


class TestDescriptors:
    @pytest.mark.parametrize(
        "source",
        [
            "import errno\ndef _(p):\n    raise OSError(errno.EMFILE, 'Too many open files')\n",
            "import errno\ndef _(p):\n    raise OSError(errno.ENFILE, 'File table overflow')\n",
            # caught and re-raised as something else: still found
            "import errno\ndef _(p):\n    try:\n        raise OSError(errno.EMFILE, 'x')\n"
            "    except OSError:\n        raise ValueError('no file')\n",
        ],
    )
    def test_a_call_out_of_descriptors_fails_then_the_executor_recycles(
        self, h: Harness, source: str
    ) -> None:
        h.execute("c1", source, None)
        h.run()
        assert h.failure("c1")[keys.FP_ERROR_KIND] == keys.ERR_USER_ERROR
        assert h.rt.descriptors_exhausted is True

    def test_no_further_call_runs_once_descriptors_ran_out(self, h: Harness) -> None:
        h.execute("c1", "import errno\ndef _(p):\n    raise OSError(errno.EMFILE, 'x')\n", None)
        h.execute("c2", "def _(p):\n    record('ran')\n", None)
        h.run()
        assert h.failure("c1")[keys.FP_ERROR_KIND] == keys.ERR_USER_ERROR
        assert h.terminals("c2") == [] and h.records == []  # left for the next executor

    def test_other_os_errors_do_not_recycle(self, h: Harness) -> None:
        h.execute("c1", "def _(p):\n    raise FileNotFoundError(2, 'nope')\n", None)
        h.run()
        assert h.rt.descriptors_exhausted is False

    def test_the_exception_chain_is_walked(self) -> None:
        inner = OSError(errno.EMFILE, "x")
        outer = RuntimeError("y")
        outer.__cause__ = inner
        assert is_descriptor_exhaustion(outer)
        assert not is_descriptor_exhaustion(RuntimeError("z"))
        looped = RuntimeError("loop")
        looped.__context__ = looped
        assert not is_descriptor_exhaustion(looped)  # bounded walk


class TestPause:
    def test_a_stop_is_measured_from_the_last_tick(self) -> None:
        clock = PauseClock()
        assert clock.take_pause(100.0) == 0.0  # nobody ticks: nothing known
        clock.tick(100.0)
        assert not clock.stale(100.2)
        assert clock.stale(110.0)
        assert clock.take_pause(110.0) == pytest.approx(10.0 - clock.interval_s)

    def test_a_tick_seen_after_the_resume_keeps_the_gap(self) -> None:
        clock = PauseClock()
        clock.tick(100.0)
        clock.tick(110.0)  # the watchdog ran before the SIGCONT handler
        assert clock.stale(110.1)  # the alarm holds its fire until the credit
        assert clock.take_pause(110.1) == pytest.approx(10.0 - clock.interval_s)
        assert not clock.stale(110.2)  # credited once

    def test_the_stopped_time_is_credited_to_the_running_call(self, make_harness: Any) -> None:
        holder: dict[str, Any] = {"clock": PauseClock()}
        h = make_harness(prelude={"holder": holder})
        holder["rt"] = h.rt
        source = (
            "def _(p):\n"
            "    clock.advance_ms(300)\n"
            "    pause = holder['clock']\n"
            "    pause.tick(holder['now']() - 10.0)  # the last tick, 10 s ago\n"
            "    clock.advance_ms(10_000)  # stopped for 10 s\n"
            "    return round(holder['rt'].credit_pause(pause))\n"
        )
        holder["now"] = time.monotonic
        h.execute("c1", source, None, call_budget_ms=2000)
        h.run()
        assert h.output("c1") == 10
        assert 250 <= h.payload("c1")[keys.FP_BUDGET_USED_MS] <= 400


def test_the_open_files_limit_never_goes_above_the_inherited_hard_limit() -> None:
    code = (
        "import resource\n"
        "from blockx.executor.containment import limit_open_files\n"
        "hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]\n"
        "print(limit_open_files(10**9) == hard, limit_open_files(40),"
        " resource.getrlimit(resource.RLIMIT_NOFILE))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ},
        timeout=60,
    )
    assert out.stdout.split() == ["True", "40", "(40,", "40)"]


@pytest.mark.parametrize(
    ("call_id", "attempt_seq"), [("t1/c1", 1), ("t1/é" * 2000, 2**32 + 3), ("", 5)]
)
def test_the_switch_writer_writes_what_the_wire_reader_reads(
    tmp_path: Path, call_id: str, attempt_seq: int
) -> None:
    path = str(tmp_path / "box")
    box = BlackboxWriter(path)
    try:
        box.enter(box.record_of("t1/longer-call-before" * 5, 9))
        box.enter(box.record_of(call_id, attempt_seq))
        record = read_blackbox(path)
        assert record is not None
        expected = call_id.encode()[: BLACKBOX_SIZE - 16].decode("utf-8", "replace") or None
        assert record.call_id == expected
        if call_id:
            assert record.attempt_seq == attempt_seq & 0xFFFFFFFF
        box.leave()
        assert read_blackbox(path).call_id is None  # type: ignore[union-attr]
    finally:
        box.close()


def test_the_open_files_limit_leaves_the_executor_what_it_needs() -> None:
    code = (
        "from blockx.executor.containment import MIN_OPEN_FILES, limit_open_files\n"
        "print(limit_open_files(3) == MIN_OPEN_FILES)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.split() == ["True"]


def test_the_address_space_limit_never_loosens_an_inherited_one() -> None:
    code = (
        "import resource\n"
        "from blockx.executor.containment import limit_address_space\n"
        "resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 16 << 30))\n"
        "print(limit_address_space(64 << 30) == 8 << 30,"
        " resource.getrlimit(resource.RLIMIT_AS) == (8 << 30, 16 << 30))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.split() == ["True", "True"]
