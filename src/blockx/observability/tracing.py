"""Traces: ``task``, ``call``, ``io``, ``subcall`` spans in the worker, ``execute`` spans
from the executors, to an OTLP exporter and/or a JSON-lines trace file.

Theory of operation
-------------------
**Off by default.** :meth:`Tracing.from_env` returns None unless a trace file is
asked for (``--trace-file`` / ``BLOCKX_TRACE_FILE``) or an OTLP endpoint is set
(``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``). The
orchestrator's parts hold a ``tracer`` attribute that is None then: each hook
on the hot path is one ``is not None`` test (per dispatch, per batch of
completions, per IO wait) and nothing else.

**One sampler decision per call.** A root call is sampled or not by
:meth:`CallTracer.sampled` on its call id (a 64-bit hash below
``ratio x 2**64``: every attempt of the call gets the same answer, with no
memory kept for unsampled calls); its sub-calls follow their caller. An
unsampled call creates no span object at all. The ratio comes from the standard
``OTEL_TRACES_SAMPLER`` / ``OTEL_TRACES_SAMPLER_ARG`` (``always_on``,
``always_off``, ``traceidratio`` and their ``parentbased_`` forms; the task span
is the root, so "parent based" changes nothing here). The ``task`` span of a run
is written only if at least one of its calls was sampled: sampling at 0 writes
nothing.

**The spans** (names exactly these; attributes in docs/observability.md):

* ``task`` -- one per run, the root of the run's trace (one trace id per task);
* ``call`` -- one per attempt, from the dispatch to the terminal frame; the
  child of ``task`` (a root call) or of its caller's ``subcall`` span;
* ``io`` -- one per IO wait, from the ``CallWaiting`` to the answer, child of the
  waiting attempt's ``call``; ``blockx.io.answer`` says ``cached`` (answered at
  once), ``joined`` (an identical read in flight), ``sent`` (a backend request) or
  ``refused`` (an error at once: no such backend, bad params);
* ``subcall`` -- one per sub-call wait, child of the caller's ``call``; the
  child's ``call`` spans are its children;
* ``execute`` -- the executor's side of an attempt: the worker writes its
  ``call`` span's W3C ``traceparent`` in the ExecuteCall envelope's ``trace`` key
  (first in the envelope: the executor's generic decode path then reads it);
  the executor sends the finished span back as the terminal frame's
  ``executeSpan`` (blockx/executor/tracing.py) and the worker re-emits it, with
  the executor's own ids and times, to the same sinks. An executor that does not
  send one (an older protocol) leaves the call without an ``execute`` span.

**Sinks.** :class:`JsonLinesSink` writes every finished span as one JSON line
(``trace_id``, ``span_id``, ``parent_span_id``, ``name``, ``start_ns``,
``end_ns``, ``attributes``). :class:`OtlpSink` hands spans to the OpenTelemetry
SDK's ``BatchSpanProcessor`` over the OTLP/HTTP exporter (the ``blockx[otel]``
extra), which reads the ``OTEL_EXPORTER_OTLP_*`` variables itself. Spans are
built here, not through an SDK tracer, because the executors' spans must keep
the ids and times they were given on the other side of the socket.

Everything runs on the worker's event-loop thread (the actor and the IO answer
callbacks): no locks.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, Protocol

import orjson

from blockx.wire import keys

if TYPE_CHECKING:
    from blockx.worker.core import DispatchCallCmd

__all__ = [
    "CallTracer",
    "JsonLinesSink",
    "OtlpSink",
    "SpanRecord",
    "SpanSink",
    "Tracing",
    "sample_ratio_from_env",
]

_log = logging.getLogger("blockx.tracing")

#: Environment variable naming the trace file (as ``--trace-file``).
ENV_TRACE_FILE: Final = "BLOCKX_TRACE_FILE"
_MASK64: Final = (1 << 64) - 1
_SPAN_NAMES: Final = frozenset({"task", "call", "io", "subcall", "execute", "node"})
#: ``executeSpan`` members an executor sends (blockx/executor/tracing.py).
_HEX32_LEN: Final = 32
_HEX16_LEN: Final = 16


# --- spans and sinks -------------------------------------------------------------------------


class SpanRecord:
    """One span: ids as ints (trace 128-bit, span 64-bit; parent 0 = root), ns times."""

    __slots__ = (
        "attributes",
        "end_ns",
        "name",
        "parent_span_id",
        "span_id",
        "start_ns",
        "trace_id",
    )

    def __init__(
        self,
        name: str,
        trace_id: int,
        span_id: int,
        parent_span_id: int,
        start_ns: int,
        attributes: dict[str, Any],
    ) -> None:
        self.name = name
        self.trace_id = trace_id
        self.span_id = span_id
        self.parent_span_id = parent_span_id
        self.start_ns = start_ns
        self.end_ns = 0  # 0 while open
        self.attributes = attributes

    def __repr__(self) -> str:
        return (
            f"SpanRecord({self.name}, trace={self.trace_id:032x}, span={self.span_id:016x}, "
            f"parent={self.parent_span_id:016x}, {'open' if not self.end_ns else 'ended'})"
        )

    def traceparent(self) -> str:
        """This span's W3C ``traceparent`` (always sampled: unsampled calls have no span)."""
        return f"00-{self.trace_id:032x}-{self.span_id:016x}-01"

    def to_json(self) -> dict[str, Any]:
        """The trace file's line for this span."""
        return {
            "trace_id": f"{self.trace_id:032x}",
            "span_id": f"{self.span_id:016x}",
            "parent_span_id": f"{self.parent_span_id:016x}" if self.parent_span_id else None,
            "name": self.name,
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "attributes": self.attributes,
        }


