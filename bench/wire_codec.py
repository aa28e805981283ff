"""Frames/s for encoding and decoding typical envelopes: orjson vs msgspec vs stdlib json.

Run: .venv/bin/python bench/wire_codec.py [--seconds 0.3]

Rows:
* ``encode`` / ``decode``: envelope dict <-> JSON bytes with each library.
* ``blockx.wire frame``: what the protocol code really does per frame
  (``encode_frame``; ``FrameDecoder.feed`` of a 64-frame batch, per frame).
* ``validated payload``: the slow paths' validation of the decoded payload dict into
  the schema's payload Struct (``blockx.wire.validate``), against the wire schema's
  Structs themselves (``blockx.wire.schema``: the envelope encoded from, and decoded
  straight into, a ``Struct``; a ``CallCompleted``'s output stays raw JSON). This is
  why the hot paths decode bytes into the Structs and validation is for slow paths.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import msgspec
import orjson

from blockx import wire
from blockx.wire import schema

EXECUTE_CALL: dict[str, Any] = {
    "messageType": "ExecuteCall",
    "callId": "task-7f3a/c-000042",
    "requestId": None,
    "executorId": "exec-1",
    "sentAtMs": 1764450000000,
    "trace": None,
    "payload": {
        "taskId": "task-7f3a",
        "functionId": "pricing/adder",
        "functionCodeDigest": "sha256:" + "ab" * 32,
        "entrySelector": "_",
        "args": {"left": 12345, "right": 67890, "chain": "eth", "block": 19000000},
        "parentCallId": None,
        "callKey": "ck-" + "cd" * 16,
        "ancestry": [],
        "callBudgetMs": 5000,
        "attemptSeq": 1,
        "audit": None,
        "debug": False,
    },
}
CALL_COMPLETED: dict[str, Any] = {
    "messageType": "CallCompleted",
    "callId": "task-7f3a/c-000042",
    "executorId": "exec-1",
    "sentAtMs": 1764450000123,
    "payload": {
        "taskId": "task-7f3a",
        "attemptSeq": 1,
        "output": {"sum": 80235, "balance": "1250000000000000000", "price": 3012.55},
        "budgetUsedMs": 3,
        "effectiveExecutionDurationUs": 2870,
        "queueWaitUs": 41,
        "debugOutput": None,
    },
}


def rate(fn: Callable[[], object], seconds: float, per_call: int = 1) -> float:
    """Operations per second: median of 3 timed runs."""
    n = 1000
    while True:  # calibrate
        start = time.perf_counter()
        for _ in range(n):
            fn()
        if time.perf_counter() - start > seconds / 5:
            break
        n *= 2
    results = []
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        results.append(n * per_call / (time.perf_counter() - start))
    return statistics.median(results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=0.3)
    args = parser.parse_args()
    seconds = args.seconds

    rows: list[tuple[str, str, float, float]] = []
    ms_encoder = msgspec.json.Encoder()
    ms_decoder = msgspec.json.Decoder()
    for name, env, typed, struct in (
        ("ExecuteCall", EXECUTE_CALL, schema.ExecuteCallPayload, schema.ExecuteCall),
        ("CallCompleted", CALL_COMPLETED, schema.CallCompletedPayload, schema.CallCompleted),
    ):
        body = orjson.dumps(env)
        frame = wire.encode_frame(env)
        batch = frame * 64
        struct_decoder = msgspec.json.Decoder(struct)
        typed_envelope = struct_decoder.decode(body)
        decoder = wire.FrameDecoder()
        payload = env["payload"]
        cases: list[tuple[str, Callable[[], object], Callable[[], object], int]] = [
            ("orjson", lambda env=env: orjson.dumps(env), lambda body=body: orjson.loads(body), 1),
            (
                "msgspec",
                lambda env=env: ms_encoder.encode(env),
                lambda body=body: ms_decoder.decode(body),
                1,
            ),
            (
                "stdlib json",
                lambda env=env: json.dumps(env, separators=(",", ":")).encode(),
                lambda body=body: json.loads(body),
                1,
            ),
            (
                "blockx.wire frame",
                lambda env=env: wire.encode_frame(env),
                lambda batch=batch, decoder=decoder: decoder.feed(batch),
                64,
            ),
        ]
        for label, enc, dec, per in cases:
            rows.append((name, label, rate(enc, seconds), rate(dec, seconds, per)))
        rows.append(
            (
                name,
                "validated payload (Struct from dict)",
                float("nan"),
                rate(lambda typed=typed, payload=payload: wire.validate(typed, payload), seconds),
            )
        )
        rows.append(
            (
                name,
                "wire schema Struct (typed<->bytes)",
                rate(lambda env=typed_envelope: ms_encoder.encode(env), seconds),
                rate(lambda d=struct_decoder, body=body: d.decode(body), seconds),
            )
        )
        rows.append(("", "", 0.0, 0.0))

    print(f"{'message':<14} {'codec':<38} {'encode frames/s':>16} {'decode frames/s':>16}")
    print("-" * 88)
    for message, codec, enc_rate, dec_rate in rows:
        if not message:
            print()
            continue
        enc = "-" if enc_rate != enc_rate else f"{enc_rate:,.0f}"
        print(f"{message:<14} {codec:<38} {enc:>16} {dec_rate:>16,.0f}")
    base = {r[:2]: r for r in rows}
    for name in ("ExecuteCall", "CallCompleted"):
        o = base[(name, "orjson")]
        j = base[(name, "stdlib json")]
        m = base[(name, "msgspec")]
        print(
            f"{name}: orjson/stdlib encode {o[2] / j[2]:.1f}x, decode {o[3] / j[3]:.1f}x; "
            f"msgspec/orjson decode {m[3] / o[3]:.2f}x"
        )


if __name__ == "__main__":
    main()
