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

from collections.abc import Iterable
from typing import Any, Final

import msgspec
import orjson

from blockx.wire import dumps_wire, loads_wire

__all__ = ["encode_args", "encode_output", "encode_output_fast", "rows_from_outputs"]

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
