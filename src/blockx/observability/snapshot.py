"""Plain-dict snapshots of a running worker and of its IO, read on demand.

Theory of operation
-------------------
Nothing here counts anything: every number is read, when a snapshot is taken,
from the counters kept where things happen (docs/observability.md, "Metrics"):

=====================  ================================================================
calls, retries,        the dispatcher core's ``DispatcherStats`` (``core.stats``): calls
failures, attempts,    ended by outcome (sub-calls apart), final failures and retries by
call cache             error kind, the attempt-duration histogram, call-cache and
                       singleflight hits
rows, wedge kills      the dispatch actor's ``OrchestratorStats``
in flight, suspended,  the adapter's executor states: reservations (calls holding an
executors              executor context) and each executor's latest heartbeat (RSS, CPU,
                       contexts by state, so the suspended calls by what they wait for)
executor states,       the pool's slots
restarts
IO                     the ``IOStats`` of the IO subsystems the worker observes
                       (``Worker.observe_io``): every task scope rolls up into them
tasks                  ``Worker.task_counts``
=====================  ================================================================

A snapshot is cheap (it walks the executors and the IO operations, never a
call) and takes no await: take it on the worker's event loop thread, where the
counters are written, so that it reads a consistent state. Before the worker
has started its parts read as zeros; once it closed, as they were left.

Who calls it: :mod:`blockx.observability.metrics` (the Prometheus collector, at each
scrape) and the dashboard of ``blockx serve``. The keys are an interface: add,
never rename.
"""

from __future__ import annotations

import math
from typing import Any, Final

from blockx.wire import keys
from blockx.worker.core.state import ATTEMPT_BUCKETS_MS

__all__ = [
    "CALL_KINDS",
    "CONTEXT_STATES",
    "ERROR_KINDS",
    "EXECUTOR_STATES",
    "OUTCOMES",
    "TASK_STATES",
    "WAIT_KINDS",
    "io_snapshot",
    "worker_snapshot",
]

OUTCOMES: Final = ("succeeded", "failed", "cancelled")
CALL_KINDS: Final = ("root", "subcall")
#: What a suspended call waits for, by the executor's context state that says so.
WAIT_STATES: Final = {
    "WAITING_IO": "io",
    "WAITING_SUBCALL": "subcall",
    "WAITING_SLEEP": "sleep",
    "WAITING_FUNCTION_CODE": "function_code",
}
WAIT_KINDS: Final = tuple(WAIT_STATES.values())
#: The executor's context states (``Heartbeat.callStateCounts``; DONE is never counted).
CONTEXT_STATES: Final = ("RUNNABLE", "RUNNING", *WAIT_STATES)
#: The pool's slot states, as the metrics name them.
EXECUTOR_STATES: Final = ("running", "waiting", "backoff", "stopped")
TASK_STATES: Final = ("queued", "running", "succeeded", "failed", "cancelled")
#: Every error kind of docs/protocol.md (``blockx.wire.keys.ERR_*``), sorted.
ERROR_KINDS: Final = tuple(
    sorted({value for name, value in vars(keys).items() if name.startswith("ERR_")})
)


def _part(worker: Any, name: str) -> Any:
    """``worker.<name>`` (orchestrator, pool, adapter), None before the worker started.
    A closed worker's parts are still read: their counters never go back (a scrape
    while the worker closes must not look like a counter reset)."""
    try:
        return getattr(worker, name)
    except RuntimeError:  # not started
        return None


def _executors(worker: Any) -> list[dict[str, Any]]:
    pool = _part(worker, "pool")
    adapter = _part(worker, "adapter")
    states: Any = adapter.executor_states() if adapter is not None else {}
    now = adapter.now() if adapter is not None else 0.0
    slots = {info.executor_id: info for info in pool.slots()} if pool is not None else {}
    out: list[dict[str, Any]] = []
    for executor_id in sorted(set(slots) | set(states)):
        info = slots.get(executor_id)
        state = states.get(executor_id)
        heartbeat = None if state is None else state.heartbeat
        attached = state is not None and state.connection is not None
        contexts = dict.fromkeys(CONTEXT_STATES, 0)
        if heartbeat is not None and attached:
            for name, count in heartbeat.callStateCounts.items():
                if name in contexts and type(count) is int:
                    contexts[name] = count
        out.append(
            {
                "executor": executor_id,
                "pid": None if info is None else info.pid,
                "state": "stopped" if info is None else info.state.value.lower(),
                "rss_bytes": heartbeat.memoryBytes if heartbeat is not None else None,
                "cpu_seconds": (
                    heartbeat.executorCpuSecondsTotal if heartbeat is not None else None
                ),
                "contexts": contexts,
                "inflight": len(state.reservations) if attached and state is not None else 0,
                "suspended": sum(contexts[name] for name in WAIT_STATES),
                "restarts": 0 if info is None else info.restarts_total,
                "heartbeat_age_s": (
                    max(now - state.heartbeat_at, 0.0)
                    if state is not None and heartbeat is not None
                    else None
                ),
                "attached": attached,
            }
        )
    return out


