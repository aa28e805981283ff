"""Rows written a batch at a time (one encode per slice, :func:`blockx.cli.output._encode`)
are the JSON Lines that one encode per row wrote: the same values, one row a line; a
settled batch's raw outputs (:func:`blockx.cli.output.encode_outputs`) are written as
their decode and encode would be, byte for byte."""

from __future__ import annotations

import asyncio
import datetime
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blockx.cli.output import RowWriter, _encode, encode_outputs, row_parts
from blockx.wire import dumps_wire, loads_wire
from blockx.wire.errors import NotSerializableError
from blockx.worker.json_values import encode_output, rows_from_outputs, rows_jsonl

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


# --- a settled batch's raw outputs written as they are (encode_outputs) ---------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**200), 2**200)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=10,
)
#: What reaches the worker as an output: the executor's dumps_wire text (orjson; msgspec for
#: big integers; the standard library with a datetime beside one), or the generic path's
#: re-encoding (encode_output).
outputs = st.one_of(
    json_values.map(dumps_wire),
    json_values.map(encode_output),
    st.dictionaries(st.text(max_size=5), json_values, max_size=4).map(dumps_wire),
    st.builds(
        lambda v, f: dumps_wire({"big": 2**70, "at": datetime.date(2026, 12, 2), "f": f, "v": v}),
        json_values,
        st.floats(allow_nan=False, allow_infinity=False),
    ),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(outputs, max_size=6))
def test_raw_outputs_are_written_as_a_decode_and_encode_would_write_them(
    outs: list[bytes],
) -> None:
    """Byte for byte: the rows' bytes and count do not depend on whether the outputs were
    decoded, whichever encoder wrote them and whatever their floats."""
    rows = rows_from_outputs(outs)
    expected = _encode(rows) if rows else b""
    assert encode_outputs(outs) == (expected, len(rows))
    fast = rows_jsonl(outs)
    assert fast is None or fast == (expected, len(rows))


def test_object_outputs_are_not_decoded() -> None:
    """The common case takes the path that neither decodes nor encodes."""
    outs = [
        dumps_wire({"i": i, "b": [2**80 + i, 10**23], "s": "é\n😀", "f": 0.5}) for i in range(50)
    ]
    assert rows_jsonl(outs) == (b"\n".join(outs) + b"\n", 50)
    assert rows_jsonl([]) == (b"", 0)


@pytest.mark.parametrize(
    "outs",
    [
        [b'{"a":1}', b"[1,2]"],  # a list: as many rows as items
        [b"null", b'{"a":1}'],  # no row
        [b'{"a":1}', b"7"],  # a scalar row
        [b'{"f":1e+20}'],  # orjson's exponent: msgspec writes 1e20
        [b'{"f":1e-07}'],  # the standard library's: msgspec writes 1e-7
        [b'{"a":\n1}'],  # a peer's line break inside an output
        [b'{"a":\r1}'],
    ],
)
def test_outputs_the_fast_path_cannot_vouch_for_are_decoded(outs: list[bytes]) -> None:
    assert rows_jsonl(outs) is None
    rows = rows_from_outputs(outs)
    assert encode_outputs(outs) == ((_encode(rows) if rows else b""), len(rows))


def test_a_writer_puts_raw_outputs_as_rows(tmp_path: Path) -> None:
    outs = [dumps_wire({"i": i, "big": 2**64 + i}) for i in range(3000)]
    outs[7] = dumps_wire([{"x": 1}, {"x": 2}])  # one batch decoded, the others not
    outs[9] = b"null"
    writer = RowWriter(str(tmp_path / "rows.jsonl"))
    for start in range(0, len(outs), 1024):
        writer.put_outputs(outs[start : start + 1024])
    writer.put_outputs([])
    writer.put_outputs([b"null"])  # no row: nothing queued
    assert writer.close(timeout=30) == 0
    assert writer.rows == 3000
    text = (tmp_path / "rows.jsonl").read_text()
    assert [json.loads(line) for line in text.splitlines()] == rows_from_outputs(outs)


def test_row_parts_write_raw_outputs_unless_the_rows_were_decoded_already() -> None:
    """A stream's batch goes out as its raw outputs; a one-shot task's, whose rows were
    decoded off the actor, as those rows (never decoded twice)."""
    from blockx.worker.actor.task_run import SettledRows

    raw = SettledRows(
        first_call=0,
        call_count=2,
        failures=[],
        succeeded=2,
        cancelled=0,
        outputs=[b'{"a":1}', b'{"a":2}'],
    )
    decoded = SettledRows(
        first_call=2,
        call_count=1,
        failures=[],
        succeeded=1,
        cancelled=0,
        rows=[{"b": 1}],
        outputs=[b'{"b":1}'],
    )
    empty = SettledRows(
        first_call=3, call_count=1, failures=[], succeeded=0, cancelled=0, outputs=[b"null"]
    )
    assert not raw.decoded and decoded.decoded

    class Handle:
        async def settled_batches(self) -> Any:
            for settled in (raw, decoded, empty):
                yield settled

    async def collect() -> list[Any]:
        return [part async for part in row_parts(Handle())]  # type: ignore[arg-type]

    parts = asyncio.run(collect())
    # the last: raw outputs making no row (the writer's encode finds none)
    assert parts == [(True, raw.outputs), (False, [{"b": 1}]), (True, [b"null"])]
