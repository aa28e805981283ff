"""JSON values on the wire: what a user function may return, and how it is written.

``dumps_wire`` is the one encoder for values that come from user code (outputs,
IO params, sub-call args). It is orjson on the fast path and adds what the
protocol asks for and orjson does not do by itself:

* ``int`` beyond 64 bits (a uint256 balance) is written as an exact JSON number
  (orjson refuses those; we fall back to the standard library for that value);
* ``datetime`` becomes RFC 3339 (aware: with its offset; naive: ISO 8601 without
  offset), ``date`` ``YYYY-MM-DD``, ``time`` ``HH:MM:SS[.ffffff]``;
* a dataclass is converted with :func:`dataclasses.asdict` and logs one warning
  per class (return plain dicts: they are faster and say what they mean);
* NaN and infinities raise (orjson would silently write ``null``);
* ``uuid.UUID`` becomes its string and an ``Enum`` its value (orjson's own rules);
* anything else — ``Decimal``, ``set``, ``bytes``, a non-string dict key —
  raises :class:`NotSerializableError` naming where the value sits.

``loads_wire`` decodes with msgspec, which keeps big integers exact (orjson
turns them into floats).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import enum
import json as _json
import logging
import math
import uuid
from collections.abc import Iterator
from typing import Any, Final

import msgspec
import orjson

from .errors import NotSerializableError

__all__ = ["dumps_wire", "loads_wire"]

_log = logging.getLogger("blockx.wire")

_ORJSON_OPTIONS: Final = orjson.OPT_PASSTHROUGH_DATACLASS
_orjson_dumps: Final = orjson.dumps
# Names, not classes: a class would keep its module alive (in the executor, a task's
# whole namespace, re-created per task). Bounded: past the cap nothing is remembered.
_warned_dataclasses: set[str] = set()
_WARNED_DATACLASSES_MAX = 1024
_decoder: Final = msgspec.json.Decoder()


def _orjson_default(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        cls = type(value)
        name = f"{cls.__module__}.{cls.__qualname__}"
        if name not in _warned_dataclasses and len(_warned_dataclasses) < _WARNED_DATACLASSES_MAX:
            _warned_dataclasses.add(name)
            _log.warning(
                "dataclass %s.%s serialised with dataclasses.asdict; return a dict instead",
                cls.__module__,
                cls.__qualname__,
            )
        return dataclasses.asdict(value)
    raise TypeError  # orjson turns this into JSONEncodeError; we locate it afterwards


def _stdlib_default(value: Any) -> Any:
    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, enum.Enum):
        return value.value
    return _orjson_default(value)


def dumps_wire(value: Any) -> bytes:
    """Encode ``value`` as compact UTF-8 JSON bytes, strictly.

    Raises :class:`NotSerializableError` (``error_kind`` =
    ``output_not_serializable``) for a value JSON cannot hold; the message names
    the value's path.
    """
    try:
        encoded = _orjson_dumps(value, default=_orjson_default, option=_ORJSON_OPTIONS)
    except TypeError as exc:
        if "64-bit" not in str(exc):
            raise _locate_problem(value) from None
        return _dumps_stdlib(value)
    # orjson writes NaN/Infinity as null: only an output holding a null can hide one.
    if b"null" in encoded:
        _reject_non_finite(value)
    return encoded


def _dumps_stdlib(value: Any) -> bytes:
    """The path for values holding integers beyond 64 bits (a uint256 balance): msgspec,
    which writes them exactly, when the value is plain JSON (the common case: ~10x the
    stdlib encoder); else the standard library's encoder, after the strict check."""
    if _plain_json(value):
        return _encode_plain(value)
    problem = _first_problem(value, "$", allow_big_ints=True)
    if problem is not None:
        raise problem
    text = _json.dumps(
        value, default=_stdlib_default, allow_nan=False, ensure_ascii=False, separators=(",", ":")
    )
    return text.encode("utf-8")