def _attempts(stats: Any) -> dict[str, Any]:
    """The attempt-duration histogram: cumulative buckets in seconds, sum, count."""
    counts, total_ms = stats.attempt_histogram() if stats is not None else ([], 0)
    cumulative: list[tuple[float, int]] = []
    seen = 0
    for index, bound_ms in enumerate(ATTEMPT_BUCKETS_MS):
        seen += counts[index] if counts else 0
        cumulative.append((bound_ms / 1000.0, seen))
    return {
        "buckets": cumulative,
        "count": sum(counts),
        "sum_s": total_ms / 1000.0,
    }


def worker_snapshot(worker: Any) -> dict[str, Any]:
    """The worker's counters as a JSON-ready dict (docs/observability.md); no awaits.

    ``worker`` is a :class:`~blockx.worker.app.Worker`. Keys: ``calls``, ``cache``,
    ``executors``, ``pool``, ``rows`` (the shared design's), and ``tasks``,
    ``attempts`` (the attempt-duration histogram) and ``io`` (:func:`io_snapshot` of
    every observed IO subsystem).
    """
    orchestrator = _part(worker, "orchestrator")
    core_stats = orchestrator.core.stats if orchestrator is not None else None
    actor_stats = orchestrator.stats if orchestrator is not None else None

    def stat(name: str) -> int:
        return int(getattr(core_stats, name)) if core_stats is not None else 0

    subcall = {
        "succeeded": stat("subcalls_completed"),
        "failed": stat("subcalls_failed"),
        "cancelled": stat("subcalls_cancelled"),
    }
    root = {
        "succeeded": stat("calls_completed") - subcall["succeeded"],
        "failed": stat("calls_failed") - subcall["failed"],
        "cancelled": stat("calls_cancelled") - subcall["cancelled"],
    }
    executors = _executors(worker)
    suspended = dict.fromkeys(WAIT_KINDS, 0)
    for executor in executors:
        for state, wait in WAIT_STATES.items():
            suspended[wait] += executor["contexts"][state]
    io = [op for system in getattr(worker, "io_subsystems", ()) for op in io_snapshot(system)]
    io_hits = sum(op["cache_hits"] + op["local_hits"] for op in io)
    io_joins = sum(op["joins"] for op in io)
    pool = _part(worker, "pool")
    return {
        "calls": {
            **root,
            "by_kind": {"root": root, "subcall": subcall},
            "inflight": sum(executor["inflight"] for executor in executors),
            "suspended": suspended,
            "retries": dict(core_stats.retries_by_kind) if core_stats is not None else {},
            "failures": dict(core_stats.failures_by_kind) if core_stats is not None else {},
        },
        "cache": {
            "call": {"hits": stat("cache_hits"), "joins": stat("singleflight_hits")},
            "io": {"hits": io_hits, "joins": io_joins},
        },
        "executors": executors,
        "pool": {
            "restarts": (
                sum(info.restarts_total for info in pool.slots()) if pool is not None else 0
            ),
            "wedge_kills": actor_stats.executors_killed if actor_stats is not None else 0,
        },
        "rows": actor_stats.rows if actor_stats is not None else 0,
        "tasks": worker.task_counts() if hasattr(worker, "task_counts") else {},
        "attempts": _attempts(core_stats),
        "io": io,
    }


def io_snapshot(io: Any) -> list[dict[str, Any]]:
    """One dict per (backend, operation) an IO subsystem (or anything with an
    ``IOStats`` ``stats``) has served, sorted: ``backend``, ``operation``, ``requests``,
    ``failed`` (backend errors and refusals), ``cache_hits``, ``joins``, ``abandoned``,
    ``local_hits`` (answered inside the executors), ``backend_calls``, ``p50_ms``,
    ``p99_ms``, ``sum_s`` (the backend calls' latencies added up) and ``buckets``
    (``[(upper bound in seconds, cumulative count), ...]`` at each octave from 20 µs,
    then ``(math.inf, backend_calls)``)."""
    stats = getattr(io, "stats", None)
    if stats is None:
        return []
    return [
        {
            "backend": op.backend,
            "operation": op.operation,
            "requests": op.requests,
            "failed": op.errors,
            "rejected": op.rejected,
            "cache_hits": op.cache_hits,
            "joins": op.singleflight_joins,
            "abandoned": op.abandoned,
            "local_hits": op.local_hits,
            "backend_calls": op.backend_calls,
            "p50_ms": op.percentile_ms(0.50),
            "p99_ms": op.percentile_ms(0.99),
            "sum_s": op.total_ms / 1000.0,
            "buckets": [*op.octave_buckets(), (math.inf, op.backend_calls)],
        }
        for op in stats
    ]