class SpanSink(Protocol):
    """Where finished spans go."""

    def emit(self, span: SpanRecord) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


class JsonLinesSink:
    """``--trace-file``: one JSON object per finished span, appended to ``path``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._file = open(self.path, "ab")  # closed by close()
        self.written = 0

    def __repr__(self) -> str:
        return f"JsonLinesSink({self.path!r}, written={self.written})"

    def emit(self, span: SpanRecord) -> None:
        self._file.write(orjson.dumps(span.to_json(), option=orjson.OPT_APPEND_NEWLINE))
        self.written += 1

    def flush(self) -> None:
        if not self._file.closed:
            self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


class OtlpSink:
    """Finished spans to the OpenTelemetry SDK's batch processor and OTLP/HTTP exporter
    (``pip install 'blockx[otel]'``) at ``endpoint`` (the full URL, ``.../v1/traces``;
    None: the exporter reads ``OTEL_EXPORTER_OTLP_*`` itself, as it does for headers,
    timeout and compression). ``exporter`` replaces it (tests: the SDK's in-memory one)."""

    def __init__(
        self, exporter: Any = None, *, endpoint: str | None = None, batch: bool = True
    ) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter(endpoint=endpoint)
        self._resource = Resource.create({"service.name": "blockx"})
        self._processor = BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter)

    def __repr__(self) -> str:
        return f"OtlpSink({self._processor!r})"

    def emit(self, span: SpanRecord) -> None:
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.trace import SpanContext, TraceFlags

        flags = TraceFlags(TraceFlags.SAMPLED)
        context = SpanContext(span.trace_id, span.span_id, is_remote=False, trace_flags=flags)
        parent = (
            SpanContext(span.trace_id, span.parent_span_id, is_remote=False, trace_flags=flags)
            if span.parent_span_id
            else None
        )
        self._processor.on_end(
            ReadableSpan(
                name=span.name,
                context=context,
                parent=parent,
                resource=self._resource,
                attributes={k: v for k, v in span.attributes.items() if v is not None},
                start_time=span.start_ns,
                end_time=span.end_ns,
            )
        )

    def flush(self) -> None:
        self._processor.force_flush()

    def close(self) -> None:
        self._processor.shutdown()


# --- configuration ---------------------------------------------------------------------------


def sample_ratio_from_env(environ: Mapping[str, str]) -> float:
    """The fraction of calls sampled, from ``OTEL_TRACES_SAMPLER`` (+ ``_ARG``); default 1."""
    sampler = environ.get("OTEL_TRACES_SAMPLER", "").strip().lower()
    if sampler in ("", "always_on", "parentbased_always_on"):
        return 1.0
    if sampler in ("always_off", "parentbased_always_off"):
        return 0.0
    if sampler in ("traceidratio", "parentbased_traceidratio"):
        arg = environ.get("OTEL_TRACES_SAMPLER_ARG", "1.0")
        try:
            ratio = float(arg)
        except ValueError:
            _log.warning("OTEL_TRACES_SAMPLER_ARG=%r is not a number: sampling every call", arg)
            return 1.0
        return min(max(ratio, 0.0), 1.0)
    _log.warning("OTEL_TRACES_SAMPLER=%r is not supported: sampling every call", sampler)
    return 1.0


