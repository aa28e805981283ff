"""A test-side worker for ``ExecutorRuntime`` without a session (the seed's unit style).

``Harness`` wraps ``ExecutorRuntime("exec-1")``: it feeds frames with
``handle_inbound_message``, advances with ``run_until_idle`` and reads
``drain_outbox``. It answers ``CallWaiting(function_code)`` from the sources it
was given (so tests exercise the real fetch path) unless ``auto_code=False``,
and it checks the protocol's invariants on every frame it sees: each frame
carries ``executorId`` and validates into its wire-schema payload, and no attempt gets
two terminal frames.
"""

from __future__ import annotations

import gc
import hashlib
from collections import Counter
from typing import Any

import greenlet

from blockx.executor.module_registry import PRELUDE, ModuleRegistry
from blockx.executor.runtime import ExecutorRuntime
from blockx.wire import keys
from blockx.wire.messages import validate_payload

Envelope = dict[str, Any]

TERMINAL_TYPES = frozenset({keys.MT_CALL_COMPLETED, keys.MT_CALL_FAILED})


def digest_of(source: str) -> str:
    return "sha256:" + hashlib.sha256(source.encode("utf-8")).hexdigest()


def live_call_greenlets() -> list[greenlet.greenlet]:
    """Every greenlet that is alive and not a thread's main greenlet."""
    gc.collect()
    return [
        g
        for g in gc.get_objects()
        if isinstance(g, greenlet.greenlet) and not g.dead and g.parent is not None
    ]


class FakeClock:
    """A monotonic clock in seconds that only moves when told (starts at an odd value)."""

    def __init__(self, start: float = 1013.25) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def advance_ms(self, ms: float) -> None:
        self.now += ms / 1000.0


