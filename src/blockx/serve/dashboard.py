"""The live dashboard of ``blockx serve``: ``GET /``, its JSON state, and its history.

Theory of operation
-------------------
The page (``GET /``) is static: plain HTML, CSS and JavaScript shipped in
``blockx/serve/dashboard/`` with the vendored uPlot chart library (MIT, version in
:data:`UPLOT_VERSION`); no build step. The page and its assets hold no data, so they
are served without the bearer token (:data:`PUBLIC_PATHS`); everything the page shows
comes from ``GET /v1/dashboard``, which needs the token like every other API route.
The script takes the token from ``/?token=...`` once, keeps it in ``sessionStorage``
(the address bar is cleaned) and sends it as ``Authorization: Bearer``; without one,
a 401 makes the page ask for it (``docs/observability.md``). The page is
served with a strict Content-Security-Policy (:data:`CONTENT_SECURITY_POLICY`) and
sets whatever a task carries as text, never as HTML.

A poll (:func:`dashboard_state`) reads from the store only what it shows: the running
and queued tasks, the :data:`FINISHED_SHOWN` newest finished ones, the counts by state.
A running task's progress adds to its stored ``done`` the calls that ended and wait
for their batch to be stored (:meth:`Dashboard.unstored`: the dispatcher core's count
of the run's ended calls beyond the run's settled batches).

Live updates are polling, once a second: ``fetch`` can send the bearer header where
``EventSource`` (server-sent events) cannot, the state is a few kilobytes, and a poll
simply resumes after a server restart. Nothing is computed for a client that does not
poll except the history below.

The history (:class:`DashboardHistory`) is what a single poll cannot give: throughput
over time and IO latency over time. A sampler task reads cumulative counters once a
second (:class:`Counters`: calls settled, rows, IO latency histograms per backend,
executor CPU seconds) and :meth:`DashboardHistory.observe` turns two consecutive
samples into rates (calls/s, rows/s), per-second IO latency percentiles (from the
difference of the two histograms: the latency of the calls of *that* second) and CPU
percentages. It keeps :data:`HISTORY_POINTS` seconds. ``observe`` is pure (the time is
an argument): the tests feed it made-up counters.

The counters come from :mod:`blockx.observability.snapshot` (``worker_snapshot``,
``io_snapshot``: the same views the Prometheus collector reads).
Calls settled are the snapshot's call outcomes (``succeeded + failed + cancelled``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson
from aiohttp import web

from blockx.observability.snapshot import io_snapshot, worker_snapshot
from blockx.serve.runner import public_fields

__all__ = [
    "CONTENT_SECURITY_POLICY",
    "FINISHED_SHOWN",
    "HISTORY_POINTS",
    "PUBLIC_PATHS",
    "UPLOT_VERSION",
    "Counters",
    "Dashboard",
    "DashboardHistory",
    "Sample",
    "add_dashboard_routes",
    "dashboard_state",
]

_log = logging.getLogger("blockx.serve.dashboard")

#: The vendored chart library (``dashboard/vendor/``; MIT, ``uPlot.LICENSE``).
UPLOT_VERSION: Final = "1.6.32"
#: Seconds of history kept (one point a second).
HISTORY_POINTS: Final = 300
SAMPLE_INTERVAL_S: Final = 1.0
#: Finished tasks shown (the newest, by creation) after the running and queued ones.
FINISHED_SHOWN: Final = 8

_ASSETS: Final = Path(__file__).with_name("dashboard")
#: URL path -> (file under ``dashboard/``, content type).
_STATIC: Final[dict[str, tuple[str, str]]] = {
    "/": ("index.html", "text/html"),
    "/dashboard/dashboard.js": ("dashboard.js", "text/javascript"),
    "/dashboard/dashboard.css": ("dashboard.css", "text/css"),
    "/dashboard/uPlot.iife.min.js": ("vendor/uPlot.iife.min.js", "text/javascript"),
    "/dashboard/uPlot.min.css": ("vendor/uPlot.min.css", "text/css"),
    "/dashboard/uPlot.LICENSE": ("vendor/uPlot.LICENSE", "text/plain"),
}
#: The page loads only its own files and talks only to its own server; no inline script
#: or style (data shown is text, never HTML); it cannot be framed.
CONTENT_SECURITY_POLICY: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
#: Paths served without the bearer token: the static page and its assets (no data).
PUBLIC_PATHS: Final = frozenset(_STATIC)


# --- counters and history ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Counters:
    """Cumulative figures read at one instant (all monotone but across restarts)."""

    #: Calls settled (succeeded, failed or cancelled).
    calls: int
    #: Rows output (``None``: not counted by this source).
    rows: int | None
    #: backend -> cumulative histogram ``((le_seconds, cumulative_count), ...)``.
    io: Mapping[str, tuple[tuple[float, int], ...]] = field(default_factory=dict)
    #: executor id -> CPU seconds (``None``: not known yet).
    cpu_seconds: Mapping[str, float | None] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"Counters(calls={self.calls}, rows={self.rows}, io={sorted(self.io)})"


@dataclass(frozen=True, slots=True)
class Sample:
    """One second of history: rates between two :class:`Counters`."""

    t: float
    calls_per_s: float
    rows_per_s: float | None
    #: backend -> (p50 ms, p99 ms, requests/s) of the backend calls of this interval
    #: (percentiles ``None`` when it had none).
    io: Mapping[str, tuple[float | None, float | None, float]]

    def __repr__(self) -> str:
        return f"Sample(t={self.t:.1f}, {self.calls_per_s:.1f} calls/s, io={dict(self.io)})"


def interval_quantile(
    before: Iterable[tuple[float, int]], after: Iterable[tuple[float, int]], q: float
) -> tuple[float | None, int]:
    """The ``q`` quantile (ms) of the observations between two cumulative histograms,
    and their count. Within a bucket: its geometric middle (buckets are log-spaced)."""
    old = dict(before)
    rows = sorted(after)
    deltas = [(le, count - old.get(le, 0)) for le, count in rows]
    total = deltas[-1][1] if deltas else 0
    if total <= 0:
        return None, 0
    rank = max(1, math.ceil(q * total))
    lower = 0.0
    for le, cumulative in deltas:
        if cumulative >= rank:
            if math.isinf(le):
                return lower * 1000.0, total
            middle = math.sqrt(lower * le) if lower > 0 else le
            return middle * 1000.0, total
        lower = le
    return lower * 1000.0, total  # pragma: no cover - the last bucket holds every count


class DashboardHistory:
    """Rates over the last :data:`HISTORY_POINTS` seconds (see the module docstring)."""

    __slots__ = ("_last", "_last_t", "cpu_percent", "samples")

    def __init__(self, points: int = HISTORY_POINTS) -> None:
        self.samples: collections.deque[Sample] = collections.deque(maxlen=points)
        self._last: Counters | None = None
        self._last_t = 0.0
        #: executor id -> CPU % over the last interval (100 = one core).
        self.cpu_percent: dict[str, float] = {}

    def __repr__(self) -> str:
        return f"DashboardHistory({len(self.samples)} samples, last={self._last!r})"

    def observe(self, now: float, counters: Counters) -> Sample | None:
        """Take one reading; returns the new sample (none for the first reading; a reading
        whose clock did not move is ignored). A counter that went back (a restart) counts
        as 0 for that interval."""
        last, last_t = self._last, self._last_t
        if last is not None and now <= last_t:
            return None  # the clock did not move: keep the earlier reading
        self._last, self._last_t = counters, now
        if last is None:
            return None
        dt = now - last_t
        io: dict[str, tuple[float | None, float | None, float]] = {}
        for backend, histogram in counters.io.items():
            before = last.io.get(backend, ())
            p50, n = interval_quantile(before, histogram, 0.50)
            p99, _ = interval_quantile(before, histogram, 0.99)
            io[backend] = (p50, p99, n / dt)
        cpu: dict[str, float] = {}
        for executor, seconds in counters.cpu_seconds.items():
            previous = last.cpu_seconds.get(executor)
            if seconds is not None and previous is not None and seconds >= previous:
                cpu[executor] = 100.0 * (seconds - previous) / dt
        self.cpu_percent = cpu
        sample = Sample(
            t=now,
            calls_per_s=max(0, counters.calls - last.calls) / dt,
            rows_per_s=None
            if counters.rows is None or last.rows is None
            else max(0, counters.rows - last.rows) / dt,
            io=io,
        )
        self.samples.append(sample)
        return sample

    def as_dict(self) -> dict[str, Any]:
        """Column arrays for the page's plots (``null`` where a backend had no call)."""
        samples = list(self.samples)
        backends = sorted({b for s in samples for b in s.io})
        return {
            "t": [round(s.t, 3) for s in samples],
            "calls_per_s": [round(s.calls_per_s, 2) for s in samples],
            "rows_per_s": [_round(s.rows_per_s) for s in samples],
            "io": {
                b: {
                    "p50_ms": [_round(s.io.get(b, (None, None, 0.0))[0]) for s in samples],
                    "p99_ms": [_round(s.io.get(b, (None, None, 0.0))[1]) for s in samples],
                    "requests_per_s": [
                        round(s.io.get(b, (None, None, 0.0))[2], 2) for s in samples
                    ],
                }
                for b in backends
            },
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _backend_histograms(
    rows: Iterable[Mapping[str, Any]],
) -> dict[str, tuple[tuple[float, int], ...]]:
    """Sum the cumulative histograms of each backend's operations (a common ``le`` grid:
    a bucket an operation lacks holds its count below)."""
    per_backend: dict[str, list[list[tuple[float, int]]]] = {}
    for row in rows:
        per_backend.setdefault(str(row["backend"]), []).append(
            sorted((float(le), int(n)) for le, n in row.get("buckets") or ())
        )
    out: dict[str, tuple[tuple[float, int], ...]] = {}
    for backend, histograms in per_backend.items():
        edges = sorted({le for h in histograms for le, _ in h})
        summed = []
        for le in edges:
            total = 0
            for h in histograms:
                below = 0
                for edge, count in h:
                    if edge <= le:
                        below = count
                    else:
                        break
                total += below
            summed.append((le, total))
        out[backend] = tuple(summed)
    return out


# --- the state a poll gets ---------------------------------------------------------------------


class Dashboard:
    """The dashboard's live part: the snapshots, the sampler and its history, and the
    failure kinds of running tasks (re-read only when their ``failed`` count moves)."""

    __slots__ = (
        "_failure_kinds",
        "_io_snapshot",
        "_sampler",
        "_worker_snapshot",
        "history",
        "manager",
        "options",
        "source",
        "started_at",
    )

    def __init__(self, manager: Any, options: Any) -> None:
        self.manager = manager
        self.options = options
        self.history = DashboardHistory()
        self._worker_snapshot, self._io_snapshot = worker_snapshot, io_snapshot
        #: Where the counters come from (the state's ``source``).
        self.source = "snapshot"
        self._sampler: asyncio.Task[None] | None = None
        #: task id -> (failed count, {error kind: n}) of a running task.
        self._failure_kinds: dict[str, tuple[int, dict[str, int]]] = {}
        self.started_at = time.time()

    def __repr__(self) -> str:
        return f"Dashboard(source={self.source}, {self.history!r})"

    def worker_snapshot(self) -> dict[str, Any]:
        worker = getattr(self.options, "worker", None)
        if worker is None:
            return {"executors": []}
        cluster = getattr(worker, "metrics_snapshot", None)  # --ray: the nodes', summed
        try:
            return cluster() if cluster is not None else self._worker_snapshot(worker)
        except Exception:  # a worker not started yet, or stopping
            _log.debug("worker snapshot failed", exc_info=True)
            return {"executors": []}

    def io_snapshot(self) -> list[dict[str, Any]]:
        io = getattr(self.manager, "io", None)
        if io is None:
            return []
        try:
            return list(self._io_snapshot(io))
        except Exception:
            _log.debug("io snapshot failed", exc_info=True)
            return []

    def sample(self, now: float) -> Sample | None:
        """One reading of every counter into the history."""
        snap = self.worker_snapshot()
        calls = snap.get("calls")
        settled = 0
        if isinstance(calls, Mapping):
            settled = sum(int(calls.get(k) or 0) for k in ("succeeded", "failed", "cancelled"))
        rows = snap.get("rows")
        counters = Counters(
            calls=settled,
            rows=int(rows) if isinstance(rows, int) else None,
            io=_backend_histograms(self.io_snapshot()),
            cpu_seconds={
                str(e["executor"]): e.get("cpu_seconds") for e in snap.get("executors", ())
            },
        )
        return self.history.observe(now, counters)

    async def _sample_forever(self) -> None:
        while True:
            try:
                self.sample(time.time())
            except asyncio.CancelledError:
                raise
            except Exception:
                _log.exception("dashboard sampling failed")
            await asyncio.sleep(SAMPLE_INTERVAL_S)

    def start(self) -> None:
        if self._sampler is None:
            self._sampler = asyncio.get_running_loop().create_task(self._sample_forever())

    async def stop(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler
            self._sampler = None

    def unstored(self, record: Any) -> int:
        """Calls of a running task that ended and are not stored yet (the store takes a
        settled batch at a time): what this run's calls the dispatcher core saw end
        (``terminal_roots``) beyond what the run has handed over as settled batches.
        Never more than the calls not stored; 0 when unknown."""
        live = self.manager.live.get(record.id)
        handle = None if live is None else live.handle
        worker = getattr(self.options, "worker", None)
        if handle is None or worker is None or record.state != "running":
            return 0
        try:
            run = handle.run_state
            state = worker.orchestrator.core.task_state(run.task_id)
            if state is None:
                return 0
            handed_over: int = run.stream_counts[0] + run.stream_counts[1] + len(run.failures)
            ended: int = state.terminal_roots
        except Exception:  # the run or the worker went away meanwhile
            return 0
        not_stored: int = record.calls - record.done
        return max(0, min(ended - handed_over, not_stored))

    def forget_failure_kinds_but(self, running: set[str]) -> None:
        for task_id in [t for t in self._failure_kinds if t not in running]:
            del self._failure_kinds[task_id]

    async def failure_kinds(self, record: Any) -> dict[str, int]:
        """Failures by error kind: the summary's once a task ended; for a running one,
        counted from its failure records when its ``failed`` count changed."""
        summary = record.summary or {}
        if record.state in ("succeeded", "failed", "cancelled") and "failures_by_kind" in summary:
            return dict(summary["failures_by_kind"])
        if not record.failed:
            return {}
        cached = self._failure_kinds.get(record.id)
        if cached is not None and cached[0] == record.failed:
            return cached[1]
        store = self.manager.store
        records = await store.call(store.store.failures, record.id)
        kinds = dict(collections.Counter(str(orjson.loads(r).get("kind")) for r in records))
        self._failure_kinds[record.id] = (record.failed, kinds)
        return kinds


def _task_rate(record: Any, ended: int, now: float) -> float | None:
    """Average calls/s of a task: over its run so far, or its whole run once ended."""
    if record.started_at is None:
        return None
    end: float = record.ended_at if record.ended_at is not None else now
    wall: float = end - record.started_at
    if wall <= 0:
        return None
    return round(ended / wall, 1)


async def _tasks_shown(manager: Any) -> tuple[list[Any], dict[str, int]]:
    """Running, then queued (oldest first), then the :data:`FINISHED_SHOWN` newest finished
    ones (by creation, newest first); and the count of tasks in each state. Reads only
    those from the store, however many tasks it keeps."""
    store = manager.store
    running = await manager.list("running")
    queued = await manager.list("queued")
    finished: list[Any] = []
    for state in ("succeeded", "failed", "cancelled"):
        finished += await store.call(store.store.newest, state, FINISHED_SHOWN)
    finished.sort(key=lambda r: r.created_at, reverse=True)
    counts = await store.call(store.store.counts_by_state)
    return running + queued + finished[:FINISHED_SHOWN], dict(counts)


async def dashboard_state(dashboard: Dashboard, now: float | None = None) -> dict[str, Any]:
    """What ``GET /v1/dashboard`` answers (``docs/observability.md``)."""
    now = time.time() if now is None else now
    manager = dashboard.manager
    shown, counts = await _tasks_shown(manager)
    finished = sum(counts.get(state, 0) for state in ("succeeded", "failed", "cancelled"))
    hidden = max(0, finished - sum(1 for r in shown if r.state not in ("running", "queued")))
    tasks = []
    for r in shown:
        unstored = dashboard.unstored(r)
        tasks.append(
            {
                **public_fields(r),
                "unstored": unstored,
                "calls_per_s": _task_rate(r, r.done + unstored, now),
                "failures_by_kind": await dashboard.failure_kinds(r),
                "failures_url": f"/v1/tasks/{r.id}/failures",
                "exit_code": (r.summary or {}).get("exit_code"),
            }
        )
    dashboard.forget_failure_kinds_but({r.id for r in shown if r.state in ("running", "queued")})
    snap = dashboard.worker_snapshot()
    cpu = dashboard.history.cpu_percent
    executors = []
    for e in snap.get("executors", ()):
        row = dict(e)
        row["cpu_percent"] = _round(cpu.get(str(e.get("executor"))))
        executors.append(row)
    io_rows = [{k: v for k, v in row.items() if k != "buckets"} for row in dashboard.io_snapshot()]
    return {
        "now": round(now, 3),
        "source": dashboard.source,
        "server": {
            "started_at": round(dashboard.started_at, 3),
            "draining": bool(manager.draining),
            "running": manager.running,
            "waiting": manager.waiting,
            "slots": manager.slots,
        },
        "task_counts": counts,
        "tasks": tasks,
        "tasks_hidden": hidden,
        "history": dashboard.history.as_dict(),
        "io": io_rows,
        "executors": executors,
        "calls": snap.get("calls"),
        "pool": snap.get("pool"),
    }


# --- routes ------------------------------------------------------------------------------------

_DASHBOARD: Final = web.AppKey("dashboard", Dashboard)


def add_dashboard_routes(app: web.Application, manager: Any, options: Any) -> Dashboard:
    """``GET /`` (the page), its assets under ``/dashboard/``, ``GET /v1/dashboard`` (the
    state), and the sampler, started and stopped with the application."""
    dashboard = Dashboard(manager, options)
    app[_DASHBOARD] = dashboard

    def static(name: str, content_type: str) -> Callable[[web.Request], Any]:
        path = _ASSETS / name

        async def handler(_request: web.Request) -> web.Response:
            return web.Response(
                body=path.read_bytes(),
                content_type=content_type,
                charset="utf-8",
                headers={
                    "Cache-Control": "no-cache",
                    "X-Content-Type-Options": "nosniff",
                    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
                    "Referrer-Policy": "no-referrer",
                },
            )

        return handler

    async def state(_request: web.Request) -> web.Response:
        return web.Response(
            body=orjson.dumps(await dashboard_state(dashboard)),
            content_type="application/json",
            headers={"Cache-Control": "no-store"},
        )

    async def on_startup(_app: web.Application) -> None:
        dashboard.start()

    async def on_cleanup(_app: web.Application) -> None:
        await dashboard.stop()

    for url, (name, content_type) in _STATIC.items():
        app.router.add_get(url, static(name, content_type))
    app.router.add_get("/v1/dashboard", state)
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return dashboard
