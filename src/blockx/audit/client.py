"""AuditDaemonClient: audit in a child process (``python -m blockx.audit``), from asyncio.

Theory of operation
-------------------
The worker audits untrusted source before a function's first dispatch. Parsing
hostile input in the worker itself risks the worker (a parser crash, a
pathological input eating memory), so this client runs the auditor in a child
process and speaks the daemon's frames (:mod:`blockx.audit.daemon`) over its
stdin/stdout:

* :meth:`AuditDaemonClient.audit` sends one request and awaits its response;
  any number of audits may be in flight (responses are matched by
  ``requestId``). Verdicts are cached in an LRU keyed by
  ``(verdictDigest, functionId)`` — the digest is computed locally, so a
  cache hit never touches the daemon.
* One reader task owns the child's stdout and resolves the pending futures.
  If the child exits, every pending audit fails with :class:`AuditDaemonError`
  (``kind="daemon_exited"``) and the next audit starts a new child
  (``restarts`` counts them). An audit that gets no answer within
  ``request_timeout_s`` kills the child (``kind="timeout"``).
* :meth:`AuditDaemonClient.close` closes the child's stdin (the daemon exits
  on end of input) and waits for it, killing it after ``close_timeout_s``.

Use it from one event loop. It is an async context manager.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import sys
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, Final

from blockx.wire.errors import ProtocolError
from blockx.wire.frames import FrameDecoder, encode_frame

from .daemon import MT_AUDIT_REQUEST, MT_AUDIT_VERDICT
from .tables import POLICY_NAME
from .verdict import Verdict, compute_verdict_digest

__all__ = ["AuditDaemonClient", "AuditDaemonError"]

_log = logging.getLogger("blockx.audit")

DEFAULT_COMMAND: Final = (sys.executable, "-m", "blockx.audit")


class AuditDaemonError(Exception):
    """The daemon could not answer: ``kind`` is ``daemon_exited``, ``timeout``,
    ``protocol_error`` or the daemon's own error kind (``bad_request``, …)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


class AuditDaemonClient:
    """An asyncio client of the audit daemon (see the module doc).

    ``command`` starts the daemon (default: this Python, ``-m blockx.audit``);
    ``env`` replaces its environment when given.
    """

    def __init__(
        self,
        *,
        command: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        cache_entries: int = 1024,
        request_timeout_s: float = 30.0,
        close_timeout_s: float = 5.0,
    ) -> None:
        self.command = tuple(command) if command is not None else DEFAULT_COMMAND
        self.env = dict(env) if env is not None else None
        self.cache_entries = cache_entries
        self.request_timeout_s = request_timeout_s
        self.close_timeout_s = close_timeout_s
        self.restarts = 0
        self.cache_hits = 0
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._ids = itertools.count(1)
        self._write_lock = asyncio.Lock()
        self._start_lock = asyncio.Lock()
        self._cache: OrderedDict[tuple[str, str], Verdict] = OrderedDict()
        self._started_once = False
        self._closed = False

    def __repr__(self) -> str:
        return (
            f"AuditDaemonClient(pid={self.pid}, pending={len(self._pending)}, "
            f"cached={len(self._cache)}, restarts={self.restarts})"
        )

    @property
    def pid(self) -> int | None:
        """The running daemon's process id, or None."""
        proc = self._proc
        return proc.pid if proc is not None and proc.returncode is None else None

    async def __aenter__(self) -> AuditDaemonClient:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # --- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        """Start the daemon unless it is running (audits start it on demand too)."""
        if self._closed:
            raise RuntimeError("AuditDaemonClient is closed")
        async with self._start_lock:
            if self._proc is not None and self._proc.returncode is None:
                return
            if self._started_once:
                self.restarts += 1
            self._started_once = True
            proc = await asyncio.create_subprocess_exec(
                *self.command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                env=self.env,
            )
            self._proc = proc
            self._reader = asyncio.create_task(self._read_responses(proc), name="audit-reader")

    async def close(self) -> None:
        """Stop the daemon (end of input, then a kill after ``close_timeout_s``)."""
        self._closed = True
        proc, reader = self._proc, self._reader
        self._proc = None
        if proc is not None:
            if proc.stdin is not None and not proc.stdin.is_closing():
                proc.stdin.close()
            try:
                await asyncio.wait_for(proc.wait(), self.close_timeout_s)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        if reader is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await reader
        self._fail_pending(AuditDaemonError("daemon_exited", "client closed"))

    def _fail_pending(self, error: AuditDaemonError) -> None:
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(error)

    async def _read_responses(self, proc: asyncio.subprocess.Process) -> None:
        decoder = FrameDecoder()
        stdout = proc.stdout
        assert stdout is not None
        try:
            while True:
                data = await stdout.read(1 << 16)
                if not data:
                    break
                for frame in decoder.feed(data):
                    self._deliver(frame.envelope)
        except ProtocolError as exc:
            _log.error("audit daemon sent a bad frame: %s; stopping it", exc)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        code = await proc.wait()
        if self._proc is proc:
            self._proc = None
        self._fail_pending(AuditDaemonError("daemon_exited", f"audit daemon exited with {code}"))

    def _deliver(self, envelope: dict[str, Any]) -> None:
        request_id = envelope.get("requestId")
        future = self._pending.pop(request_id, None) if isinstance(request_id, int) else None
        if future is None:
            _log.warning("audit daemon answered an unknown request: %r", envelope)
            return
        if not future.done():
            future.set_result(envelope)

    # --- auditing --------------------------------------------------------------------

    async def audit(self, source: str, function_id: str) -> Verdict:
        """The verdict for ``source`` as ``function_id``; raises :class:`AuditDaemonError`."""
        if not isinstance(source, str) or not isinstance(function_id, str):
            raise TypeError("source and function_id must be str")
        key = (compute_verdict_digest(source), function_id)
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            self.cache_hits += 1
            return cached
        await self.start()
        proc = self._proc
        assert proc is not None and proc.stdin is not None
        request_id = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        frame = encode_frame(
            {
                "messageType": MT_AUDIT_REQUEST,
                "requestId": request_id,
                "functionId": function_id,
                "source": source,
                "policy": POLICY_NAME,
            }
        )
        try:
            async with self._write_lock:
                proc.stdin.write(frame)
                await proc.stdin.drain()
        except (ConnectionError, RuntimeError) as exc:
            self._pending.pop(request_id, None)
            raise AuditDaemonError("daemon_exited", f"cannot write to the daemon: {exc}") from exc
        try:
            response = await asyncio.wait_for(future, self.request_timeout_s)
        except TimeoutError:
            self._pending.pop(request_id, None)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()  # a wedged daemon; the next audit starts a new one
            raise AuditDaemonError(
                "timeout", f"no verdict within {self.request_timeout_s}s"
            ) from None
        if response.get("messageType") != MT_AUDIT_VERDICT:
            error = response.get("error") or {}
            raise AuditDaemonError(
                str(error.get("kind", "protocol_error")),
                str(error.get("message", f"unexpected response {response!r}")),
            )
        verdict = Verdict.from_wire(response, function_id)
        self._cache[key] = verdict
        if self.cache_entries:
            while len(self._cache) > self.cache_entries:
                self._cache.popitem(last=False)
        return verdict
