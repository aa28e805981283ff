"""Write a calls file for the streaming example: one JSON object per line.

    python examples/streaming/make_calls.py                       # 3000 lines -> calls.jsonl here
    python examples/streaming/make_calls.py 1000000 examples/.data/calls-1m.jsonl

Lines are ``{"function": "collatz", "args": {"n": N}}``; every 50th is a
``digits`` call, whose function returns one row per digit (a list return).
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    here = os.path.dirname(os.path.abspath(__file__))
    path = sys.argv[2] if len(sys.argv) > 2 else os.path.join(here, "calls.jsonl")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(1, count + 1):
            if i % 50 == 0:
                call = {"function": "digits", "args": {"n": i * 7919}}
            else:
                call = {"function": "collatz", "args": {"n": i}}
            f.write(json.dumps(call, separators=(",", ":")) + "\n")
    print(f"{path}: {count} calls", file=sys.stderr)


if __name__ == "__main__":
    main()
