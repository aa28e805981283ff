"""A test-side worker: listens on a real Unix socket, spawns ``python -m blockx.executor``,
and speaks docs/protocol.md to it.

Two ways to drive it:

* **threaded** (the default, for tests): a reader thread decodes every frame.
  ``Heartbeat`` frames are recorded in :attr:`FakeWorker.heartbeats`;
  ``CallWaiting(function_code)`` is answered from :attr:`FakeWorker.sources`
  (keyed by digest); ``CallWaiting(io)`` goes to the test's ``io_handler`` when
  there is one; everything else lands in a queue read with :meth:`next_frame` /
  :meth:`wait_terminal` — all with timeouts, nothing blocks forever.
* **unthreaded** (``threaded=False``, for benches; see ``pipelined_driver.py``):
  :meth:`start` returns once the first heartbeat came; the caller then owns the
  socket and calls
  :meth:`pump` (one buffered ``recv``, all frames it completed) and
  :meth:`send_bytes` (one ``sendall`` of frames it batched itself).

:meth:`stop` (also the context-manager exit) kills the executor, reaps it and
asserts it is gone: no test leaves an orphan process behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import queue
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from blockx.wire import BATCH_MAGIC, Frame, FrameDecoder, ProtocolError, encode_frame, keys

__all__ = [
    "TERMINAL_TYPES",
    "ExecutorExited",
    "FakeWorker",
    "IoReply",
    "digest_of",
    "process_is_gone",
]

TERMINAL_TYPES = frozenset({keys.MT_CALL_COMPLETED, keys.MT_CALL_FAILED})


def digest_of(source: str) -> str:
    """The ``functionCodeDigest`` of a source: ``sha256:`` + hex of its UTF-8 bytes."""
    return "sha256:" + hashlib.sha256(source.encode("utf-8")).hexdigest()


def process_is_gone(pid: int) -> bool:
    """True when no process with this pid exists any more, not even an unreaped zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@dataclass(frozen=True, slots=True, kw_only=True)
class IoReply:
    """What an ``io_handler`` answers a ``CallWaiting(io)`` with (or return a plain result)."""

    result: Any = None
    error: dict[str, Any] | None = None
    sidecar: bytes | None = None
    budget_used_ms: int = 0
    #: ``ResumeCall.immutable``: the executor may keep the answer for identical reads.
    immutable: bool = False


class ExecutorExited(AssertionError):
    """The executor process ended while a test was waiting for a frame."""


IoHandler = Callable[[Frame], "IoReply | Any | None"]


