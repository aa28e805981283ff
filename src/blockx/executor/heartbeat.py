"""Heartbeats: the payload (:func:`heartbeat_payload`) and the thread that sends one
every ``--heartbeat-interval`` seconds (:class:`HeartbeatThread`).

Theory of operation
-------------------
:func:`heartbeat_payload` turns a snapshot of the runtime (its resident
contexts, counters and metrics) into the ``Heartbeat`` payload of docs/protocol.md.
It only reads: ``ExecutorRuntime.build_heartbeat`` calls it from the
heartbeat thread while the scheduler runs, with a list copy of the contexts
table taken under the GIL.

:class:`HeartbeatThread` sends the first heartbeat as soon as it starts: on
the worker side the first valid ``Heartbeat`` attaches the connection to this
``executorId`` (there is no registration message), so nothing may delay it.
Later ones follow every ``interval`` seconds, measured from the previous send.

The payload comes from ``build_heartbeat()`` (``ExecutorRuntime.build_heartbeat``:
counts, metrics, ``heartbeatSeq``). It runs on this thread while the main thread
schedules calls, so a build that races the scheduler may raise; such a tick is
logged and retried shortly after, never fatal. The thread stops when
:meth:`HeartbeatThread.stop` is called or the session is no longer connected
(``send_message`` raising :class:`ConnectionError`). It never switches
greenlets and never touches the runtime beyond ``build_heartbeat``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol

from blockx.wire import FEATURE_BATCH, keys

from .context import ExecContext, ExecState

__all__ = ["HeartbeatThread", "MetricsLike", "heartbeat_payload"]

#: The protocol features this executor announces (written as a JSON list).
_FEATURES: Final = (FEATURE_BATCH,)

_log = logging.getLogger("blockx.executor.heartbeat")

#: Delay before retrying a heartbeat whose build or encode failed.
_RETRY_DELAY_S = 0.05


class MetricsLike(Protocol):
    """Process metrics for heartbeats (``process_metrics.ProcessMetricsSampler``)."""

    def sample_memory_bytes(self) -> int: ...

    def sample_cpu(self) -> tuple[float, float]:
        """``(utilization 0..1, cpu_seconds_total)``."""
        ...


def heartbeat_payload(
    *,
    executor_id: str,
    heartbeat_seq: int,
    contexts: Sequence[ExecContext],
    max_inflight: int,
    metrics: MetricsLike | None,
    process_instance_id: str,
    last_scheduler_active_ms: int,
    running_call_id: str | None,
    sent_at_ms: int,
    running_for_ms: int = 0,
    running_call_budget_ms: int = 0,
) -> dict[str, Any]:
    """The ``Heartbeat`` payload (docs/protocol.md) for a snapshot of resident ``contexts``.

    ``runnableCount`` counts contexts queued to run (admitted, resumed or woken);
    ``availableContexts`` is ``max(0, max_inflight - inflight)``, or 1<<30 when
    ``max_inflight`` is 0 (unlimited). Without ``metrics`` the samples are 0.
    ``running_for_ms``: how long ``running_call_id`` has run since the scheduler
    last switched into it (0 when none runs); ``running_call_budget_ms``: the
    budget it had left then (0 = unlimited) — the worker's wedge backstop judges
    the running call by these two (docs/protocol.md "Heartbeat").
    """
    counts = dict.fromkeys(keys.EXEC_STATES, 0)
    runnable = 0
    for ctx in contexts:
        state = ctx.state
        if state is ExecState.DONE:
            continue
        counts[state.value] += 1
        if ctx.queued or state is ExecState.RUNNABLE:
            runnable += 1
    inflight = len(contexts)
    if max_inflight:
        available = max(0, max_inflight - inflight)
    else:
        available = keys.UNLIMITED_CONTEXTS
    memory = 0
    utilization, cpu_total = 0.0, 0.0
    if metrics is not None:
        memory = metrics.sample_memory_bytes()
        utilization, cpu_total = metrics.sample_cpu()
    return {
        keys.FP_EXECUTOR_ID: executor_id,
        keys.FP_HEARTBEAT_SEQ: heartbeat_seq,
        keys.FP_RUNNABLE_COUNT: runnable,
        keys.FP_INFLIGHT_COUNT: inflight,
        keys.FP_AVAILABLE_CONTEXTS: available,
        keys.FP_MEMORY_BYTES: memory,
        keys.FP_EXECUTOR_CPU_UTILIZATION: utilization,
        keys.FP_EXECUTOR_CPU_SECONDS_TOTAL: cpu_total,
        keys.FP_EXECUTOR_PROCESS_INSTANCE_ID: process_instance_id,
        keys.FP_LAST_SCHEDULER_ACTIVE_AT_MS: last_scheduler_active_ms,
        keys.FP_RUNNING_CALL_ID: running_call_id,
        keys.FP_RUNNING_FOR_MS: running_for_ms,
        keys.FP_RUNNING_CALL_BUDGET_MS: running_call_budget_ms,
        keys.FP_CALL_STATE_COUNTS: counts,
        keys.FP_SENT_AT_MS: sent_at_ms,
        # Every heartbeat asks for batched frames (docs/protocol.md "Batched frames"): the
        # reader decodes them always; the worker's ack carrying it turns batching on here.
        keys.FP_FEATURES: _FEATURES,
    }


class _Session(Protocol):
    def is_connected(self) -> bool: ...

    def send_message(self, envelope: dict[str, Any], sidecar: bytes | None = None) -> None: ...


class HeartbeatThread:
    """Sends heartbeats on a daemon thread until stopped or disconnected."""

    def __init__(
        self,
        session: _Session,
        build_heartbeat: Callable[[], dict[str, Any]],
        *,
        executor_id: str,
        interval_s: float = 1.0,
        wall_clock_ms: Callable[[], int] | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"heartbeat interval must be positive, got {interval_s}")
        self._session = session
        self._build_heartbeat = build_heartbeat
        self._executor_id = executor_id
        self._interval_s = interval_s
        self._wall_clock_ms = wall_clock_ms or (lambda: time.time_ns() // 1_000_000)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.sent = 0
        self.failures = 0

    def __repr__(self) -> str:
        running = self._thread is not None and self._thread.is_alive()
        return (
            f"HeartbeatThread({self._executor_id!r}, every {self._interval_s:g}s, "
            f"sent={self.sent}, {'running' if running else 'stopped'})"
        )

    def start(self) -> None:
        """Start the thread; the first heartbeat is sent immediately."""
        if self._thread is not None:
            raise RuntimeError("heartbeat thread already started")
        self._thread = threading.Thread(target=self._run, name="blockx-heartbeat", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 1.0) -> None:
        """Stop sending and join the thread (for up to ``timeout`` seconds). Idempotent."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def send_one(self) -> bool:
        """Build and send one heartbeat now; False if that failed (logged)."""
        try:
            payload = self._build_heartbeat()
            now_ms = self._wall_clock_ms()
            payload.setdefault(keys.FP_SENT_AT_MS, now_ms)
            envelope = {
                keys.F_MESSAGE_TYPE: keys.MT_HEARTBEAT,
                keys.F_EXECUTOR_ID: self._executor_id,
                keys.F_SENT_AT_MS: now_ms,
                keys.F_PAYLOAD: payload,
            }
            self._session.send_message(envelope)
        except ConnectionError:
            raise
        except Exception as exc:  # EncodeError, or a build that raced the scheduler
            self.failures += 1
            _log.warning("heartbeat not sent: %s", exc, exc_info=self.failures == 1)
            return False
        self.sent += 1
        return True

    def _run(self) -> None:
        stop = self._stop
        while not stop.is_set() and self._session.is_connected():
            try:
                ok = self.send_one()
            except ConnectionError:
                break
            stop.wait(self._interval_s if ok else min(_RETRY_DELAY_S, self._interval_s))
        _log.debug("heartbeat thread stopped after %d heartbeats", self.sent)
