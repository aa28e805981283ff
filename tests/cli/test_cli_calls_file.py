"""A calls file read a chunk of lines at a time (blockx.cli.calls_file) means exactly what it
means read line by line: the same calls, and a bad line reported with its number and message."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blockx.cli.calls_file import check_chunk, iter_call_chunks, iter_chunks, parse_chunk_fast
from blockx.cli.taskfile_checks import SpecError, parse_call_line

KNOWN = {"f": None, "g": None}


def line_by_line(data: bytes) -> list[tuple[str, Any]] | list[str]:
    """The reference: the calls of every line, or the problems of the bad lines."""
    calls: list[tuple[str, Any]] = []
    problems: list[str] = []
    for lineno, line in enumerate(io.BytesIO(data), 1):
        if not line.strip():
            continue
        try:
            calls.append(parse_call_line(line, lineno, "c.jsonl", KNOWN))
        except SpecError as exc:
            problems.extend(exc.problems)
    return problems or calls


def chunked(data: bytes, chunk_bytes: int) -> list[tuple[str, Any]] | list[str]:
    calls: list[tuple[str, Any]] = []
    problems: list[str] = []
    for first, chunk in iter_chunks(io.BytesIO(data), chunk_bytes):
        fast = parse_chunk_fast(chunk, KNOWN)
        if fast is not None:
            calls.extend(fast)
        else:
            check_chunk(chunk, first, "c.jsonl", KNOWN, problems, 10**9)
            if not problems:
                calls.extend(
                    call
                    for batch in iter_call_chunks(io.BytesIO(chunk), "c.jsonl", KNOWN)
                    for call in batch
                )
    return problems or calls


# Lines each invalid alone, valid JSON when the chunk is read as one sequence of values.
SPLIT_ACROSS_LINES = [
    b'{"function":"f","args":[1\n2]}\n',
    b'{"function":"f","args":[]} {"function":"f","args":[\n1]}\n',
    b'{"function":"f"} {"function":"g","args":"a"}\n{"function":"f","args":"\n"}\n',
    b'{"function":"f","args":[]} {"function":"f","args":[1]}\n{"function":"f"\n',
    b'{"function":"f","args":{"a":\n1}}\n',
    b'{"function":"f","args":[]}{"function":"g"}\n',
    b'{"function":"f","args":"a\n"}\n',
    b"\xef\xbb\xbf" + b'{"function":"f"}\n',
    b'{"function":"f","args":[1]}\n{"function":"h"}\n',
    b'{"function":"f","args":[1],"x":2}\n',
    b'{"function":"f","args":[1.5e999]}\n',
    b'{"function":"f","args":[NaN]}\n',
]


@pytest.mark.parametrize("data", SPLIT_ACROSS_LINES)
def test_a_chunk_the_lines_of_which_are_not_one_call_each_is_read_line_by_line(data: bytes) -> None:
    for size in (1, 7, 64, 1 << 20):
        assert chunked(data, size) == line_by_line(data)


def test_lines_split_across_two_lines_are_bad_lines_with_their_numbers() -> None:
    data = b'{"function":"f","args":[0]}\n' * 3 + b'{"function":"f","args":[1\n2]}\n'
    problems = chunked(data, 1 << 20)
    assert [p.split(": not valid JSON")[0] for p in problems] == [
        "c.jsonl: line 4",
        "c.jsonl: line 5",
    ]
    assert problems == line_by_line(data)


def test_the_calls_before_a_bad_line_are_given_before_its_error() -> None:
    data = b'{"function":"f","args":[1]}\n{"function":"g"}\n\n{"function":"x"}\n{"function":"f"}\n'
    got: list[tuple[str, Any]] = []
    with pytest.raises(SpecError) as caught:
        for batch in iter_call_chunks(io.BytesIO(data), "c.jsonl", KNOWN):
            got.extend(batch)
    assert got == [("f", [1]), ("g", [])]
    assert caught.value.problems[0].startswith("c.jsonl: line 4: function: 'x' is not a function")


def test_chunks_hold_whole_lines_and_count_them_from_one() -> None:
    data = b"a\nbb\n\nccc\nd"
    chunks = list(iter_chunks(io.BytesIO(data), 3))
    assert b"".join(c for _, c in chunks) == data + b"\n"
    for first, chunk in chunks:
        assert chunk.endswith(b"\n")
        assert data.split(b"\n")[first - 1] == chunk.split(b"\n")[0]


_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=6,
)


def _call_line(fid: str, args: Any, form: int) -> str:
    if form == 0:
        return '{"function":' + fid + "}"
    return '{"function":' + fid + ',"args":' + json.dumps(args) + "}"


_call_lines = st.builds(
    _call_line, st.sampled_from(['"f"', '"g"', '"h"', "1"]), _values, st.integers(0, 1)
)
_noise = st.sampled_from(["", "  ", "{", "}", "[1,", "2]}", '"a', "} {", "\t", "\r", "\x0c"])


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(_call_lines, _noise, st.tuples(_call_lines, _noise).map("".join)), max_size=12
    ),
    st.integers(1, 200),
    st.booleans(),
)
def test_chunked_reading_means_what_line_by_line_reading_means(
    lines: list[str], chunk_bytes: int, final_newline: bool
) -> None:
    data = "\n".join(lines).encode()
    if final_newline and data:
        data += b"\n"
    assert chunked(data, chunk_bytes) == line_by_line(data)