class Tracing:
    """What to trace and where to: ``Worker(tracing=...)``. Build with :meth:`from_env`
    (None: tracing off) or directly (``sinks``: any :class:`SpanSink`)."""

    def __init__(self, sinks: list[SpanSink], *, sample_ratio: float = 1.0) -> None:
        self.sinks = sinks
        self.sample_ratio = min(max(sample_ratio, 0.0), 1.0)

    def __repr__(self) -> str:
        return f"Tracing(sinks={self.sinks!r}, sample_ratio={self.sample_ratio})"

    @classmethod
    def from_env(
        cls,
        trace_file: str | os.PathLike[str] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> Tracing | None:
        """Tracing as ``blockx run`` / ``blockx serve`` configure it: a trace file
        (``trace_file``, else ``BLOCKX_TRACE_FILE``) and/or OTLP export (when
        ``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``..._TRACES_ENDPOINT`` is set,
        ``OTEL_TRACES_EXPORTER`` is not ``none`` and ``OTEL_SDK_DISABLED`` is not
        ``true``). None when neither: tracing off."""
        env = os.environ if environ is None else environ
        path = trace_file if trace_file is not None else env.get(ENV_TRACE_FILE) or None
        sinks: list[SpanSink] = []
        if path is not None:
            sinks.append(JsonLinesSink(path))
        traces_endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or None
        base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        if traces_endpoint is None and base:
            traces_endpoint = base.rstrip("/") + "/v1/traces"  # as the OTLP/HTTP spec says
        wants_otlp = (
            traces_endpoint is not None
            and env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() not in ("none", "")
            and env.get("OTEL_SDK_DISABLED", "").strip().lower() != "true"
        )
        if wants_otlp:
            try:
                sinks.append(OtlpSink(endpoint=traces_endpoint))
            except ImportError:
                _log.warning(
                    "OTEL_EXPORTER_OTLP_ENDPOINT is set but the OpenTelemetry SDK is not "
                    "installed (pip install 'blockx[otel]'): no spans are exported"
                )
        if not sinks:
            return None
        return cls(sinks, sample_ratio=sample_ratio_from_env(env))


# --- the worker's recorder -------------------------------------------------------------------


class _TaskTrace:
    """A live task's trace: its id, its ``task`` span (written at the end if any call
    was sampled) and the open spans of its sampled calls."""

    __slots__ = ("sampled_calls", "span")

    def __init__(self, span: SpanRecord) -> None:
        self.span = span
        self.sampled_calls = 0


class CallTracer:
    """The worker's span recorder (see the module docstring). Built by the ``Worker``
    from a :class:`Tracing`; its hooks are called by the orchestrator's parts."""

    def __init__(self, tracing: Tracing, *, rng: random.Random | None = None) -> None:
        self.tracing = tracing
        self._sinks = tuple(tracing.sinks)
        self._bound = int(tracing.sample_ratio * (1 << 64))
        self._rng = rng if rng is not None else random.Random()
        #: Live tasks by the core's task id.
        self.tasks: dict[str, _TaskTrace] = {}
        #: The open ``call`` span of each traced call (its live attempt's).
        self.calls: dict[str, SpanRecord] = {}
        #: Open ``io`` and ``subcall`` spans by (call id, request id).
        self.waits: dict[tuple[str, str], SpanRecord] = {}
        #: The open ``subcall`` spans of each caller, newest last.
        self.subcalls: dict[str, list[SpanRecord]] = {}
        #: Spans written, and ``executeSpan`` members refused as malformed.
        self.emitted = 0
        self.refused_execute_spans = 0

    def __repr__(self) -> str:
        return (
            f"CallTracer(ratio={self.tracing.sample_ratio}, tasks={len(self.tasks)}, "
            f"open_calls={len(self.calls)}, emitted={self.emitted})"
        )

    # --- ids, clock, output ------------------------------------------------------------------

    def _span_id(self) -> int:
        return self._rng.getrandbits(64) or 1

    def _emit(self, span: SpanRecord) -> None:
        self.emitted += 1
        for sink in self._sinks:
            try:
                sink.emit(span)
            except Exception:
                _log.exception("span sink %r failed", sink)

    def _end(self, span: SpanRecord, end_ns: int) -> None:
        span.end_ns = max(end_ns, span.start_ns)
        self._emit(span)

    def sampled(self, call_id: str) -> bool:
        """The sampler's decision for a root call (the same for all its attempts)."""
        return (hash(call_id) & _MASK64) < self._bound

    # --- task ----------------------------------------------------------------------------------

    def task_started(self, task_id: str, user_task_id: str) -> None:
        """A task was registered: its trace and ``task`` span begin (written at its end)."""
        if self._bound == 0:
            return
        span = SpanRecord(
            "task",
            self._rng.getrandbits(128) or 1,
            self._span_id(),
            0,
            time.time_ns(),
            {"blockx.task_id": user_task_id},
        )
        self.tasks[task_id] = _TaskTrace(span)

    def task_finished(self, task_id: str, outcome: str) -> None:
        """The task converged: open spans of its calls end ``unfinished``; the ``task``
        span is written if any call was sampled."""
        trace = self.tasks.pop(task_id, None)
        if trace is None:
            return
        now = time.time_ns()
        trace_id = trace.span.trace_id
        for key, span in list(self.waits.items()):
            if span.trace_id == trace_id:
                del self.waits[key]
                span.attributes["blockx.outcome"] = "unfinished"
                self._end(span, now)
        for call_id, span in list(self.calls.items()):
            if span.trace_id == trace_id:
                del self.calls[call_id]
                self.subcalls.pop(call_id, None)
                span.attributes["blockx.outcome"] = "unfinished"
                self._end(span, now)
        if trace.sampled_calls:
            trace.span.attributes["blockx.outcome"] = outcome
            trace.span.attributes["blockx.sampled_calls"] = trace.sampled_calls
            self._end(trace.span, now)
        for sink in self._sinks:
            try:
                sink.flush()
            except Exception:
                _log.exception("span sink %r failed to flush", sink)

    # --- call attempts -------------------------------------------------------------------------

    def traced_body(self, cmd: DispatchCallCmd, body: bytes) -> bytes:
        """Start the ``call`` span of ``cmd``'s attempt if its call is sampled, and return
        the ExecuteCall ``body`` with the span's ``traceparent`` in the envelope's ``trace``
        key (first); ``body`` unchanged for an unsampled call."""
        call_id = cmd.call_id
        previous = self.calls.pop(call_id, None)
        parent_id = cmd.parent_call_id
        if parent_id is None:
            task = self.tasks.get(cmd.task_id)
            if task is None or not (previous is not None or self.sampled(call_id)):
                return body
            parent_span = task.span
            task.sampled_calls += 1
        else:
            caller = self.calls.get(parent_id)
            if caller is None:  # the caller is not traced: neither is its sub-call
                return body
            open_subcalls = self.subcalls.get(parent_id)
            parent_span = open_subcalls[-1] if open_subcalls else caller
        now = time.time_ns()
        if previous is not None:  # the attempt before ended unseen (its executor was lost)
            previous.attributes["blockx.outcome"] = "abandoned"
            self._end(previous, now)
        call = cmd.call
        span = SpanRecord(
            "call",
            parent_span.trace_id,
            self._span_id(),
            parent_span.span_id,
            now,
            {
                "blockx.call_id": call_id,
                "blockx.function": call.function_id,
                "blockx.attempt": cmd.attempt_seq,
                "blockx.executor": cmd.executor_id,
                "blockx.kind": "root" if parent_id is None else "subcall",
            },
        )
        self.calls[call_id] = span
        return b'{"trace":{"traceparent":"' + span.traceparent().encode() + b'"},' + body[1:]

    def calls_completed(self, completions: list[tuple[str, int, bytes, int]]) -> None:
        """Completed attempts ``(call id, attempt, output, budget)`` of typed frames (no
        ``execute`` span): their ``call`` spans end."""
        calls = self.calls
        if not calls:
            return
        for completion in completions:
            if completion[0] in calls:
                self.call_ended(completion[0], completion[1], "succeeded", None, None)

    def call_ended(
        self,
        call_id: str,
        attempt_seq: int,
        outcome: str,
        error_kind: str | None,
        execute_span: Any,
    ) -> None:
        """Attempt ``attempt_seq`` of ``call_id`` ended: its ``call`` span (and the
        executor's ``execute`` span, the terminal frame's ``executeSpan``, if it sent one)
        is written. A frame of another attempt than the traced one changes nothing."""
        span = self.calls.get(call_id)
        if span is None or span.attributes["blockx.attempt"] != attempt_seq:
            return
        del self.calls[call_id]
        if error_kind == keys.ERR_CANCELLED:
            outcome = "cancelled"
        now = time.time_ns()
        for key in [key for key in self.waits if key[0] == call_id] if self.waits else ():
            wait = self.waits.pop(key)
            wait.attributes["blockx.outcome"] = "unanswered"
            self._end(wait, now)
        self.subcalls.pop(call_id, None)
        if execute_span is not None:
            self._emit_execute(span, execute_span)
        span.attributes["blockx.outcome"] = outcome
        if error_kind is not None:
            span.attributes["blockx.error_kind"] = error_kind
        self._end(span, now)

    def _emit_execute(self, call: SpanRecord, wire: Any) -> None:
        """Re-emit the executor's ``execute`` span if it is what a child of ``call`` must be."""
        try:
            trace_id = wire["traceId"]
            span_id = wire["spanId"]
            parent_id = wire["parentSpanId"]
            start_ns = wire["startNs"]
            end_ns = wire["endNs"]
            attributes = wire.get("attributes") or {}
            ok = (
                type(trace_id) is str
                and len(trace_id) == _HEX32_LEN
                and type(span_id) is str
                and len(span_id) == _HEX16_LEN
                and int(trace_id, 16) == call.trace_id
                and int(parent_id, 16) == call.span_id
                and type(start_ns) is int
                and type(end_ns) is int
                and type(attributes) is dict
            )
            span_int = int(span_id, 16)
        except (KeyError, TypeError, ValueError, AttributeError):
            ok = False
            span_int = 0
        if not ok or not span_int:
            self.refused_execute_spans += 1
            return
        span = SpanRecord("execute", call.trace_id, span_int, call.span_id, start_ns, attributes)
        span.end_ns = max(end_ns, start_ns)
        self._emit(span)

    # --- waits ---------------------------------------------------------------------------------

    def io_started(
        self,
        call_id: str,
        request_id: str,
        payload: dict[str, Any],
        answer: Any,
        *,
        immediate: bool,
    ) -> None:
        """An IO wait of a call was handed to its handler, which answered ``answer`` (an
        ``IOResult`` at once when ``immediate``: a cache hit, or a refusal; else a future)."""
        call = self.calls.get(call_id)
        if call is None:
            return
        if immediate:
            how = "cached" if getattr(answer, "error", None) is None else "refused"
        else:
            flight = getattr(answer, "flight", None)
            joiners = getattr(flight, "joiners", None) if flight is not None else None
            how = "joined" if joiners is not None and answer in joiners else "sent"
        self.waits[(call_id, request_id)] = SpanRecord(
            "io",
            call.trace_id,
            self._span_id(),
            call.span_id,
            time.time_ns(),
            {
                "blockx.io.backend": payload.get(keys.FP_BACKEND),
                "blockx.io.operation": payload.get(keys.FP_OPERATION),
                "blockx.io.answer": how,
            },
        )

    def io_answered(self, call_id: str, request_id: str, error_kind: str | None) -> None:
        """The IO wait's answer was queued to the executor."""
        span = self.waits.pop((call_id, request_id), None)
        if span is None:
            return
        span.attributes["blockx.outcome"] = "failed" if error_kind is not None else "succeeded"
        if error_kind is not None:
            span.attributes["blockx.error_kind"] = error_kind
        self._end(span, time.time_ns())

    def subcall_started(self, call_id: str, request_id: str, function_id: Any) -> None:
        """A call waits on a sub-call of ``function_id``."""
        call = self.calls.get(call_id)
        if call is None:
            return
        span = SpanRecord(
            "subcall",
            call.trace_id,
            self._span_id(),
            call.span_id,
            time.time_ns(),
            {"blockx.function": function_id if type(function_id) is str else None},
        )
        self.waits[(call_id, request_id)] = span
        self.subcalls.setdefault(call_id, []).append(span)

    def subcall_ended(self, call_id: str, request_id: str, error_kind: str | None) -> None:
        """The sub-call wait's answer was queued to the caller."""
        span = self.waits.pop((call_id, request_id), None)
        if span is None:
            return
        stack = self.subcalls.get(call_id)
        if stack is not None and span in stack:
            stack.remove(span)
        span.attributes["blockx.outcome"] = "failed" if error_kind is not None else "succeeded"
        if error_kind is not None:
            span.attributes["blockx.error_kind"] = error_kind
        self._end(span, time.time_ns())

    # --- shutdown ------------------------------------------------------------------------------

    def close(self) -> None:
        """End what is still open (tasks as ``unfinished``) and close the sinks."""
        for task_id in list(self.tasks):
            self.task_finished(task_id, "unfinished")
        for sink in self._sinks:
            try:
                sink.close()
            except Exception:
                _log.exception("span sink %r failed to close", sink)


def is_span_name(name: str) -> bool:
    """One of the span names BlockX writes (``node``: a cluster run's, docs/cluster.md)."""
    return name in _SPAN_NAMES
