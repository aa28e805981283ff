"""DispatcherConfig: the seed's defaults, derivations and validation."""

from __future__ import annotations

import dataclasses

import pytest

from blockx.wire import keys as wire_keys
from blockx.worker.core import CallRetryPolicy, ConfigError, DispatcherConfig, FailurePolicy
from blockx.worker.core import types as core_types


def test_defaults_are_the_seeds() -> None:
    config = DispatcherConfig()
    assert config.executor_max_inflight == 128
    assert config.executor_max_runnable == 128
    assert config.executor_selection_sample_size == 0
    assert config.executor_memory_high_watermark == 0
    assert config.task_max_inflight_calls == 1024
    assert config.call_deadline_ms == 5000
    assert config.stall_timeout_ms == 10_000
    assert config.max_subcall_depth == 8
    assert config.base_backoff_ms == 10
    assert config.instance_fairness is False
    assert config.instance_fairness_quantum == 0 and config.fairness_quantum == 1
    assert config.max_collected_output_bytes == 0
    assert config.default_max_attempts == 3
    assert config.max_outstanding_batches == 2


def test_replace_rederives_the_derived_fields() -> None:
    config = dataclasses.replace(DispatcherConfig(), call_deadline_ms=30_000)
    assert config.stall_timeout_ms == 35_000
    with pytest.raises(ValueError, match="init=False"):
        dataclasses.replace(DispatcherConfig(), stall_timeout_ms=1)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("executor_max_inflight", -1, "must be >= 0"),
        ("executor_selection_sample_size", -3, "must be >= 0"),
        ("task_max_inflight_calls", 0, "must be >= 1"),
        ("max_subcall_depth", 0, "must be >= 1"),
        ("default_max_attempts", 0, "must be >= 1"),
        ("max_outstanding_batches", 0, "must be >= 1"),
        ("call_deadline_ms", 1.5, "must be an int"),
        ("base_backoff_ms", True, "must be an int"),
        ("instance_fairness", 1, "must be a bool"),
        ("scheduler_stall_timeout_ms", -1, "must be >= 0"),
        ("max_backoff_ms", 5, "must be >= base_backoff_ms"),
    ],
)
def test_bad_values_raise_a_config_error_naming_the_field(
    field: str, value: object, message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        DispatcherConfig(**{field: value})  # type: ignore[arg-type]
    assert info.value.field == field
    assert field in str(info.value) and message in str(info.value)


def test_policy_validation_names_the_field() -> None:
    with pytest.raises(ConfigError, match=r"CallRetryPolicy\.max_attempts must be >= 1"):
        CallRetryPolicy(max_attempts=0)
    with pytest.raises(ConfigError, match=r"CallRetryPolicy\.base_backoff_ms"):
        CallRetryPolicy(base_backoff_ms=-1)
    with pytest.raises(ConfigError, match=r"CallRetryPolicy\.failure"):
        CallRetryPolicy(failure="fast_fail")  # type: ignore[arg-type]
    assert CallRetryPolicy().failure is FailurePolicy.FAST_FAIL


def test_core_error_kinds_match_the_wire_vocabulary() -> None:
    assert core_types.ERR_TRANSPORT_LOST == wire_keys.ERR_TRANSPORT_LOST
    assert core_types.ERR_CANCELLED == wire_keys.ERR_CANCELLED
    assert core_types.ERR_RESUME_SEND_FAILED == wire_keys.ERR_RESUME_SEND_FAILED
    assert core_types.ERR_SUBCALL_DEPTH_EXCEEDED == wire_keys.ERR_SUBCALL_DEPTH_EXCEEDED
    assert core_types.ERR_SUBCALL_CYCLE_DETECTED == wire_keys.ERR_SUBCALL_CYCLE_DETECTED
    assert core_types.ERR_EXECUTOR_CRASHED == wire_keys.ERR_EXECUTOR_CRASHED
    assert core_types.ERR_EXECUTOR_WEDGED == wire_keys.ERR_EXECUTOR_WEDGED
    assert core_types.ERR_MEMORY_EXCEEDED == wire_keys.ERR_MEMORY_EXCEEDED
    assert core_types.ERR_PROTOCOL_ERROR == wire_keys.ERR_PROTOCOL_ERROR


def test_the_loss_causes_the_core_knows_are_the_links() -> None:
    """Every cause but ``shutdown`` makes suspects (blockx.worker.link.loss)."""
    from blockx.worker.pool.exits import LOSS_CAUSES

    assert core_types.LOSS_CAUSES_BLAMING | {core_types.LOSS_SHUTDOWN} == LOSS_CAUSES
