"""RSS per suspended call: N calls waiting on IO at once in ONE executor (max-inflight 0).

Each call runs ``get_provider().read_req(...)`` and stays suspended (its greenlet,
its context, its pending request) until the test-side worker answers. RSS is
read from /proc/<pid>/statm and from the heartbeat's ``memoryBytes``: once
after a warm-up (code compiled, a few calls run), once with all N suspended,
and once after they were all resumed and finished.

    .venv/bin/python bench/executor_memory.py [--calls 10000]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import orjson
from tests.helpers.fake_worker import FakeWorker
from tests.helpers.pipelined_driver import (
    PipelinedDriver,
    process_rss_bytes,
)

from blockx.wire import Frame, encode_frame, keys

ONE_READ = """\
from blockx.sdk import get_provider


def _(i):
    value = get_provider().read_req("blockdb", "get_row", {"i": i})
    return {"i": i, "value": value["v"]}
"""


def call_maker(digest: str, task_id: str) -> Callable[[int], bytes]:
    def make(i: int) -> bytes:
        return encode_frame(
            orjson.dumps(
                {
                    keys.F_MESSAGE_TYPE: keys.MT_EXECUTE_CALL,
                    keys.F_CALL_ID: f"{task_id}/c{i}",
                    keys.F_PAYLOAD: {
                        keys.FP_TASK_ID: task_id,
                        keys.FP_FUNCTION_ID: "one_read",
                        keys.FP_FUNCTION_CODE_DIGEST: digest,
                        keys.FP_ARGS: i,
                        keys.FP_CALL_KEY: f"one_read:{i}",
                        keys.FP_ATTEMPT_SEQ: 1,
                    },
                }
            )
        )

    return make


def resume_frame(frame: Frame) -> bytes:
    envelope = frame.envelope
    return encode_frame(
        FakeWorker.resume_envelope(
            envelope[keys.F_CALL_ID],
            envelope[keys.F_REQUEST_ID],
            keys.WAIT_IO,
            result={"v": 1},
        )
    )


def settle_rss(worker: FakeWorker, seconds: float = 0.5) -> tuple[int, int]:
    """(statm RSS, last heartbeat memoryBytes) after letting the executor go idle."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        worker.pump(timeout=0.05)
    beat = worker.heartbeats[-1].envelope[keys.F_PAYLOAD]
    return process_rss_bytes(worker.pid), beat[keys.FP_MEMORY_BYTES]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10_000)
    args = parser.parse_args()
    n = args.calls

    worker = FakeWorker(threaded=False, max_inflight=0, heartbeat_interval=0.1)
    digest = worker.add_source(ONE_READ)
    worker.start()
    try:
        # Warm-up: compile the code and run a few calls to completion.
        PipelinedDriver(worker, call_maker(digest, "warm"), answer_io=resume_frame).run(500, 128)
        rss0, hb0 = settle_rss(worker)

        driver = PipelinedDriver(worker, call_maker(digest, "hold"))
        make = driver.make_call
        t0 = time.perf_counter()
        for start in range(0, n, 1000):
            worker.send_bytes(b"".join(make(i) for i in range(start, min(start + 1000, n))))
        held = driver.collect_waits(n)
        suspend_s = time.perf_counter() - t0
        assert not driver.failed, driver.failed[:3]
        rss1, hb1 = settle_rss(worker)
        beat = worker.heartbeats[-1].envelope[keys.F_PAYLOAD]
        waiting = beat[keys.FP_CALL_STATE_COUNTS].get("WAITING_IO")

        t1 = time.perf_counter()
        replies = [resume_frame(f) for f in held]
        for start in range(0, n, 1000):
            worker.send_bytes(b"".join(replies[start : start + 1000]))
        ended = 0
        while ended < n:
            ended += sum(
                1
                for f in worker.pump(timeout=10)
                if f.envelope[keys.F_MESSAGE_TYPE] in (keys.MT_CALL_COMPLETED, keys.MT_CALL_FAILED)
            )
        resume_s = time.perf_counter() - t1
        rss2, _hb2 = settle_rss(worker)
    finally:
        worker.stop()

    mib = 1 << 20
    print(f"executor memory: {n} calls suspended on IO at once (max-inflight 0)")
    print(f"| {'measure':<44} | {'value':>12} |")
    print(f"| {'-' * 44} | {'-' * 12}:|")
    print(f"| {'RSS after warm-up (statm)':<44} | {rss0 / mib:>9.1f} MiB |")
    print(f"| {'RSS with all suspended (statm)':<44} | {rss1 / mib:>9.1f} MiB |")
    print(f"| {'RSS after all resumed and finished (statm)':<44} | {rss2 / mib:>9.1f} MiB |")
    print(
        f"| {'heartbeat memoryBytes: warm / suspended':<44} | {hb0 / mib:>5.1f} / {hb1 / mib:<5.1f} |"
    )
    print(f"| {'heartbeat WAITING_IO count':<44} | {waiting!s:>12} |")
    print(
        f"| {'RSS growth per suspended call (statm)':<44} | {(rss1 - rss0) / n / 1024:>8.2f} KiB |"
    )
    print(
        f"| {'RSS growth per suspended call (heartbeat)':<44} | {(hb1 - hb0) / n / 1024:>8.2f} KiB |"
    )
    print(f"| {'time to suspend all (send → last wait)':<44} | {suspend_s * 1000:>9.0f} ms |")
    print(f"| {'time to resume and finish all':<44} | {resume_s * 1000:>9.0f} ms |")


if __name__ == "__main__":
    main()
