"""The black box a dying executor leaves for the worker (blockx.wire.blackbox)."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

from blockx.wire.blackbox import (
    BLACKBOX_SIZE,
    CAUSE_MEMORY_EXCEEDED,
    CAUSE_NONE,
    MAX_CALL_ID_BYTES,
    BlackboxRecord,
    BlackboxWriter,
    read_blackbox,
)


def _die_while_running(path: str) -> None:
    writer = BlackboxWriter(path)
    writer.enter(writer.record_of("t1/c7", 3))
    os._exit(1)  # no clean-up: the mapping is all that is left


def test_a_process_that_dies_while_a_call_runs_names_it(tmp_path: Path) -> None:
    path = str(tmp_path / "exec-1.blackbox")
    proc = multiprocessing.get_context("fork").Process(target=_die_while_running, args=(path,))
    proc.start()
    proc.join(10)
    assert proc.exitcode == 1
    assert read_blackbox(path) == BlackboxRecord("t1/c7", 3, CAUSE_NONE)


def test_idle_clears_the_running_call_and_a_cause_is_kept(tmp_path: Path) -> None:
    path = str(tmp_path / "bb")
    writer = BlackboxWriter(path)
    writer.enter(writer.record_of("t/é", 1))
    assert read_blackbox(path) == BlackboxRecord("t/é", 1, CAUSE_NONE)
    writer.leave()
    writer.set_cause(CAUSE_MEMORY_EXCEEDED)
    assert read_blackbox(path) == BlackboxRecord(None, 0, CAUSE_MEMORY_EXCEEDED)
    writer.enter(writer.record_of("a-longer-id/c1", 2))
    writer.enter(writer.record_of("short", 5))  # a shorter id after a longer one reads back exactly
    assert read_blackbox(path) == BlackboxRecord("short", 5, CAUSE_MEMORY_EXCEEDED)
    writer.close()
    assert os.path.getsize(path) == BLACKBOX_SIZE


def test_an_overlong_id_is_cut_not_written_past_the_end(tmp_path: Path) -> None:
    path = str(tmp_path / "bb")
    writer = BlackboxWriter(path)
    writer.enter(writer.record_of("x" * (BLACKBOX_SIZE * 2), 1))
    record = read_blackbox(path)
    assert record is not None and record.call_id == "x" * MAX_CALL_ID_BYTES
    writer.close()


def test_missing_short_or_foreign_files_read_as_nothing(tmp_path: Path) -> None:
    assert read_blackbox(str(tmp_path / "missing")) is None
    (tmp_path / "short").write_bytes(b"BXBB")
    assert read_blackbox(str(tmp_path / "short")) is None
    (tmp_path / "foreign").write_bytes(b"NOPE" + bytes(BLACKBOX_SIZE - 4))
    assert read_blackbox(str(tmp_path / "foreign")) is None