def loads_wire(data: bytes | bytearray | memoryview | str) -> Any:
    """Decode JSON text, keeping integers of any size exact.

    Raises ``msgspec.DecodeError`` (a ``ValueError``) on malformed input — a text
    nested deeper than the interpreter's recursion limit included (msgspec raises
    ``RecursionError`` for those: a depth bomb is malformed input, not a crash); the
    frame layer turns that into a typed :class:`~blockx.wire.errors.ProtocolError`.
    """
    try:
        return _decoder.decode(data)
    except RecursionError:
        raise msgspec.DecodeError(_TOO_DEEP) from None


#: The message of a text nested too deeply to decode.
_TOO_DEEP: Final = "JSON nests too deeply (past the recursion limit)"


# --- locating the problem ------------------------------------------------------

_SCALARS = (str, bool, type(None))
# Types orjson writes natively (a UUID as its string, an Enum as its value).
_NATIVE = (_dt.datetime, _dt.date, _dt.time, uuid.UUID, enum.Enum)
_MAX_DEPTH = 254  # orjson's own nesting limit


#: Plain JSON values (with integers of any size) to bytes: the same text as the standard
#: library's compact encoder, but for a float's exponent (``1e20``, not ``1e+20``).
_encode_plain: Final = msgspec.json.Encoder().encode


def _plain_json(value: Any) -> bool:
    """Whether ``value`` holds only str, bool, None, int, finite float, and lists, tuples
    and str-keyed dicts of those, no deeper than orjson's limit (what msgspec writes as the
    standard library would; anything else takes the strict path, which names a problem)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        kind = type(item)
        if kind is str or kind is int or kind is bool or item is None:
            continue
        if kind is float:
            if not math.isfinite(item):
                return False
            continue
        if depth >= _MAX_DEPTH:
            return False
        if kind is dict:
            for key, child in item.items():
                if type(key) is not str:
                    return False
                stack.append((child, depth + 1))
        elif kind is list or kind is tuple:
            for child in item:
                stack.append((child, depth + 1))
        else:
            return False
    return True


def _reject_non_finite(value: Any) -> None:
    problem = _first_problem(value, "$", allow_big_ints=True)
    if problem is not None:
        raise problem


def _locate_problem(value: Any) -> NotSerializableError:
    problem = _first_problem(value, "$", allow_big_ints=True)
    if problem is not None:
        return problem
    return NotSerializableError("$", "cannot be encoded as JSON")


def _children(value: Any, path: str) -> Iterator[tuple[Any, str]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield item, f"{path}[{key!r}]"
    else:
        for index, item in enumerate(value):
            yield item, f"{path}[{index}]"


def _first_problem(value: Any, path: str, *, allow_big_ints: bool) -> NotSerializableError | None:
    """Depth-first search for the first value JSON cannot hold, or None."""
    stack: list[tuple[Any, str, int]] = [(value, path, 0)]
    while stack:
        item, where, depth = stack.pop()
        if depth > _MAX_DEPTH:
            return NotSerializableError(where, f"is nested more than {_MAX_DEPTH} levels deep")
        if isinstance(item, _SCALARS):
            continue
        if isinstance(item, int):
            if not allow_big_ints and not -(2**63) <= item < 2**64:
                return NotSerializableError(where, "is an integer beyond 64 bits")
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                return NotSerializableError(
                    where, f"is {item!r}; JSON has no NaN or Infinity (use None or a string)"
                )
            continue
        if isinstance(item, _NATIVE):
            continue
        if dataclasses.is_dataclass(item) and not isinstance(item, type):
            stack.append((dataclasses.asdict(item), where, depth + 1))
            continue
        if isinstance(item, dict):
            for key in item:
                if not isinstance(key, str):
                    return NotSerializableError(
                        f"{where}[{key!r}]",
                        f"has a key of type {type(key).__name__}; JSON object keys must be str",
                    )
        if isinstance(item, (dict, list, tuple)):
            children = list(_children(item, where))
            # children[::-1], not reversed(children): mypyc crashes compiling the latter here.
            stack.extend((child, child_path, depth + 1) for child, child_path in children[::-1])
            continue
        hint = "; convert it to str first" if type(item).__name__ == "Decimal" else ""
        return NotSerializableError(where, f"is a {type(item).__name__}, not JSON{hint}")
    return None
