"""JSON values at the worker's edges: call arguments in, call outputs out.

The dispatcher core keeps arguments and outputs as encoded JSON ``bytes`` and
never parses them. Arguments are hashed into call keys, so they are encoded
*canonically* (orjson with sorted keys): equal arguments give equal bytes, and
the call cache and singleflight find equal calls. Outputs arrive decoded (the
frame decoder parses the whole envelope) and are re-encoded once for the core;
the task's rows are decoded from all of a task's (or a batch's) outputs with
one ``loads_wire`` call.

Integers beyond 64 bits (a uint256 balance) stay exact: arguments take the
wire's exact slow path, outputs msgspec's encoder writes them as they are; NaN
and infinities in arguments are refused (:class:`~blockx.wire.NotSerializableError`).

Allocation matters here (``timeit``, best of 5, 20,000 small values kept
alive, as a task keeps its calls' arguments and outputs): ``orjson.dumps``
returns its 1 KiB working buffer shrunk in place, and thousands of such blocks
living on fragment the heap -- 2.0 µs per value kept, against 0.21 µs for a
value dropped at once. So arguments, which must keep orjson's encoding (the
call key hashes them, and orjson's handling of non-JSON types is the API), are
copied into a right-sized object (0.53 µs all in); outputs, which are decoded
wire values (plain JSON types only), are re-encoded with ``msgspec``, which
sizes its buffer to the value (0.09 µs) and writes big integers exactly. The
two encoders agree on every plain JSON value except the exponent of large
floats (``1e+20`` / ``1e20``): the same number either way.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

import msgspec
import orjson

from blockx.wire import dumps_wire, loads_wire

__all__ = [
    "encode_args",
    "encode_output",
    "encode_output_fast",
    "rows_from_outputs",
    "rows_jsonl",
]

_dumps = orjson.dumps
_SORTED: Final = orjson.OPT_SORT_KEYS
#: Encodes decoded outputs into right-sized buffers (see the module docstring).
encode_output_fast = msgspec.json.Encoder().encode


def encode_args(value: Any) -> bytes:
    """Canonical JSON bytes of a call's arguments (sorted keys). Raises ``NotSerializableError``."""
    try:
        encoded = _dumps(value, option=_SORTED)
    except TypeError:
        return dumps_wire(value)  # big ints (exact), or a typed error naming the bad value
    if b"null" in encoded:
        dumps_wire(value)  # orjson writes NaN as null: let the strict encoder judge
    return memoryview(encoded).tobytes()  # right-sized: see the module docstring


def encode_output(value: Any) -> bytes:
    """JSON bytes of a decoded output (as received: plain JSON values, no NaN).

    ``encode_output_fast`` is the same without the fallback, for hot loops that
    catch its errors themselves (any value the wire decoder produced encodes).
    """
    try:
        return encode_output_fast(value)
    except (TypeError, ValueError, OverflowError):  # not a decoded value after all
        return dumps_wire(value)


def rows_from_outputs(outputs: Iterable[bytes]) -> list[Any]:
    """A task's rows from its outputs: a dict is one row, a list many, ``null`` none.

    Any other value (a number, a string) is one row as it is.
    """
    outputs = outputs if isinstance(outputs, (list, tuple)) else list(outputs)
    if not outputs:
        return []
    values = loads_wire(b"[" + b",".join(outputs) + b"]")
    rows: list[Any] = []
    append = rows.append
    extend = rows.extend
    for value in values:
        if value is None:
            continue
        if type(value) is list:
            extend(value)
        else:
            append(value)
    return rows


def rows_jsonl(outputs: Sequence[bytes]) -> tuple[bytes, int] | None:
    """The rows of ``outputs`` as JSON Lines without decoding them, and how many: the
    outputs themselves, one a line, when each is one object (one row) -- else None
    (decode them: :func:`rows_from_outputs`).

    The bytes are those a decode and msgspec's ``encode_lines`` would write
    (``blockx.cli.output.encode_rows``) for any output the executor encodes: orjson,
    msgspec and the standard library's compact encoder write every string, integer and
    key order as msgspec does, and differ only in a float's exponent (``1e+20``,
    ``1e-07``), which sends the outputs down the decoding path (so does an exponent's
    look-alike inside a string: correct, only slower). A line break in an output (a
    peer that is not our executor may put whitespace between tokens) does too; other
    whitespace a foreign peer writes is kept, the same JSON value either way.
    Checked over the joined text at C speed: ~1 µs a 1,000 rows, against ~1 µs a row
    to decode and encode rows of five uint256 balances.
    """
    count = len(outputs)
    if not count:
        return b"", 0
    body = b"\n".join(outputs) + b"\n"
    if (
        body[:1] != b"{"
        or body.count(b"\n") != count  # no output holds a line break: each is one line
        or body.count(b"\n{") != count - 1  # so each starts a line: each is an object
        or b"\r" in body
        or b"e+" in body
        or b"e-0" in body
    ):
        return None
    return body, count
