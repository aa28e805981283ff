"""Reading a ``calls_file`` (JSON Lines) a chunk of lines at a time, for :mod:`blockx.cli.taskfile`.

Theory of operation
-------------------
A calls file is read in blocks of :data:`CHUNK_BYTES`, each cut after its
last newline, so a chunk holds whole lines (a line longer than a block makes its
chunk longer). A chunk whose every line has the shape of one call object --
optional blanks, ``{``, anything, ``}``, optional blanks (:data:`_OBJECT_LINES`,
one regular-expression match over the chunk) -- is decoded with one call,
``msgspec.json.Decoder.decode_lines`` (the wire's decoder: big integers exact),
and its values checked by the same fast test as one line
(:func:`~blockx.cli.taskfile_checks.parse_call_line`'s: a dict, a known function,
``args`` or nothing else).

Why one decode of the chunk means what one decode per line means: a JSON string
cannot hold a raw newline, so no value continues past the end of a line inside a
string; a line ending in ``}`` followed by a line starting with ``{`` can only
be two values (inside a container, ``} {`` is never valid JSON). So every line
holds whole values, at least one; as many values as lines means one per line.

Anything else -- a blank line, a bad line, a value that is not a plain call, a
line long enough that its arguments must be measured, a byte order mark -- sends
the chunk to the line-by-line path (:func:`parse_call_line`), which reports a bad
line exactly as before: same message, same line number. The fast path only ever
accepts what the line-by-line path accepts, with the same values.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator, Mapping
from typing import IO, Any, Final

import msgspec

from blockx.cli.taskfile_checks import MAX_ARGS_BYTES, SpecError, parse_call_line

__all__ = [
    "CHUNK_BYTES",
    "KEEP_CHECKED_BYTES",
    "CallChunk",
    "check_chunk",
    "iter_call_chunks",
    "iter_chunks",
    "parse_chunk_fast",
    "parse_lines",
]

#: Bytes read at once (a chunk: these, up to the last newline in them). As much as the
#: line-by-line reading read ahead (a buffered file's 8 KiB): a calls file that changes
#: while a stream reads it is seen as soon as before.
CHUNK_BYTES: Final = 8 * 1024
#: A chunk's lines, each one object and nothing else around it but blanks.
_OBJECT_LINES: Final = re.compile(rb"(?:[ \t\r]*\{[^\n]*\}[ \t\r]*\n)*")
_decoder: Final = msgspec.json.Decoder()

#: ``(function id, args)`` of the calls of one chunk, in order.
CallChunk = list[tuple[str, Any]]
#: A calls file up to this size is decoded once: ``blockx run``'s check keeps the calls
#: it decoded (:meth:`blockx.cli.taskfile.TaskFile.scan_calls_file`), and the run
#: streams those instead of reading and decoding the file a second time -- the second
#: decode was ~8% of the worker's instructions per trivial call (callgrind,
#: bench/chain_instructions.py --workload trivial). Held as Python objects they take
#: ~10x the file's bytes at most (tiny lines), so a larger file is read twice, as before.
KEEP_CHECKED_BYTES: Final = 4 * 1024 * 1024


def iter_chunks(handle: IO[bytes], chunk_bytes: int = CHUNK_BYTES) -> Iterator[tuple[int, bytes]]:
    """``(number of its first line, chunk)``: whole lines, each chunk ending in a newline
    (the file's last line gets one if it has none)."""
    lineno = 1
    head: list[bytes] = []  # the start of a line longer than the blocks read so far
    while True:
        block = handle.read(chunk_bytes)
        if not block:
            break
        cut = block.rfind(b"\n")
        if cut < 0:
            head.append(block)
            continue
        if head:
            head.append(block[: cut + 1])
            chunk = b"".join(head)
            head = []
        else:
            chunk = block[: cut + 1]
        if cut + 1 < len(block):
            head.append(block[cut + 1 :])
        yield lineno, chunk
        lineno += chunk.count(b"\n")
    if head:
        yield lineno, b"".join(head) + b"\n"


def parse_chunk_fast(chunk: bytes, known: Mapping[str, Any]) -> CallChunk | None:
    """The calls of ``chunk`` (whole lines, ending in a newline) with one decode, or None
    when the chunk needs the line-by-line path (see the module docstring)."""
    if _OBJECT_LINES.fullmatch(chunk) is None:
        return None
    try:
        values = _decoder.decode_lines(chunk)
    except (ValueError, RecursionError):
        return None
    if len(values) != chunk.count(b"\n"):
        return None
    if len(chunk) > MAX_ARGS_BYTES // 2 and _has_long_line(chunk):
        return None
    calls: CallChunk = []
    append = calls.append
    for call in values:
        if type(call) is not dict:
            return None
        function_id = call.get("function")
        if type(function_id) is not str or function_id not in known:
            return None
        if len(call) == 2 and "args" in call:
            append((function_id, call["args"]))
        elif len(call) == 1:
            append((function_id, []))
        else:
            return None
    return calls


def _has_long_line(chunk: bytes) -> bool:
    """A line whose arguments may pass the frame limit (measured by the full check)."""
    limit = MAX_ARGS_BYTES // 2
    start = 0
    while start < len(chunk):
        end = chunk.index(b"\n", start) + 1
        if end - start > limit:
            return True
        start = end
    return False


def parse_lines(chunk: bytes, first_lineno: int) -> Iterator[tuple[int, bytes]]:
    """The non-blank lines of ``chunk`` with their numbers (for the line-by-line path)."""
    for lineno, line in enumerate(io.BytesIO(chunk), first_lineno):
        if line.strip():
            yield lineno, line


def iter_call_chunks(
    handle: IO[bytes], label: str, known: Mapping[str, Any]
) -> Iterator[CallChunk]:
    """The calls of the file, a chunk at a time; a bad line raises :class:`SpecError`
    naming it once the calls of the lines before it have been yielded."""
    for first, chunk in iter_chunks(handle):
        calls = parse_chunk_fast(chunk, known)
        if calls is None:
            calls = []
            try:
                for lineno, line in parse_lines(chunk, first):
                    calls.append(parse_call_line(line, lineno, label, known))
            except SpecError:
                if calls:
                    yield calls
                raise
        yield calls


def check_chunk(
    chunk: bytes,
    first: int,
    label: str,
    known: Mapping[str, Any],
    problems: list[str],
    max_problems: int,
    kept: list[CallChunk] | None = None,
) -> tuple[int, int]:
    """Check the lines of ``chunk``: ``(calls, bad lines not listed)``. A bad line's
    problems are appended to ``problems`` while it holds fewer than ``max_problems``;
    the bad lines past that are only counted. With ``kept``, the chunk's good calls are
    appended to it as one :data:`CallChunk` (see :data:`KEEP_CHECKED_BYTES`)."""
    calls = parse_chunk_fast(chunk, known)
    if calls is not None:
        if kept is not None:
            kept.append(calls)
        return len(calls), 0
    good_calls: CallChunk = []
    more = 0
    for lineno, line in parse_lines(chunk, first):
        try:
            good_calls.append(parse_call_line(line, lineno, label, known))
        except SpecError as exc:
            if len(problems) < max_problems:
                problems.extend(exc.problems)
            else:
                more += 1
    if kept is not None:
        kept.append(good_calls)
    return len(good_calls), more
