"""The writer thread of ``blockx run``'s stderr (:class:`blockx.cli.console.StderrWriter`) on a
real pipe, in process: putting never blocks, a full queue drops lines and says how many
once the writer caught up, the lines written keep their order, progress frames coalesce,
and a reader that reads gets everything."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time

from cli_support import Pipe, drain

from blockx.cli.console import Console, StderrWriter

NOTICE = re.compile(
    rb"blockx: warning: ([\d,]+) stderr lines? dropped: stderr was not read fast enough"
)


def _wait_until(condition: object, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline
        time.sleep(0.01)


def _read_all_in_thread(fd: int) -> tuple[threading.Thread, list[bytes]]:
    chunks: list[bytes] = []

    def read() -> None:
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return reader, chunks


def _fill(fd: int) -> None:
    """Write lines of ``fill`` into the pipe ``fd`` until it takes no more."""
    os.set_blocking(fd, False)
    try:
        while True:
            os.write(fd, b"fill\n" * 64)
    except BlockingIOError:
        pass
    finally:
        os.set_blocking(fd, True)


def test_a_full_queue_drops_lines_keeps_the_order_and_says_how_many(pipe: Pipe) -> None:
    # The pipe is full from the start: the writer cannot catch up (and take lines again)
    # while the lines are put, however the threads are scheduled.
    _fill(pipe.write_end)
    writer = StderrWriter(pipe.stream, max_pending_bytes=16 * 1024)
    started = time.monotonic()
    for i in range(20_000):  # ~240 KB: more than the queue holds
        writer.put_line(f"line {i:06d}")
    assert time.monotonic() - started < 2  # never waited for the reader
    assert writer.lines_dropped > 0
    assert writer._pending_bytes <= 16 * 1024
    # the reader comes back: the writer catches up, then says how many it dropped
    received = [drain(pipe.read_end)]
    _wait_until(lambda: writer._pending_bytes == 0 or received.append(drain(pipe.read_end)))
    received.append(drain(pipe.read_end))
    _wait_until(lambda: NOTICE.search(b"".join(received)) or received.append(drain(pipe.read_end)))
    for i in range(3):  # taken again once caught up
        writer.put_line(f"after {i}")
    reader, rest = _read_all_in_thread(pipe.read_end)
    assert writer.close() is False
    os.close(pipe.write_end)
    reader.join(10)
    lines = b"".join(received + rest).decode().splitlines()
    # a notice each time the writer caught up after dropping (once here: the pipe was
    # full until the reader came back); the lines written came in order
    notices = [
        int(m.group(1).replace(b",", b"")) for m in map(NOTICE.search, map(str.encode, lines)) if m
    ]
    written = [line for line in lines if line.startswith("line ")]
    numbers = [int(line.split()[1]) for line in written]
    assert numbers == sorted(numbers) and numbers[0] == 0  # in order, some missing
    assert sum(notices) == writer.lines_dropped == 20_000 - len(written) > 0
    assert NOTICE.search(lines[-4].encode())  # the last notice, before the lines put after it
    assert lines[-3:] == ["after 0", "after 1", "after 2"]


def test_nothing_is_dropped_when_the_reader_reads(pipe: Pipe) -> None:
    reader, chunks = _read_all_in_thread(pipe.read_end)
    writer = StderrWriter(pipe.stream)
    for i in range(30_000):
        writer.put_line(f"line {i} " + "z" * 20)
    assert writer.close() is False
    os.close(pipe.write_end)
    reader.join(10)
    assert writer.lines_dropped == 0
    lines = b"".join(chunks).decode().splitlines()
    assert lines == [f"line {i} " + "z" * 20 for i in range(30_000)]


def test_progress_frames_coalesce_while_the_writer_is_behind(pipe: Pipe) -> None:
    console = Console(pipe.stream, tty=True)  # type: ignore[arg-type]
    writer = StderrWriter(pipe.stream)
    console.attach(writer)
    console.print("x" * 100_000)  # more than the pipe holds: the writer waits for the reader
    _wait_until(lambda: writer._writing and writer._pending_bytes < 100_001)
    for i in range(100):
        console.show_progress(f"frame {i}")
    console.print("done")
    reader, chunks = _read_all_in_thread(pipe.read_end)
    assert console.detach() is False
    os.close(pipe.write_end)
    reader.join(10)
    data = b"".join(chunks)
    assert data == b"x" * 100_000 + b"\n\rframe 99\x1b[K\r\x1b[Kdone\n"


def test_after_keep_all_nothing_is_dropped_and_the_count_comes_first(pipe: Pipe) -> None:
    # The pipe is full from the start: the writer cannot catch up (and report) before
    # keep_all, however the threads are scheduled.
    _fill(pipe.write_end)
    writer = StderrWriter(pipe.stream, max_pending_bytes=4096)
    for i in range(10_000):
        writer.put_line(f"early {i}")
    dropped = writer.lines_dropped
    assert dropped > 0
    writer.keep_all()
    writer.put_line("summary " + "s" * 10_000)  # past the bound: kept
    reader, chunks = _read_all_in_thread(pipe.read_end)
    assert writer.close() is False
    os.close(pipe.write_end)
    reader.join(10)
    lines = b"".join(chunks).decode().splitlines()
    assert lines[-1] == "summary " + "s" * 10_000
    assert NOTICE.search(lines[-2].encode())
    assert writer.lines_dropped == dropped  # nothing more was dropped


def test_close_gives_up_when_the_reader_takes_nothing_for_the_grace(pipe: Pipe) -> None:
    writer = StderrWriter(pipe.stream)
    writer.keep_all()
    for i in range(5000):
        writer.put_line(f"line {i} " + "q" * 100)  # ~550 KB: the pipe fills
    started = time.monotonic()
    assert writer.close(0.3) is True
    assert time.monotonic() - started < 2


ATTACHED_SCRIPT = """
import logging, sys, threading, warnings
from blockx.cli.console import Console, StderrWriter

