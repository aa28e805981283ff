"""Rows written a batch at a time (one encode per slice, :func:`blockx.cli.output._encode`)
are the JSON Lines that one encode per row wrote: the same values, one row a line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from blockx.cli.output import RowWriter, _encode
from blockx.wire import dumps_wire, loads_wire
from blockx.wire.errors import NotSerializableError

ROWS: list[Any] = [
    {"i": 1, "s": "plain"},
    {"big": 2**70, "neg": -(2**65), "max": 2**64 - 1},
    {"text": 'line\nbreak \u2028 é 😀 \x00 "quoted" \\ /'},
    {"f": 0.1, "e": 1e20, "tiny": 5e-324, "neg0": -0.0},
    [1, [2, {"x": None}], True, False],
    "a string row",
    12345678901234567890123,
    {},
]


def test_a_batch_is_one_line_a_row_with_the_values_of_one_encode_per_row() -> None:
    data = _encode(ROWS)
    lines = data.split(b"\n")
    assert lines[-1] == b""  # every row ends its line
    assert len(lines) - 1 == len(ROWS)
    for line, row in zip(lines, ROWS, strict=False):
        assert loads_wire(line) == row
        assert loads_wire(line) == loads_wire(dumps_wire(row))


def test_rows_the_batch_encoder_refuses_go_row_by_row_through_the_wire_encoder() -> None:
    class Odd:
        pass

    with pytest.raises(NotSerializableError):  # the wire's own error, naming the value
        _encode([{"ok": 1}, Odd()])


def test_a_large_batch_written_to_a_file_reads_back_row_for_row(tmp_path: Path) -> None:
    rows = [{"i": i, "big": 2**64 + i, "w": f"w{i % 7}"} for i in range(5000)]
    writer = RowWriter(str(tmp_path / "rows.jsonl"))
    for start in range(0, len(rows), 1024):
        writer.put_rows(rows[start : start + 1024])
    assert writer.close(timeout=30) == 0
    assert writer.rows == len(rows)
    text = (tmp_path / "rows.jsonl").read_text()
    assert [json.loads(line) for line in text.splitlines()] == rows
