"""A test-side executor: a small asyncio client speaking docs/protocol.md to the adapter.

It runs on the test's own event loop (the adapter's), records every frame the
worker sends, and sends whatever frames a test scripts — valid or not.
``pause_reading`` stops it from reading its socket, which is how tests make
the adapter's transport back up for real.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from tests.helpers.processes import process_is_gone

from blockx.wire import BATCH_MAGIC, Frame, FrameDecoder, ProtocolError, encode_frame, keys
from blockx.worker.link.adapter import ExecutorAdapter
from blockx.worker.link.callbacks import AdapterCallbacks
from blockx.worker.link.loss import ExecutorLoss

__all__ = [
    "DIGEST",
    "ExecutorPeer",
    "Recorder",
    "attached",
    "eventually",
    "execute_payload",
    "heartbeat_payload",
    "process_is_gone",
]

DIGEST = "sha256:" + "ab" * 32


def heartbeat_payload(executor_id: str, seq: int = 1, **fields: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {
        keys.FP_EXECUTOR_ID: executor_id,
        keys.FP_HEARTBEAT_SEQ: seq,
        keys.FP_RUNNABLE_COUNT: 0,
        keys.FP_INFLIGHT_COUNT: 0,
        keys.FP_AVAILABLE_CONTEXTS: 128,
        keys.FP_MEMORY_BYTES: 50_000_000,
        keys.FP_LAST_SCHEDULER_ACTIVE_AT_MS: 1_700_000_000_000,
        keys.FP_RUNNING_CALL_ID: None,
    }
    payload.update(fields)
    return payload


class ExecutorPeer(asyncio.Protocol):
    """One connection to the adapter, from the executor's side."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.decoder = FrameDecoder()
        self.frames: list[Frame] = []
        self.recv_batches = 0
        # The frames as written (a batched frame counts once) and how many were batched.
        self.outer_frames = 0
        self.outer_batched = 0
        self._outer = bytearray()
        self.closed = asyncio.Event()
        self.protocol_error: ProtocolError | None = None
        self._changed = asyncio.Event()
        self.executor_id = "exec-test"

    @classmethod
    async def connect(cls, path: str) -> ExecutorPeer:
        loop = asyncio.get_running_loop()
        _transport, peer = await loop.create_unix_connection(cls, path)
        return peer

    # --- asyncio.Protocol ---
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.recv_batches += 1
        self._count_outer(data)
        try:
            self.frames.extend(self.decoder.feed(data))
        except ProtocolError as exc:
            self.protocol_error = exc
        self._changed.set()

    def _count_outer(self, data: bytes) -> None:
        buffer = self._outer
        buffer += data
        while len(buffer) >= 4:
            size = int.from_bytes(buffer[:4], "big")
            if len(buffer) < 4 + size:
                return
            self.outer_frames += 1
            if buffer[4:8] == BATCH_MAGIC:
                self.outer_batched += 1
            del buffer[: 4 + size]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed.set()
        self._changed.set()

    # --- sending ---
    def send(self, envelope: dict[str, Any], sidecar: bytes | None = None) -> None:
        envelope.setdefault(keys.F_EXECUTOR_ID, self.executor_id)
        assert self.transport is not None
        self.transport.write(encode_frame(envelope, sidecar))

    def send_raw(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def heartbeat(self, executor_id: str | None = None, seq: int = 1, **fields: Any) -> None:
        if executor_id is not None:
            self.executor_id = executor_id
        self.send(
            {
                keys.F_MESSAGE_TYPE: keys.MT_HEARTBEAT,
                keys.F_PAYLOAD: heartbeat_payload(self.executor_id, seq, **fields),
            }
        )

    def completed(self, call_id: str, output: Any = None, *, attempt: int = 1) -> None:
        self.send(
            {
                keys.F_MESSAGE_TYPE: keys.MT_CALL_COMPLETED,
                keys.F_CALL_ID: call_id,
                keys.F_PAYLOAD: {
                    keys.FP_TASK_ID: "t1",
                    keys.FP_ATTEMPT_SEQ: attempt,
                    keys.FP_OUTPUT: output,
                    keys.FP_BUDGET_USED_MS: 1,
                },
            }
        )

    def failed(self, call_id: str, kind: str = "user_error", *, attempt: int = 1) -> None:
        self.send(
            {
                keys.F_MESSAGE_TYPE: keys.MT_CALL_FAILED,
                keys.F_CALL_ID: call_id,
                keys.F_PAYLOAD: {
                    keys.FP_TASK_ID: "t1",
                    keys.FP_ATTEMPT_SEQ: attempt,
                    keys.FP_ERROR_KIND: kind,
                    keys.FP_RETRYABLE: False,
                    keys.FP_ERROR_MESSAGE: "boom",
                },
            }
        )

    def waiting(
        self,
        call_id: str,
        request_id: str,
        payload: dict[str, Any],
        sidecar: bytes | None = None,
    ) -> None:
        full = {keys.FP_TASK_ID: "t1", keys.FP_ATTEMPT_SEQ: 1, **payload}
        self.send(
            {
                keys.F_MESSAGE_TYPE: keys.MT_CALL_WAITING,
                keys.F_CALL_ID: call_id,
                keys.F_REQUEST_ID: request_id,
                keys.F_PAYLOAD: full,
            },
            sidecar,
        )

    # --- waiting ---
    def of_type(self, message_type: str) -> list[Frame]:
        return [f for f in self.frames if f.envelope[keys.F_MESSAGE_TYPE] == message_type]

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"condition not met within {timeout}s; frames={self.frames!r}")
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except TimeoutError:
                pass

    async def wait_frames(
        self, message_type: str, count: int = 1, timeout: float = 5.0
    ) -> list[Frame]:
        await self.wait_for(lambda: len(self.of_type(message_type)) >= count, timeout)
        return self.of_type(message_type)

    async def wait_closed(self, timeout: float = 5.0) -> None:
        await asyncio.wait_for(self.closed.wait(), timeout)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class Recorder:
    """Records every adapter callback as ``(name, args)``."""

    def __init__(self) -> None:
        self.events: list[tuple[str, tuple[Any, ...]]] = []
        self.hooks: dict[str, Callable[..., None]] = {}
        self._changed: asyncio.Event | None = None

    def _record(self, name: str) -> Callable[..., None]:
        def record(*args: Any) -> None:
            self.events.append((name, args))
            hook = self.hooks.get(name)
            if hook is not None:
                hook(*args)
            if self._changed is not None:
                self._changed.set()

        return record

    def _record_lost(
        self, executor_id: str, lost_calls: Any, reason: str, loss: ExecutorLoss
    ) -> None:
        """``lost`` records ``(executor_id, lost_calls, reason)``, ``loss`` records
        ``(executor_id, loss)``: one callback, two views."""
        self.events.append(("loss", (executor_id, loss)))
        self._record("lost")(executor_id, lost_calls, reason)

    def loss(self, index: int = -1) -> ExecutorLoss:
        return self.named("loss")[index][1]  # type: ignore[no-any-return]

    def callbacks(self) -> AdapterCallbacks:
        return AdapterCallbacks(
            on_executor_attached=self._record("attached"),
            on_heartbeat=self._record("heartbeat"),
            on_call_completed=self._record("completed"),
            on_call_failed=self._record("failed"),
            on_call_waiting=self._record("waiting"),
            on_executor_lost=self._record_lost,
            on_control_sent=self._record("control_sent"),
            on_control_failed=self._record("control_failed"),
            on_batch_done=self._record("batch_done"),
        )

    def named(self, name: str) -> list[tuple[Any, ...]]:
        return [args for event, args in self.events if event == name]

    async def wait(self, name: str, count: int = 1, timeout: float = 5.0) -> list[tuple[Any, ...]]:
        if self._changed is None:
            self._changed = asyncio.Event()
        deadline = time.monotonic() + timeout
        while len(self.named(name)) < count:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"{count} x {name} not seen within {timeout}s: {self.events!r}")
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except TimeoutError:
                pass
        return self.named(name)


async def eventually(
    predicate: Callable[[], bool], timeout: float = 5.0, step: float = 0.005
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout}s")
        await asyncio.sleep(step)


def execute_payload(attempt: int = 1, args: Any = None) -> dict[str, Any]:
    return {
        keys.FP_TASK_ID: "t1",
        keys.FP_FUNCTION_ID: "adder",
        keys.FP_FUNCTION_CODE_DIGEST: DIGEST,
        keys.FP_ENTRY_SELECTOR: "_",
        keys.FP_ARGS: args if args is not None else {"x": 1},
        keys.FP_CALL_BUDGET_MS: 5000,
        keys.FP_ATTEMPT_SEQ: attempt,
    }


async def attached(
    adapter: ExecutorAdapter, rec: Recorder, executor_id: str = "exec-0", **hb: Any
) -> ExecutorPeer:
    peer = await ExecutorPeer.connect(adapter.socket_path)
    before = len(rec.named("attached"))
    peer.heartbeat(executor_id, **hb)
    await rec.wait("attached", before + 1)
    return peer