class OuterFrames:
    """Counts the frames of a byte stream as written: ``frames`` outer frames, of which
    ``batched`` are ``BXM1`` batched frames (docs/protocol.md "Batched frames")."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self.frames = 0
        self.batched = 0

    def feed(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        while len(buffer) >= 4:
            (size,) = struct.unpack_from(">I", buffer, 0)
            if len(buffer) < 4 + size:
                return
            self.frames += 1
            if buffer[4:8] == BATCH_MAGIC:
                self.batched += 1
            del buffer[: 4 + size]


@dataclass
class FakeWorker:
    """See the module docstring. Use as a context manager, or call start()/stop()."""

    sources: dict[str, str] = field(default_factory=dict)
    io_handler: IoHandler | None = None
    executor_id: str = "exec-test"
    heartbeat_interval: float = 0.2
    max_inflight: int = 128
    max_runnable: int = 128
    extra_args: tuple[str, ...] = ()
    env: Mapping[str, str] | None = None
    threaded: bool = True
    auto_function_code: bool = True

    def __post_init__(self) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="bxw-"))
        self.socket_path = str(self._dir / "w.sock")
        self.stderr_path = self._dir / "executor.stderr"
        self.proc: subprocess.Popen[bytes] | None = None
        self.sock: socket.socket | None = None
        self._listener: socket.socket | None = None
        self._decoder = FrameDecoder()
        # The outer frames as they came on the wire (a batched frame counts once).
        self.outer_frames = OuterFrames()
        self._send_lock = threading.Lock()
        self._frames: queue.Queue[Frame] = queue.Queue()
        self._backlog: list[Frame] = []
        self.heartbeats: list[Frame] = []
        self._heartbeat_cond = threading.Condition()
        self._reader: threading.Thread | None = None
        self.eof = threading.Event()
        self.reader_error: BaseException | None = None
        self.function_code_requests = 0
        self.io_requests = 0
        self._stopped = False

    # --- sources ---------------------------------------------------------------------

    def add_source(self, source: str) -> str:
        """Make a source fetchable; return its digest."""
        digest = digest_of(source)
        self.sources[digest] = source
        return digest

    # --- lifecycle ---------------------------------------------------------------------

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "blockx.executor",
            "--executor-id",
            self.executor_id,
            "--socket-path",
            self.socket_path,
            "--heartbeat-interval",
            str(self.heartbeat_interval),
            "--executor-max-inflight",
            str(self.max_inflight),
            "--executor-max-runnable",
            str(self.max_runnable),
            *self.extra_args,
        ]

    def start(self, timeout: float = 20.0) -> FakeWorker:
        """Listen, spawn the executor, accept it, and wait for its first heartbeat."""
        # Sources are given by the test keyed by anything; index them by digest.
        self.sources = {
            (k if k.startswith("sha256:") and len(k) == 71 else digest_of(v)): v
            for k, v in self.sources.items()
        }
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.socket_path)
        listener.listen(1)
        self._listener = listener
        env = dict(os.environ if self.env is None else self.env)
        env.setdefault("BLOCKX_LOG_LEVEL", "debug")
        with open(self.stderr_path, "wb") as stderr:
            self.proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                env=env,
                close_fds=True,
            )
        deadline = time.monotonic() + timeout
        listener.settimeout(0.1)
        while True:
            try:
                conn, _ = listener.accept()
                break
            except TimeoutError:
                if self.proc.poll() is not None:
                    raise ExecutorExited(
                        f"executor exited with {self.proc.returncode} before connecting:\n"
                        f"{self.stderr_text()}"
                    ) from None
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"executor did not connect in {timeout}s:\n{self.stderr_text()}"
                    ) from None
        conn.settimeout(None)
        self.sock = conn
        if self.threaded:
            self._reader = threading.Thread(
                target=self._read_loop, name="fake-worker-reader", daemon=True
            )
            self._reader.start()
            self.wait_heartbeat(timeout=max(deadline - time.monotonic(), 1.0))
        else:
            while not self.heartbeats:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"no heartbeat in {timeout}s:\n{self.stderr_text()}")
                self._backlog.extend(self.pump(remaining))
        return self

    def __enter__(self) -> FakeWorker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stderr_text(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_lines(self) -> list[dict[str, Any]]:
        """The executor's JSON log lines (non-JSON lines are skipped)."""
        import json

        lines = []
        for line in self.stderr_text().splitlines():
            with contextlib.suppress(ValueError):
                lines.append(json.loads(line))
        return lines

    def wait_exit(self, timeout: float = 10.0) -> int:
        """Wait for the executor to exit on its own; return its status."""
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"executor still running after {timeout}s:\n{self.stderr_text()}"
            ) from None

    def terminate(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)

    def close_socket(self) -> None:
        """Drop the worker's end of the connection (the executor sees EOF)."""
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)
            self.sock.close()
            self.sock = None

    def stop(self) -> None:
        """Kill and reap the executor, close everything, assert no process is left."""
        if self._stopped:
            return
        self._stopped = True
        pid = None
        if self.proc is not None:
            pid = self.proc.pid
            if self.proc.poll() is None:
                self.proc.kill()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL does not fail
                raise AssertionError(f"executor {pid} survived SIGKILL") from None
        self.close_socket()
        if self._listener is not None:
            self._listener.close()
        if self._reader is not None:
            self._reader.join(5)
        shutil.rmtree(self._dir, ignore_errors=True)
        if pid is not None:
            assert process_is_gone(pid), f"executor {pid} is still there after stop()"

    # --- sending ---------------------------------------------------------------------------

    def send(self, envelope: dict[str, Any], sidecar: bytes | None = None) -> None:
        self.send_bytes(encode_frame(envelope, sidecar))

    def send_many(self, frames: Iterable[tuple[dict[str, Any], bytes | None]]) -> None:
        """Several frames in one write."""
        self.send_bytes(b"".join(encode_frame(env, side) for env, side in frames))

    def send_bytes(self, data: bytes) -> None:
        assert self.sock is not None, "connection closed"
        with self._send_lock:
            if not self.threaded:
                # pump() leaves a short timeout on the socket; a big write needs longer.
                # (The executor's reader always drains, so this cannot deadlock.)
                self.sock.settimeout(60.0)
            self.sock.sendall(data)

    def execute_call_envelope(
        self,
        call_id: str,
        *,
        source: str | None = None,
        function_id: str = "fn",
        digest: str | None = None,
        args: Any = None,
        task_id: str = "task-1",
        attempt_seq: int = 1,
        call_budget_ms: int = 0,
        parent_call_id: str | None = None,
        entry_selector: str = "",
        ancestry: list[str] | None = None,
        call_key: str | None = None,
        debug: bool = False,
        register_source: bool = True,
    ) -> dict[str, Any]:
        if source is not None:
            digest = digest_of(source)
            if register_source:
                self.sources[digest] = source
        assert digest is not None, "give a source or a digest"
        return {
            keys.F_MESSAGE_TYPE: keys.MT_EXECUTE_CALL,
            keys.F_CALL_ID: call_id,
            keys.F_SENT_AT_MS: int(time.time() * 1000),
            keys.F_PAYLOAD: {
                keys.FP_TASK_ID: task_id,
                keys.FP_FUNCTION_ID: function_id,
                keys.FP_FUNCTION_CODE_DIGEST: digest,
                keys.FP_ENTRY_SELECTOR: entry_selector,
                keys.FP_ARGS: args,
                keys.FP_PARENT_CALL_ID: parent_call_id,
                keys.FP_CALL_KEY: call_key or f"{function_id}:{call_id}",
                keys.FP_ANCESTRY: ancestry or [],
                keys.FP_CALL_BUDGET_MS: call_budget_ms,
                keys.FP_ATTEMPT_SEQ: attempt_seq,
                keys.FP_AUDIT: None,
                keys.FP_DEBUG: debug,
            },
        }

    def execute_call(self, call_id: str, **kwargs: Any) -> None:
        self.send(self.execute_call_envelope(call_id, **kwargs))

    def resume_call(
        self,
        call_id: str,
        request_id: str,
        resume_kind: str,
        *,
        result: Any = None,
        error: dict[str, Any] | None = None,
        budget_used_ms: int = 0,
        sidecar: bytes | None = None,
    ) -> None:
        self.send(
            self.resume_envelope(
                call_id,
                request_id,
                resume_kind,
                result=result,
                error=error,
                budget_used_ms=budget_used_ms,
            ),
            sidecar,
        )

    @staticmethod
    def resume_envelope(
        call_id: str,
        request_id: str,
        resume_kind: str,
        *,
        result: Any = None,
        error: dict[str, Any] | None = None,
        budget_used_ms: int = 0,
        immutable: bool = False,
    ) -> dict[str, Any]:
        payload: dict[str, Any] = {
            keys.FP_RESUME_KIND: resume_kind,
            keys.FP_BUDGET_USED_MS: budget_used_ms,
        }
        if error is not None:
            payload[keys.FP_ERROR] = error
        else:
            payload[keys.FP_RESULT] = result
        if immutable:
            payload[keys.FP_IMMUTABLE] = True
        return {
            keys.F_MESSAGE_TYPE: keys.MT_RESUME_CALL,
            keys.F_CALL_ID: call_id,
            keys.F_REQUEST_ID: request_id,
            keys.F_PAYLOAD: payload,
        }

    def cancel_call(
        self, call_id: str, *, reason: str = "worker_shutdown", attempt_seq: int = 1
    ) -> None:
        self.send(
            {
                keys.F_MESSAGE_TYPE: keys.MT_CANCEL_CALL,
                keys.F_CALL_ID: call_id,
                keys.F_PAYLOAD: {keys.FP_REASON: reason, keys.FP_ATTEMPT_SEQ: attempt_seq},
            }
        )

    # --- receiving (threaded) ------------------------------------------------------------------

    def next_frame(self, timeout: float = 10.0) -> Frame:
        """The next frame that is not a heartbeat and was not answered automatically."""
        try:
            return self._frames.get(timeout=timeout)
        except queue.Empty:
            pass
        if self.reader_error is not None:
            raise AssertionError(f"the fake worker's reader failed: {self.reader_error!r}")
        if self.proc is not None and self.proc.poll() is not None:
            raise ExecutorExited(
                f"executor exited with {self.proc.returncode}:\n{self.stderr_text()[-4000:]}"
            )
        raise AssertionError(f"no frame within {timeout}s:\n{self.stderr_text()[-4000:]}")

    def next_frames(self, count: int, timeout: float = 10.0) -> list[Frame]:
        deadline = time.monotonic() + timeout
        return [self.next_frame(max(deadline - time.monotonic(), 0.001)) for _ in range(count)]

    def wait_terminal(self, call_id: str, timeout: float = 10.0) -> Frame:
        """Skip frames until the terminal frame of ``call_id``; the skipped ones are kept."""
        return self.collect_terminals([call_id], timeout)[call_id]

    def collect_terminals(self, call_ids: Iterable[str], timeout: float = 20.0) -> dict[str, Frame]:
        wanted = set(call_ids)
        found: dict[str, Frame] = {}
        skipped: list[Frame] = []
        deadline = time.monotonic() + timeout
        try:
            while wanted - found.keys():
                frame = self.next_frame(max(deadline - time.monotonic(), 0.001))
                call_id = frame.envelope.get(keys.F_CALL_ID)
                if frame.message_type in TERMINAL_TYPES and call_id in wanted:
                    assert call_id not in found, f"two terminal frames for {call_id}"
                    found[call_id] = frame
                else:
                    skipped.append(frame)
        finally:
            for frame in skipped:
                self._frames.put(frame)
        return found

    def drain_frames(self) -> list[Frame]:
        """Every queued frame, without waiting."""
        frames = []
        while True:
            try:
                frames.append(self._frames.get_nowait())
            except queue.Empty:
                return frames

    def wait_heartbeat(
        self, predicate: Callable[[Frame], bool] | None = None, timeout: float = 10.0
    ) -> Frame:
        """The first heartbeat (from the start) satisfying ``predicate``."""
        deadline = time.monotonic() + timeout
        with self._heartbeat_cond:
            while True:
                for frame in self.heartbeats:
                    if predicate is None or predicate(frame):
                        return frame
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(
                        f"no matching heartbeat in {timeout}s:\n{self.stderr_text()[-4000:]}"
                    )
                if self.eof.is_set():
                    raise ExecutorExited(f"connection ended:\n{self.stderr_text()[-4000:]}")
                self._heartbeat_cond.wait(min(remaining, 0.1))

    def _read_loop(self) -> None:
        sock = self.sock
        assert sock is not None
        try:
            while True:
                try:
                    data = sock.recv(1 << 18)
                except OSError:
                    return
                if not data:
                    return
                self.outer_frames.feed(data)
                for frame in self._decoder.feed(data):
                    self._dispatch(frame)
        except BaseException as exc:  # surfaced by tests through reader_error
            self.reader_error = exc
        finally:
            self.eof.set()
            with self._heartbeat_cond:
                self._heartbeat_cond.notify_all()

    def _dispatch(self, frame: Frame) -> None:
        message_type = frame.message_type
        if message_type == keys.MT_HEARTBEAT:
            with self._heartbeat_cond:
                self.heartbeats.append(frame)
                self._heartbeat_cond.notify_all()
            return
        if message_type == keys.MT_CALL_WAITING:
            payload = frame.envelope[keys.F_PAYLOAD]
            wait_kind = payload.get(keys.FP_WAIT_KIND)
            if wait_kind == keys.WAIT_FUNCTION_CODE and self.auto_function_code:
                self.function_code_requests += 1
                self._answer_function_code(frame)
                return
            if wait_kind == keys.WAIT_IO and self.io_handler is not None:
                self.io_requests += 1
                reply = self.io_handler(frame)
                if reply is not None:
                    self._answer_io(frame, reply)
                    return
        self._frames.put(frame)

    def _answer_function_code(self, frame: Frame) -> None:
        envelope = frame.envelope
        digest = envelope[keys.F_PAYLOAD].get(keys.FP_FUNCTION_CODE_DIGEST)
        source = self.sources.get(digest)
        if source is None:
            error = {
                "kind": "function_code_fetch_failed",
                "message": f"no source for {digest}",
                "retryable": False,
            }
            reply = self.resume_envelope(
                envelope[keys.F_CALL_ID],
                envelope[keys.F_REQUEST_ID],
                keys.WAIT_FUNCTION_CODE,
                error=error,
            )
        else:
            reply = self.resume_envelope(
                envelope[keys.F_CALL_ID],
                envelope[keys.F_REQUEST_ID],
                keys.WAIT_FUNCTION_CODE,
                result={keys.FP_SOURCE: source, keys.FP_FUNCTION_CODE_DIGEST: digest},
            )
        self.send(reply)

    def _answer_io(self, frame: Frame, reply: Any) -> None:
        envelope = frame.envelope
        if not isinstance(reply, IoReply):
            reply = IoReply(result=reply)
        self.send(
            self.resume_envelope(
                envelope[keys.F_CALL_ID],
                envelope[keys.F_REQUEST_ID],
                keys.WAIT_IO,
                result=reply.result,
                error=reply.error,
                budget_used_ms=reply.budget_used_ms,
                immutable=reply.immutable,
            ),
            reply.sidecar,
        )

    # --- receiving (unthreaded) ------------------------------------------------------------------

    def pump(self, timeout: float | None = 10.0) -> list[Frame]:
        """One ``recv``: the frames it completed, heartbeats recorded and removed.

        Returns frames buffered during :meth:`start` first. Raises
        :class:`ExecutorExited` on EOF.
        """
        if self._backlog:
            frames, self._backlog = self._backlog, []
            return frames
        sock = self.sock
        assert sock is not None
        sock.settimeout(timeout)
        try:
            data = sock.recv(1 << 20)
        except TimeoutError:
            return []
        if not data:
            raise ExecutorExited(f"connection ended:\n{self.stderr_text()[-4000:]}")
        try:
            frames = self._decoder.feed(data)
        except ProtocolError as exc:  # pragma: no cover - the executor never sends one
            raise AssertionError(f"executor sent a malformed frame: {exc}") from exc
        if frames and any(f.envelope[keys.F_MESSAGE_TYPE] == keys.MT_HEARTBEAT for f in frames):
            kept = []
            for frame in frames:
                if frame.envelope[keys.F_MESSAGE_TYPE] == keys.MT_HEARTBEAT:
                    self.heartbeats.append(frame)
                else:
                    kept.append(frame)
            return kept
        return frames
