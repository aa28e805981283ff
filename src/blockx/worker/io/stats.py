"""IO counts and latency, per backend and operation.

Theory of operation
-------------------
Every IO wait a task scope serves is counted once in ``requests``; it was
answered from the cache (``cache_hits``), by joining an identical read already
in flight (``singleflight_joins``), by being refused before reaching the
backend (``rejected``), or by a backend call of its own (``backend_calls``) --
or that read's call was cancelled because every wait for it was gone before it
answered (``abandoned``: the call's attempt failed, its budget ran out, it was
cancelled or its executor was lost; no latency is recorded for it).
Reads the executors answered from their own immutable-read caches never reach
the scope: they are counted apart, in ``local_hits`` (reported with each
call's end, :meth:`OperationStats.record_local_hits`), not in ``requests``.
``errors`` counts backend calls that answered an error (refusals are counted in
``rejected`` and ``errors`` both). ``throttled`` counts backend calls a rate limit
slowed down (the ``rpc`` backend: the node answered "too many requests", or
``io.rpc.max_requests_per_s`` held the request back). Latency is measured for backend calls only,
on ``time.perf_counter`` (not the event loop's clock: uvloop's counts whole
milliseconds, and a table read often takes less than one), from the moment the
request was handed to the backend to the moment its answer arrived: total, max,
and p50/p95 from a log-scale histogram (buckets 2^(1/4) apart from 10 µs: a
percentile is within ~10% of the truth, and recording costs one ``log2``).

An :class:`IOStats` may have a parent: a task scope's statistics roll up into
its subsystem's as they are recorded (one extra attribute update each).
:meth:`IOStats.format_table` is what a CLI summary prints.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, Final

__all__ = ["IOStats", "OperationStats"]

#: Histogram: bucket i holds latencies in [10 µs * 2^(i/4), 10 µs * 2^((i+1)/4)).
_BASE_S: Final = 1e-5
_PER_OCTAVE: Final = 4
_BUCKETS: Final = 96  # up to 10 µs * 2^24 ≈ 168 s; slower lands in the last bucket
#: Octaves whose upper bound is exact (the last bucket also holds what is slower).
_OCTAVES: Final = _BUCKETS // _PER_OCTAVE - 1


def _bucket(seconds: float) -> int:
    if seconds <= _BASE_S:
        return 0
    index = int(math.log2(seconds / _BASE_S) * _PER_OCTAVE)
    return index if index < _BUCKETS else _BUCKETS - 1


def _bucket_mid_ms(index: int) -> float:
    """The geometric middle of a bucket, in ms."""
    return _BASE_S * 2 ** ((index + 0.5) / _PER_OCTAVE) * 1000.0


class OperationStats:
    """Counters of one (backend, operation); see the module docstring."""

    __slots__ = (
        "_histogram",
        "_parent",
        "abandoned",
        "backend",
        "backend_calls",
        "cache_hits",
        "errors",
        "local_hits",
        "max_ms",
        "operation",
        "rejected",
        "requests",
        "singleflight_joins",
        "throttled",
        "total_ms",
    )

    def __init__(self, backend: str, operation: str, parent: OperationStats | None = None) -> None:
        self.backend = backend
        self.operation = operation
        self._parent = parent
        self.requests = 0
        self.backend_calls = 0
        self.errors = 0
        self.rejected = 0
        self.cache_hits = 0
        self.singleflight_joins = 0
        self.abandoned = 0
        self.local_hits = 0
        self.throttled = 0
        self.total_ms = 0.0
        self.max_ms = 0.0
        self._histogram: list[int] | None = None

    def __repr__(self) -> str:
        return f"OperationStats({self.backend}/{self.operation}: {self.as_dict()})"

    # --- recording (each also updates the parent) --------------------------------------------

    def record_cache_hit(self) -> None:
        self.requests += 1
        self.cache_hits += 1
        parent = self._parent
        if parent is not None:
            parent.record_cache_hit()

    def record_local_hits(self, count: int) -> None:
        """``count`` reads an executor answered from its own cache (never a request here)."""
        self.local_hits += count
        parent = self._parent
        if parent is not None:
            parent.record_local_hits(count)

    def record_join(self) -> None:
        self.requests += 1
        self.singleflight_joins += 1
        parent = self._parent
        if parent is not None:
            parent.record_join()

    def record_abandoned(self) -> None:
        """A read's backend call cancelled: nobody waited for its answer any more."""
        self.requests += 1
        self.abandoned += 1
        parent = self._parent
        if parent is not None:
            parent.record_abandoned()

    def record_rejected(self) -> None:
        self.requests += 1
        self.rejected += 1
        self.errors += 1
        if self._parent is not None:
            self._parent.record_rejected()

    def record_call(self, seconds: float, failed: bool, throttled: bool = False) -> None:
        """One backend call that took ``seconds`` (and failed or not).

        Once per backend call, for this node and each parent: a loop with the bucket
        found once, not a call (and a logarithm) per level.
        """
        ms = seconds * 1000.0
        bucket = _bucket(seconds)
        node: OperationStats | None = self
        while node is not None:
            node.requests += 1
            node.backend_calls += 1
            if failed:
                node.errors += 1
            if throttled:
                node.throttled += 1
            node.total_ms += ms
            if ms > node.max_ms:
                node.max_ms = ms
            histogram = node._histogram
            if histogram is None:
                histogram = node._histogram = [0] * _BUCKETS
            histogram[bucket] += 1
            node = node._parent

    # --- reading --------------------------------------------------------------------------------

    @property
    def mean_ms(self) -> float:
        return self.total_ms / self.backend_calls if self.backend_calls else 0.0

    def percentile_ms(self, fraction: float) -> float:
        """The latency below which ``fraction`` of the backend calls finished (0 without any)."""
        histogram = self._histogram
        if histogram is None or not self.backend_calls:
            return 0.0
        rank = max(1, math.ceil(fraction * self.backend_calls))
        seen = 0
        for index, count in enumerate(histogram):
            seen += count
            if seen >= rank:
                return min(_bucket_mid_ms(index), self.max_ms)
        return self.max_ms  # pragma: no cover - the counts add up to backend_calls

    def octave_buckets(self) -> list[tuple[float, int]]:
        """The backend calls' latencies as a cumulative histogram at each octave:
        ``[(upper bound in seconds, calls at or below it), ...]`` for 20 µs, 40 µs, ...
        ~84 s (10 µs * 2^k, k = 1..23: the bounds the log-scale buckets share; the
        calls above the last are ``backend_calls`` minus its count). For metrics."""
        histogram = self._histogram
        out: list[tuple[float, int]] = []
        seen = 0
        index = 0
        for octave in range(1, _OCTAVES + 1):
            end = octave * _PER_OCTAVE
            if histogram is not None:
                while index < end:
                    seen += histogram[index]
                    index += 1
            out.append((_BASE_S * 2.0**octave, seen))
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "operation": self.operation,
            "requests": self.requests,
            "backend_calls": self.backend_calls,
            "errors": self.errors,
            "rejected": self.rejected,
            "cache_hits": self.cache_hits,
            "singleflight_joins": self.singleflight_joins,
            "abandoned": self.abandoned,
            "local_hits": self.local_hits,
            "throttled": self.throttled,
            "total_ms": round(self.total_ms, 3),
            "mean_ms": round(self.mean_ms, 3),
            "p50_ms": round(self.percentile_ms(0.50), 3),
            "p95_ms": round(self.percentile_ms(0.95), 3),
            "max_ms": round(self.max_ms, 3),
        }