class Harness:
    def __init__(
        self,
        *,
        real_clock: bool = False,
        auto_code: bool = True,
        prelude: dict[str, Any] | None = None,
        max_entries: int | None = None,
        released_namespaces: int | None = None,
        **runtime_kwargs: Any,
    ) -> None:
        self.clock = FakeClock()
        self.wall_ms = 1_764_450_000_123
        names = dict(PRELUDE)
        names["clock"] = self.clock
        names["record"] = self.record
        names.update(prelude or {})
        # A registry given (its own prelude) replaces the harness's.
        registry = runtime_kwargs.pop("registry", None) or ModuleRegistry(
            prelude=names,
            max_entries=max_entries,
            released_namespace_cache=released_namespaces,
        )
        if not real_clock:
            runtime_kwargs.setdefault("monotonic", self.clock)
        runtime_kwargs.setdefault("clock_ms", lambda: self.wall_ms)
        self.rt = ExecutorRuntime("exec-1", registry=registry, **runtime_kwargs)
        self.sources: dict[str, str] = {}
        self.auto_code = auto_code
        self.frames: list[tuple[Envelope, bytes | None]] = []
        self.code_waits: list[Envelope] = []
        self.records: list[Any] = []
        self._terminals: Counter[tuple[str, int]] = Counter()
        self._closed = False

    # --- user-code helpers (in every module's namespace) --------------------------------

    def record(self, value: Any) -> None:
        self.records.append(value)

    # --- sending --------------------------------------------------------------------------

    def add_source(self, source: str) -> str:
        digest = digest_of(source)
        self.sources[digest] = source
        return digest

    def execute(
        self,
        call_id: str,
        source: str | None = None,
        args: Any = None,
        *,
        digest: str | None = None,
        function_id: str = "fn",
        task_id: str = "t1",
        **payload: Any,
    ) -> None:
        if source is not None:
            digest = self.add_source(source)
        assert digest is not None
        body = {
            keys.FP_TASK_ID: task_id,
            keys.FP_FUNCTION_ID: function_id,
            keys.FP_FUNCTION_CODE_DIGEST: digest,
            keys.FP_ARGS: args,
        }
        for name, value in payload.items():
            body[_camel(name)] = value
        self.send(
            {
                keys.F_MESSAGE_TYPE: keys.MT_EXECUTE_CALL,
                keys.F_CALL_ID: call_id,
                keys.F_PAYLOAD: body,
            }
        )

    def send(self, envelope: Any, sidecar: bytes | None = None) -> None:
        self.rt.handle_inbound_message(envelope, sidecar)

    def resume(
        self,
        waiting: Envelope,
        result: Any = None,
        *,
        error: dict[str, Any] | None = None,
        budget_used_ms: int = 0,
        sidecar: bytes | None = None,
        kind: str | None = None,
        request_id: str | None = None,
    ) -> None:
        payload: dict[str, Any] = {
            keys.FP_RESUME_KIND: kind or waiting[keys.F_PAYLOAD][keys.FP_WAIT_KIND],
            keys.FP_BUDGET_USED_MS: budget_used_ms,
        }
        if error is not None:
            payload[keys.FP_ERROR] = error
        else:
            payload[keys.FP_RESULT] = result
        self.send(
            {
                keys.F_MESSAGE_TYPE: keys.MT_RESUME_CALL,
                keys.F_CALL_ID: waiting[keys.F_CALL_ID],
                keys.F_REQUEST_ID: request_id or waiting[keys.F_REQUEST_ID],
                keys.F_PAYLOAD: payload,
            },
            sidecar,
        )

    def cancel(
        self, call_id: str, reason: str | None = None, attempt_seq: int | None = None
    ) -> None:
        payload: dict[str, Any] = {}
        if reason is not None:
            payload[keys.FP_REASON] = reason
        if attempt_seq is not None:
            payload[keys.FP_ATTEMPT_SEQ] = attempt_seq
        self.send(
            {
                keys.F_MESSAGE_TYPE: keys.MT_CANCEL_CALL,
                keys.F_CALL_ID: call_id,
                keys.F_PAYLOAD: payload,
            }
        )

    # --- advancing and reading ----------------------------------------------------------------

    def pump(self) -> list[tuple[Envelope, bytes | None]]:
        """run_until_idle until quiet; code fetches answered; return the new frames."""
        new: list[tuple[Envelope, bytes | None]] = []
        while True:
            self.rt.run_until_idle()
            batch = self.rt.drain_outbox()
            if not batch:
                return new
            answered = False
            for envelope, sidecar in batch:
                self._check(envelope)
                self.frames.append((envelope, sidecar))
                payload = envelope[keys.F_PAYLOAD]
                is_code = (
                    envelope[keys.F_MESSAGE_TYPE] == keys.MT_CALL_WAITING
                    and payload[keys.FP_WAIT_KIND] == keys.WAIT_FUNCTION_CODE
                )
                if is_code:
                    self.code_waits.append(envelope)
                if is_code and self.auto_code:
                    digest = payload[keys.FP_FUNCTION_CODE_DIGEST]
                    self.resume(
                        envelope,
                        {
                            keys.FP_SOURCE: self.sources[digest],
                            keys.FP_FUNCTION_CODE_DIGEST: digest,
                        },
                    )
                    answered = True
                else:
                    new.append((envelope, sidecar))
            if not answered:
                return new

    def run(self) -> list[Envelope]:
        """pump() and return just the envelopes."""
        return [envelope for envelope, _ in self.pump()]

    def _check(self, envelope: Envelope) -> None:
        assert envelope.get(keys.F_EXECUTOR_ID) == "exec-1", envelope
        message_type = envelope[keys.F_MESSAGE_TYPE]
        validate_payload(message_type, envelope[keys.F_PAYLOAD])
        if message_type in TERMINAL_TYPES:
            attempt = (envelope[keys.F_CALL_ID], envelope[keys.F_PAYLOAD][keys.FP_ATTEMPT_SEQ])
            self._terminals[attempt] += 1
            assert self._terminals[attempt] == 1, f"second terminal frame for {attempt}"

    def terminals(self, call_id: str | None = None) -> list[Envelope]:
        return [
            e
            for e, _ in self.frames
            if e[keys.F_MESSAGE_TYPE] in TERMINAL_TYPES
            and (call_id is None or e[keys.F_CALL_ID] == call_id)
        ]

    def terminal(self, call_id: str) -> Envelope:
        found = self.terminals(call_id)
        assert len(found) == 1, f"{call_id}: {len(found)} terminal frames: {found}"
        return found[0]

    def payload(self, call_id: str) -> dict[str, Any]:
        return self.terminal(call_id)[keys.F_PAYLOAD]

    def output(self, call_id: str) -> Any:
        envelope = self.terminal(call_id)
        assert envelope[keys.F_MESSAGE_TYPE] == keys.MT_CALL_COMPLETED, envelope
        return envelope[keys.F_PAYLOAD][keys.FP_OUTPUT]

    def failure(self, call_id: str) -> dict[str, Any]:
        envelope = self.terminal(call_id)
        assert envelope[keys.F_MESSAGE_TYPE] == keys.MT_CALL_FAILED, envelope
        return envelope[keys.F_PAYLOAD]

    def waits(self, call_id: str | None = None, kind: str | None = None) -> list[Envelope]:
        return [
            e
            for e, _ in self.frames
            if e[keys.F_MESSAGE_TYPE] == keys.MT_CALL_WAITING
            and (call_id is None or e[keys.F_CALL_ID] == call_id)
            and (kind is None or e[keys.F_PAYLOAD][keys.FP_WAIT_KIND] == kind)
        ]

    def last_wait(self, call_id: str) -> Envelope:
        found = [
            w
            for w in self.waits(call_id)
            if w[keys.F_PAYLOAD][keys.FP_WAIT_KIND] != keys.WAIT_FUNCTION_CODE
        ]
        assert found, f"no CallWaiting for {call_id}"
        return found[-1]

    def state(self, call_id: str) -> str | None:
        ctx = self.rt.get_context(call_id)
        return None if ctx is None else ctx.state.value

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.rt.shutdown()
            for envelope, _ in self.rt.drain_outbox():
                self._check(envelope)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)
