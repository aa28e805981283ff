"""The writer thread of ``blockx run``'s outputs (:class:`blockx.cli.output.RowWriter`) on a
real pipe, in process: the loop never blocks, backpressure, order, exact accounting when
rows are dropped, a reader that goes away."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from typing import Any

import pytest
from cli_support import Pipe, drain

from blockx.cli.output import OutputClosed, RowWriter


def test_rows_keep_their_order_and_a_full_queue_makes_the_producer_wait(
    pipe: Pipe,
) -> None:
    rows = [{"i": i, "pad": "x" * 500} for i in range(20_000)]  # ~10 MB
    bound = 256 * 1024
    received: list[bytes] = []
    start_reading = threading.Event()

    def slow_reader() -> None:
        start_reading.wait()
        lines = 0
        while lines < len(rows):
            chunk = os.read(pipe.read_end, 1 << 16)
            received.append(chunk)
            lines += chunk.count(b"\n")
            time.sleep(0.001)

    async def main() -> int:
        writer = RowWriter(None, max_pending_bytes=bound, stdout=pipe.stdout)
        ticks = 0
        for row in rows:
            writer.put_rows((row,))
            assert writer._pending_bytes < bound + 1024  # bounded: one row over at most
            if writer.full:
                room = asyncio.ensure_future(writer.wait_for_room())
                while not start_reading.is_set() and not room.done():
                    # Nobody reads: once the pipe is full the producer waits for good,
                    # and the loop is free meanwhile.
                    await asyncio.sleep(0.01)
                    ticks += 1
                    if ticks == 20:
                        start_reading.set()
                await room
        await writer.wait_drained()
        assert writer.rows == len(rows)
        assert writer.close() == 0
        return ticks

    reader = threading.Thread(target=slow_reader, daemon=True)
    reader.start()
    ticks = asyncio.run(main())
    reader.join(timeout=30)
    assert ticks == 20 and start_reading.is_set()
    data = b"".join(received)
    assert [json.loads(line) for line in data.splitlines()] == rows


def test_abandon_drops_the_unread_rows_and_counts_them_exactly(pipe: Pipe) -> None:
    async def main() -> RowWriter:
        writer = RowWriter(None, stdout=pipe.stdout)
        writer.put_rows([{"i": i, "pad": "y" * 300} for i in range(2000)])  # ~600 KB
        await asyncio.sleep(0.3)  # the writer fills the pipe and waits in poll()
        dropped = writer.abandon()
        assert dropped == 2000 - writer.rows > 0
        assert writer.drop_count_exact
        assert writer.close() == 0  # the thread has stopped: nothing else is dropped
        with pytest.raises(RuntimeError):
            writer.put_rows([{}])
        return writer

    writer = asyncio.run(main())
    data = drain(pipe.read_end)
    assert len(data) == writer.bytes
    whole = data.split(b"\n")[:-1]
    assert [json.loads(line)["i"] for line in whole] == list(range(writer.rows))
    assert writer.torn == (not data.endswith(b"\n"))


def test_a_reader_that_goes_away_is_output_closed(pipe: Pipe) -> None:
    async def main() -> Any:
        writer = RowWriter(None, stdout=pipe.stdout)
        writer.put_rows([{"i": 0}])
        await writer.wait_drained()
        return writer

    writer = asyncio.run(main())
    assert drain(pipe.read_end) == b'{"i":0}\n'

    async def after_close() -> None:
        os.close(pipe.read_end)  # the reader goes away (the fixture's close then fails: ok)
        writer.put_rows([{"i": 1}])
        with pytest.raises(OutputClosed):
            await writer.wait_drained()
        assert writer.reader_gone
        with pytest.raises(OutputClosed):
            writer.put_rows([{"i": 2}])

    asyncio.run(after_close())
    assert writer.close() == 0
