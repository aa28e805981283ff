"""Driving an unthreaded :class:`~tests.helpers.fake_worker.FakeWorker` at full speed, for benches.

:class:`PipelinedDriver` keeps N calls in flight with batched reads and writes;
``process_cpu_seconds`` / ``process_rss_bytes`` read another process's CPU time
and RSS from ``/proc``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from blockx.wire import Frame, encode_frame, keys

from .fake_worker import TERMINAL_TYPES, FakeWorker

__all__ = ["PipelinedDriver", "process_cpu_seconds", "process_rss_bytes"]


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process, from ``/proc/<pid>/stat``."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(") ", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_rss_bytes(pid: int) -> int:
    """Resident set size of a process, from ``/proc/<pid>/statm``."""
    with open(f"/proc/{pid}/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PipelinedDriver:
    """Keeps ``inflight`` calls in flight through an unthreaded :class:`FakeWorker`.

    Single-threaded and batched: each ``recv`` is decoded at once, every
    answer it calls for (a new ExecuteCall per terminal frame, a ResumeCall per
    wait) is encoded and the lot goes out in one ``sendall``. ``make_call(i)``
    returns the encoded ExecuteCall frame of call ``i``; ``answer_io(frame)``
    returns the encoded ResumeCall frame for an io wait (or None to hold it).
    """

    def __init__(
        self,
        worker: FakeWorker,
        make_call: Callable[[int], bytes],
        *,
        answer_io: Callable[[Frame], bytes | None] | None = None,
    ) -> None:
        assert not worker.threaded, "PipelinedDriver needs FakeWorker(threaded=False)"
        self.worker = worker
        self.make_call = make_call
        self.answer_io = answer_io
        self.completed = 0
        self.failed: list[Frame] = []
        self.waits = 0
        self.held: list[Frame] = []

    def run(self, total: int, inflight: int, *, timeout: float = 300.0) -> None:
        """Run calls ``0 .. total-1``, at most ``inflight`` at a time; return when all ended."""
        worker = self.worker
        make_call = self.make_call
        sent = min(inflight, total)
        worker.send_bytes(b"".join(make_call(i) for i in range(sent)))
        ended = 0
        deadline = time.monotonic() + timeout
        completed_type = keys.MT_CALL_COMPLETED
        failed_type = keys.MT_CALL_FAILED
        waiting_type = keys.MT_CALL_WAITING
        while ended < total:
            if time.monotonic() > deadline:
                raise AssertionError(f"only {ended} of {total} calls ended in {timeout}s")
            frames = worker.pump(timeout=max(deadline - time.monotonic(), 0.01))
            out: list[bytes] = []
            for frame in frames:
                message_type = frame.envelope[keys.F_MESSAGE_TYPE]
                if message_type == completed_type or message_type == failed_type:
                    ended += 1
                    if message_type == completed_type:
                        self.completed += 1
                    else:
                        self.failed.append(frame)
                    if sent < total:
                        out.append(make_call(sent))
                        sent += 1
                elif message_type == waiting_type:
                    self.waits += 1
                    reply = self._answer_wait(frame)
                    if reply is not None:
                        out.append(reply)
                    else:
                        self.held.append(frame)
            if out:
                worker.send_bytes(b"".join(out))

    def collect_waits(self, count: int, *, timeout: float = 300.0) -> list[Frame]:
        """Pump until ``count`` io waits are held (function_code waits are answered)."""
        deadline = time.monotonic() + timeout
        while len(self.held) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"only {len(self.held)} of {count} waits in {timeout}s")
            out = []
            for frame in self.worker.pump(timeout=1.0):
                message_type = frame.envelope[keys.F_MESSAGE_TYPE]
                if message_type == keys.MT_CALL_WAITING:
                    reply = self._answer_wait(frame)
                    if reply is None:
                        self.held.append(frame)
                    else:
                        out.append(reply)
                elif message_type in TERMINAL_TYPES:
                    self.failed.append(frame)
            if out:
                self.worker.send_bytes(b"".join(out))
        return self.held

    def _answer_wait(self, frame: Frame) -> bytes | None:
        envelope = frame.envelope
        payload = envelope[keys.F_PAYLOAD]
        wait_kind = payload[keys.FP_WAIT_KIND]
        if wait_kind == keys.WAIT_FUNCTION_CODE:
            digest = payload[keys.FP_FUNCTION_CODE_DIGEST]
            result = {
                keys.FP_SOURCE: self.worker.sources[digest],
                keys.FP_FUNCTION_CODE_DIGEST: digest,
            }
            return encode_frame(
                FakeWorker.resume_envelope(
                    envelope[keys.F_CALL_ID],
                    envelope[keys.F_REQUEST_ID],
                    keys.WAIT_FUNCTION_CODE,
                    result=result,
                )
            )
        if wait_kind == keys.WAIT_IO and self.answer_io is not None:
            return self.answer_io(frame)
        return None