class IOStats:
    """The :class:`OperationStats` of every (backend, operation) seen, plus totals."""

    __slots__ = ("_ops", "_parent")

    def __init__(self, parent: IOStats | None = None) -> None:
        self._parent = parent
        self._ops: dict[tuple[str, str], OperationStats] = {}

    def __repr__(self) -> str:
        return f"IOStats({self.totals()})"

    def operation(self, backend: str, operation: str) -> OperationStats:
        """The counters of (backend, operation), created on first use."""
        key = (backend, operation)
        stats = self._ops.get(key)
        if stats is None:
            parent = None if self._parent is None else self._parent.operation(backend, operation)
            stats = self._ops[key] = OperationStats(backend, operation, parent)
        return stats

    def __iter__(self) -> Iterator[OperationStats]:
        return iter(sorted(self._ops.values(), key=lambda s: (s.backend, s.operation)))

    def __len__(self) -> int:
        return len(self._ops)

    def totals(self) -> dict[str, Any]:
        """Sums over every operation (latency: total and max only)."""
        ops = list(self._ops.values())
        return {
            "requests": sum(s.requests for s in ops),
            "backend_calls": sum(s.backend_calls for s in ops),
            "errors": sum(s.errors for s in ops),
            "cache_hits": sum(s.cache_hits for s in ops),
            "singleflight_joins": sum(s.singleflight_joins for s in ops),
            "abandoned": sum(s.abandoned for s in ops),
            "local_hits": sum(s.local_hits for s in ops),
            "throttled": sum(s.throttled for s in ops),
            "total_ms": round(sum(s.total_ms for s in ops), 3),
            "max_ms": round(max((s.max_ms for s in ops), default=0.0), 3),
        }

    def as_dict(self) -> dict[str, Any]:
        """``{"operations": [...], "totals": {...}}`` (JSON-ready)."""
        return {"operations": [s.as_dict() for s in self], "totals": self.totals()}

    def format_table(self) -> str:
        """A plain-text table, one line per (backend, operation); empty string when no IO."""
        if not self._ops:
            return ""
        header = (
            f"{'backend/operation':<32} {'requests':>9} {'calls':>8} {'cached':>8} "
            f"{'joined':>7} {'abandoned':>9} {'errors':>7} {'p50 ms':>8} {'p95 ms':>8} "
            f"{'max ms':>8}"
        )
        local = any(s.local_hits for s in self._ops.values())
        if local:  # the executors answered some reads themselves
            header += f" {'in executor':>11}"
        throttled = any(s.throttled for s in self._ops.values())
        if throttled:  # a rate limit slowed some down
            header += f" {'throttled':>9}"
        lines = [header]
        for s in self:
            name = f"{s.backend}/{s.operation}"
            lines.append(
                f"{name:<32} {s.requests:>9} {s.backend_calls:>8} {s.cache_hits:>8} "
                f"{s.singleflight_joins:>7} {s.abandoned:>9} {s.errors:>7} "
                f"{s.percentile_ms(0.5):>8.2f} "
                f"{s.percentile_ms(0.95):>8.2f} {s.max_ms:>8.2f}"
                + (f" {s.local_hits:>11}" if local else "")
                + (f" {s.throttled:>9}" if throttled else "")
            )
        return "\n".join(lines)
