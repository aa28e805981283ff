"""The cluster driver's own spans: a ``task`` span per run, a ``node`` span per node.

Theory of operation
-------------------
In cluster mode the calls run on the nodes, whose node workers run untraced: on a real
cluster their spans could not reach a trace file on the driver's machine
(docs/cluster.md). What the driver knows is written instead, at the end of each run
(``blockx run --ray --trace-file``, ``blockx serve --ray --trace-file``: one run per
task), to the same sinks as a local worker's spans
(:class:`~blockx.observability.tracing.Tracing`: the trace file, OTLP): a ``task``
span, the root of the run's trace, and one ``node`` span per node worker the run
used, its child, from when the run first saw the node (:meth:`DriverSpans.look`, called
as the run goes) to its end, with the node's figures from the run's
:class:`~blockx.cluster.driver.ClusterRun` (docs/observability.md, "The spans").
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any

__all__ = ["DriverSpans"]

_log = logging.getLogger("blockx.tracing")


class DriverSpans:
    """The driver's spans of a cluster run (module docstring): a ``task`` span from
    the start to the end, and a ``node`` span per node worker the run used -- from when
    the run first saw it to the end, with its figures (``blockx.ray_node_id``,
    ``blockx.calls``, ``blockx.executors``, ``blockx.batches``, ``blockx.lost_calls``,
    ``blockx.alive``). Written at the end, to the sinks of a
    :class:`~blockx.observability.tracing.Tracing` (none when its sample ratio is 0),
    which :meth:`close` closes (a service shares them between its tasks: it closes
    them itself)."""

    def __init__(self, tracing: Any, task_id: str | None) -> None:
        self.tracing = tracing
        self.task_id = task_id
        self.rng = random.Random()
        self.started_ns = time.time_ns()
        #: When each node was first seen in the run's figures (ns).
        self.node_seen: dict[str, int] = {}

    def __repr__(self) -> str:
        return f"DriverSpans({self.task_id!r}, nodes={len(self.node_seen)})"

    def look(self, nodes: dict[str, Any]) -> None:
        """Note the nodes the run uses now (each tick)."""
        now = time.time_ns()
        for node_id in list(nodes):
            self.node_seen.setdefault(node_id, now)

    def finish(self, result: Any, nodes: dict[str, dict[str, Any]]) -> int:
        """Write the spans of the run that ended with ``result`` (a ``TaskResult``, None:
        it broke down) and flush the sinks; how many spans were written."""
        from blockx.observability.tracing import SpanRecord

        sinks = list(self.tracing.sinks)
        written = 0
        try:
            if self.tracing.sample_ratio <= 0.0:
                return 0
            self.look(nodes)
            now = time.time_ns()
            outcome = "unfinished"
            calls = 0
            task_id = self.task_id or ""
            if result is not None:
                task_id = result.task_id
                calls = result.stats.calls
                outcome = "succeeded" if result.success else result.failure.kind.lower()
            task = SpanRecord(
                "task",
                self.rng.getrandbits(128) or 1,
                self.rng.getrandbits(64) or 1,
                0,
                self.started_ns,
                {
                    "blockx.task_id": task_id,
                    "blockx.outcome": outcome,
                    "blockx.calls": calls,
                    "blockx.cluster_nodes": len(nodes),
                },
            )
            spans = []
            for node_id, figures in sorted(nodes.items()):
                span = SpanRecord(
                    "node",
                    task.trace_id,
                    self.rng.getrandbits(64) or 1,
                    task.span_id,
                    self.node_seen.get(node_id, self.started_ns),
                    {
                        "blockx.task_id": task_id,
                        "blockx.ray_node_id": node_id,
                        **{
                            f"blockx.{name}": figures.get(name)
                            for name in ("calls", "executors", "batches", "lost_calls", "alive")
                        },
                    },
                )
                span.end_ns = max(now, span.start_ns)
                spans.append(span)
            task.end_ns = max(now, task.start_ns)
            for span in [*spans, task]:
                for sink in sinks:
                    try:
                        sink.emit(span)
                    except Exception:
                        _log.exception("span sink %r failed", sink)
                written += 1
            return written
        finally:
            for sink in sinks:
                try:
                    sink.flush()
                except Exception:
                    _log.exception("span sink %r failed to flush", sink)

    def close(self) -> None:
        """Close the sinks."""
        for sink in self.tracing.sinks:
            try:
                sink.close()
            except Exception:
                _log.exception("span sink %r failed to close", sink)
