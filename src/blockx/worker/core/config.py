"""DispatcherConfig: every knob of the dispatcher core, its default and its derivations.

Theory of operation
-------------------
One frozen value, built once by the worker's configuration layer (which reads
files, environment variables and flags; this module reads nothing) and handed to
:class:`~blockx.worker.core.dispatcher.DispatcherCore`. Construction validates
every field and raises :class:`~blockx.worker.core.errors.ConfigError` naming
the field, so a bad value is reported where it was written, not later as an odd
scheduling decision.

Defaults are the seed's (``internal/worker/core/config.go`` and the stream
builder's ``MaxOutstandingBatches``). Two values are derived, and stored in
fields that cannot be passed in (``init=False``), so ``dataclasses.replace``
re-derives them:

* ``stall_timeout_ms`` -- the effective scheduler-stall (wedge) threshold:
  ``call_deadline_ms + 5000`` unless ``scheduler_stall_timeout_ms`` is set
  higher than ``call_deadline_ms + 1000``; a value at or below that is raised to
  the derived one, because an executor legitimately runs a call for up to its
  budget and must not be mistaken for wedged while doing so.
* ``fairness_quantum`` -- ``instance_fairness_quantum`` capped at 1024, and at
  least 1 (0 and 1 both mean "re-pick the instance for every call").

Knobs that are ours, not the seed's, are marked so below.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Final

from .errors import ConfigError
from .types import FailurePolicy

#: Added to ``call_deadline_ms`` to derive the scheduler-stall timeout.
STALL_TIMEOUT_MARGIN_MS: Final = 5000
#: An explicit stall timeout at or below ``call_deadline_ms`` + this is raised
#: to the derived value.
STALL_TIMEOUT_MIN_MARGIN_MS: Final = 1000
#: Upper bound of ``instance_fairness_quantum``.
MAX_FAIRNESS_QUANTUM: Final = 1024
#: Retry jitter: up to this fraction of the backoff is added.
RETRY_JITTER_FRACTION: Final = 0.05


@dataclass(frozen=True, slots=True, kw_only=True)
class DispatcherConfig:
    """Limits and policies of one :class:`DispatcherCore`.

    Zero means "no limit" where a field says so; every other field must be
    positive. Raises :class:`ConfigError` (naming the field) on construction.
    """

    #: Calls (root calls and sub-calls) the core keeps bound to one executor at once
    #: (0 = no limit).
    #: Also passed to the executor as ``--executor-max-inflight``.
    executor_max_inflight: int = 128
    #: An executor whose heartbeat runnable count, less the completions seen
    #: since that heartbeat, reaches this is skipped (0 = no limit).
    executor_max_runnable: int = 128
    #: 0 scores every eligible executor; N > 0 scores only the first N eligible
    #: ones, scanning from a rotating start (power-of-d sampling).
    executor_selection_sample_size: int = 0
    #: Executors whose RSS is at or above this many bytes are skipped (0 = off).
    executor_memory_high_watermark: int = 0
    #: Root calls of one task in flight at once.
    task_max_inflight_calls: int = 1024
    #: Execution budget of every root attempt, in ms (0 = unlimited).
    call_deadline_ms: int = 5000
    #: Requested wedge threshold; ``None`` derives it. Read ``stall_timeout_ms``.
    scheduler_stall_timeout_ms: int | None = None
    #: A sub-call is refused when its ancestry already has this many keys.
    max_subcall_depth: int = 8
    #: Retry backoff base when the task's policy names none, in ms.
    base_backoff_ms: int = 10
    #: Ours: no single backoff is longer than this, in ms.
    max_backoff_ms: int = 60_000
    #: Max-min fair release across instances (tenants) instead of task
    #: round-robin.
    instance_fairness: bool = False
    #: Binds served to one instance before it is re-picked (0/1 = every call).
    instance_fairness_quantum: int = 0
    #: A one-shot task whose root outputs exceed this many bytes in total stops with
    #: ``OUTPUT_BYTES_EXCEEDED`` and drops its outputs (0 = no limit). Streams are not
    #: subject to it here (the worker applies it to a collected stream).
    max_collected_output_bytes: int = 0
    #: Attempts per root call when the task's policy names none
    #: (``CALL_RETRY_MAX_ATTEMPTS``).
    default_max_attempts: int = 3
    #: Stream producer credit window: committed batches not yet settled.
    max_outstanding_batches: int = 2
    #: Ours: successful results kept per task for call-cache hits; the oldest
    #: entry is evicted first (0 = no call cache). Bounds the memory of long
    #: streams.
    call_cache_max_entries: int = 65_536

    #: Derived: the effective scheduler-stall timeout (see module docstring).
    stall_timeout_ms: int = field(init=False)
    #: Derived: binds per instance turn, in 1..1024.
    fairness_quantum: int = field(init=False)

    def __post_init__(self) -> None:
        for f in fields(self):
            if not f.init or f.name == "scheduler_stall_timeout_ms":
                continue
            value = getattr(self, f.name)
            if f.name == "instance_fairness":
                if type(value) is not bool:
                    raise ConfigError(f.name, value, "must be a bool")
                continue
            if type(value) is not int:
                raise ConfigError(f.name, value, "must be an int")
            if value < 0:
                raise ConfigError(f.name, value, "must be >= 0")
        for name in (
            "task_max_inflight_calls",
            "max_subcall_depth",
            "default_max_attempts",
            "max_outstanding_batches",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(name, getattr(self, name), "must be >= 1")
        if self.max_backoff_ms < self.base_backoff_ms:
            raise ConfigError("max_backoff_ms", self.max_backoff_ms, "must be >= base_backoff_ms")
        requested = self.scheduler_stall_timeout_ms
        if requested is not None:
            if type(requested) is not int:
                raise ConfigError("scheduler_stall_timeout_ms", requested, "must be an int or None")
            if requested < 0:
                raise ConfigError("scheduler_stall_timeout_ms", requested, "must be >= 0")
        stall = effective_stall_timeout_ms(self.call_deadline_ms, requested)
        object.__setattr__(self, "stall_timeout_ms", stall)
        quantum = min(max(self.instance_fairness_quantum, 1), MAX_FAIRNESS_QUANTUM)
        object.__setattr__(self, "fairness_quantum", quantum)


def effective_stall_timeout_ms(call_deadline_ms: int, requested: int | None) -> int:
    """The scheduler-stall (wedge) timeout for a deadline and a requested value (None:
    derive it): ``call_deadline_ms + 5000``, or ``requested`` when it is above
    ``call_deadline_ms + 1000``. The one statement of the rule: ``DispatcherConfig``
    and the worker's configuration (``blockx.worker.config.DispatcherSettings``) both
    derive their ``stall_timeout_ms`` with it."""
    floor = call_deadline_ms + STALL_TIMEOUT_MIN_MARGIN_MS
    if requested is None or requested <= floor:
        return call_deadline_ms + STALL_TIMEOUT_MARGIN_MS
    return requested


def stall_threshold_ms(config: DispatcherConfig, budget_ms: int) -> int | None:
    """How long a call granted ``budget_ms`` may run without yielding before the
    wedge backstop judges its executor wedged; None: never (an unlimited budget).

    The call's own budget plus :data:`STALL_TIMEOUT_MARGIN_MS` -- an executor runs
    a call for up to its budget, and cuts it off there itself, so only a call that
    outlives its budget by the margin ignored its deadline. An explicit
    ``scheduler_stall_timeout_ms`` overrides the derivation, but never below the
    budget + :data:`STALL_TIMEOUT_MIN_MARGIN_MS`.
    """
    if budget_ms <= 0:
        return None
    requested = config.scheduler_stall_timeout_ms
    if requested is None:
        return budget_ms + STALL_TIMEOUT_MARGIN_MS
    return max(requested, budget_ms + STALL_TIMEOUT_MIN_MARGIN_MS)


@dataclass(frozen=True, slots=True, kw_only=True)
class CallRetryPolicy:
    """A task's call policy. ``None`` fields fall back to ``DispatcherConfig``.

    Here, not in :mod:`.types`, with the other values a user builds: this module
    stays interpreted when the core is compiled, so a bad field is still a
    :class:`ConfigError` naming it (a compiled class would raise a bare
    ``TypeError`` on the wrong type before ``__post_init__`` could).
    """

    #: Attempts per root call (``DispatcherConfig.default_max_attempts``).
    max_attempts: int | None = None
    #: Backoff base in ms; wins over ``DispatcherConfig.base_backoff_ms``.
    base_backoff_ms: int | None = None
    failure: FailurePolicy = FailurePolicy.FAST_FAIL
    #: Budget of every root attempt in ms, 0 = unlimited
    #: (``DispatcherConfig.call_deadline_ms``).
    call_budget_ms: int | None = None

    def __post_init__(self) -> None:
        for name, minimum in (("max_attempts", 1), ("base_backoff_ms", 0), ("call_budget_ms", 0)):
            value = getattr(self, name)
            if value is None:
                continue
            if type(value) is not int:
                raise ConfigError(f"CallRetryPolicy.{name}", value, "must be an int or None")
            if value < minimum:
                raise ConfigError(f"CallRetryPolicy.{name}", value, f"must be >= {minimum}")
        if not isinstance(self.failure, FailurePolicy):
            raise ConfigError("CallRetryPolicy.failure", self.failure, "must be a FailurePolicy")
