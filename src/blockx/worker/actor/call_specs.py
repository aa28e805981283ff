"""A stream's or a one-shot list's calls turned into the core's ``CallSpec`` s: checked,
their arguments encoded canonically (docs/worker.md, "Tasks").

Compiled with the per-call modules (``setup.py``'s ``NATIVE_MODULES``): these loops run
once per call of every task, and interpreted they cost the worker ~1.4 µs per call of
the ~12 µs it spends on a trivial one (``blockx run``'s calls file, 2026-12-02).
:mod:`blockx.worker.actor.one_shot` and the stream's producer (``Worker._produce``)
call them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import orjson

from blockx.worker.api import Call, TaskSpecError
from blockx.worker.code import MISSING_FUNCTION_DIGEST
from blockx.worker.core import CallSpec
from blockx.worker.json_values import encode_args

__all__ = ["as_call", "call_specs", "encode_call_args", "pair_specs"]

_dumps = orjson.dumps
_SORTED_KEYS: Final = orjson.OPT_SORT_KEYS


def as_call(item: Any, index: int) -> Call:
    """``item`` as a :class:`Call` (a ``Call`` or a ``(function_id, args)`` pair)."""
    if isinstance(item, Call):
        return item
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
        return Call(item[0], item[1])
    raise TaskSpecError(
        f"call #{index} must be a Call or a (function_id, args) pair, not {type(item).__name__}"
    )


def encode_call_args(call: Call, index: int) -> bytes:
    """``call``'s arguments encoded canonically; ``TaskSpecError`` naming call #index."""
    try:
        return encode_args(call.args)
    except Exception as exc:
        raise TaskSpecError(f"call #{index} ({call.function_id}): args: {exc}") from None


def call_specs(calls: Sequence[Call], first_index: int) -> list[CallSpec]:
    """The specs of consecutive calls, the first being call #``first_index``.

    One loop with what it needs in locals: it runs once per call, and for
    trivial calls the function calls it saves are a sizeable part of the
    worker's share of the call.
    """
    specs: list[CallSpec] = []
    add_spec = specs.append
    dumps = _dumps
    for index, call in enumerate(calls, first_index):
        # encode_args, inlined: orjson with sorted keys; anything unusual (a big
        # int, a possible NaN behind a null, a bad value) takes the full path.
        try:
            args = dumps(call.args, option=_SORTED_KEYS)
        except TypeError:
            args = encode_call_args(call, index)
        else:
            if b"null" in args:
                args = encode_call_args(call, index)
        add_spec(CallSpec(call.function_id, args))
    return specs


def pair_specs(
    pairs: Sequence[Any],
    start: int,
    end: int,
    first_index: int,
    specs: list[CallSpec],
    size: int,
    max_bytes: int,
    missing: dict[str, str],
) -> tuple[int, int]:
    """Append the specs of ``pairs[start:end]`` (a :class:`~blockx.worker.api.CallBatch`'s
    ``(function_id, args)`` pairs; ``pairs[start]`` is call #``first_index``) to
    ``specs`` until ``size`` (the argument bytes so far) reaches ``max_bytes``; return
    ``(the next position, size)``.

    What :func:`as_call` and :func:`encode_call_args` do per call, in one loop: an item
    that is neither such a pair nor a :class:`Call`, or whose arguments do not encode,
    raises :class:`TaskSpecError` naming the call's index. A function id not in
    ``missing`` is added to it with ``MISSING_FUNCTION_DIGEST`` (the stream's digests).
    Arguments are copied right-sized (``blockx/worker/json_values.py``: a stream keeps
    them until their batch settles).
    """
    add_spec = specs.append
    dumps = _dumps
    position = start
    index = first_index
    while position < end:
        pair: Any = pairs[position]
        if type(pair) is tuple and len(pair) == 2 and type(pair[0]) is str:
            function_id: str = pair[0]
            args: Any = pair[1]
        else:
            call = as_call(pair, index)  # a Call, or TaskSpecError naming the index
            function_id, args = call.function_id, call.args
        if function_id not in missing:
            missing[function_id] = MISSING_FUNCTION_DIGEST
        try:
            encoded: bytes = dumps(args, option=_SORTED_KEYS)
        except TypeError:
            encoded = encode_call_args(Call(function_id, args), index)
        else:
            if b"null" in encoded:  # a NaN written as null? encode_args judges
                encoded = encode_call_args(Call(function_id, args), index)
            else:
                encoded = memoryview(encoded).tobytes()
        add_spec(CallSpec(function_id, encoded))
        size += len(encoded)
        position += 1
        index += 1
        if size >= max_bytes:
            break
    return position, size