before = sys.stderr
console = Console(sys.stderr, tty=False)
writer = StderrWriter(sys.stderr)
console.attach(writer)
assert sys.stderr is not before
print("printed to sys.stderr", file=sys.stderr)
sys.stderr.write("in two ")
sys.stderr.write("parts\\n")
warnings.warn("a warning of someone else's", UserWarning, stacklevel=1)
logging.getLogger("someone.else").warning("a record with no handler of its own")
thread = threading.Thread(target=lambda: 1 / 0)
thread.start()
thread.join()
sys.stderr.write("no newline yet")
console.detach(5)
assert sys.stderr is before
print(writer.lines)
"""


def test_while_attached_sys_stderr_writes_through_the_writer_too() -> None:
    """Code that writes to ``sys.stderr`` itself — a warning, a logger outside blockx with no
    handler (``logging.lastResort``), a thread's traceback — goes through the writer while it
    is attached (so it cannot block the loop either); detaching puts ``sys.stderr`` back.
    A process of its own: pytest captures warnings and log records in process."""
    proc = subprocess.run(
        [sys.executable, "-c", ATTACHED_SCRIPT],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    err = proc.stderr
    assert "printed to sys.stderr\nin two parts\n" in err
    assert "UserWarning: a warning of someone else's" in err
    assert "a record with no handler of its own" in err
    assert "ZeroDivisionError: division by zero" in err
    assert err.endswith("no newline yet\n")  # flushed at detach
    # Every one of those lines went through the writer thread.
    assert int(proc.stdout) == len(err.splitlines())


def test_one_line_bigger_than_the_bound_is_dropped_alone(pipe: Pipe) -> None:
    """A line larger than the whole queue's bound, put while nothing is queued, is dropped
    and said — and the lines after it are written (they used to be dropped until the end:
    nothing woke the idle writer to end the dropping)."""
    writer = StderrWriter(pipe.stream, max_pending_bytes=1000)
    _wait_until(lambda: writer._writer_idle)
    writer.put_line("x" * 2000)
    for i in range(5):
        time.sleep(0.05)
        writer.put_line(f"after {i}")
    _wait_until(lambda: writer.lines == 6)
    text = drain(pipe.read_end)
    assert writer.lines_dropped == 1
    assert [int(n) for n in NOTICE.findall(text)] == [1]
    assert text.decode().splitlines()[1:] == [f"after {i}" for i in range(5)]
    writer.close(5)
