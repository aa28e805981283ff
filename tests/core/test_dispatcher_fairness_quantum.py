"""InstanceFairnessQuantum: binds served to one instance before it is re-picked."""

from __future__ import annotations

import pytest
from dispatcher_harness import make_runtime, specs

from blockx.worker.core import ConfigError, DispatcherConfig


def _order(quantum: int, calls: int = 12) -> list[str]:
    config = DispatcherConfig(instance_fairness=True, instance_fairness_quantum=quantum)
    rt = make_runtime(config, executors=1, usable_contexts=calls)
    rt.register("a", specs(calls), instance="a")
    rt.register("b", specs(calls), instance="b")
    return [b.task_id for b in rt.binds(rt.pump())]


@pytest.mark.parametrize("quantum", [0, 1])
def test_quantum_zero_and_one_repick_for_every_call(quantum: int) -> None:
    assert _order(quantum, 6) == ["a", "b", "a", "b", "a", "b"]


def test_quantum_keeps_the_turn_for_that_many_binds() -> None:
    assert "".join(_order(4)) == "aaaabbbbaaaa"


def test_quantum_turn_ends_early_when_the_instance_runs_dry() -> None:
    config = DispatcherConfig(instance_fairness=True, instance_fairness_quantum=4)
    rt = make_runtime(config, executors=1, usable_contexts=10)
    rt.register("a", specs(2), instance="a")
    rt.register("b", specs(6), instance="b")
    assert "".join(b.task_id for b in rt.binds(rt.pump())) == "aabbbbbb"


def test_only_binds_spend_the_quantum() -> None:
    config = DispatcherConfig(instance_fairness=True, instance_fairness_quantum=2)
    rt = make_runtime(config, executors=1)
    rt.register("a", specs(3), instance="a")
    rt.register("b", specs(3), instance="b")
    scheduler = rt.core._core.scheduler
    a = rt.core.task_state("a")
    assert a is not None and scheduler.pick() is a
    scheduler.note_bind(a)
    scheduler.served(a)
    for _ in range(5):  # cache hits: decisions without a bind
        assert scheduler.pick() is a
        scheduler.served(a)
    scheduler.note_bind(a)
    assert scheduler.pick() is rt.core.task_state("b")


def test_a_turn_spans_dispatch_rounds_until_its_binds_are_spent() -> None:
    config = DispatcherConfig(instance_fairness=True, instance_fairness_quantum=4)
    rt = make_runtime(config, executors=1, usable_contexts=2)
    rt.register("a", specs(10), instance="a")
    assert len(rt.binds(rt.pump())) == 2
    rt.register("b", specs(10), instance="b")
    rt.complete("a/c0")
    rt.complete("a/c1")
    # b has fewer calls in flight, but a's turn still has 2 of its 4 binds.
    assert [b.task_id for b in rt.binds(rt.pump())] == ["a", "a"]
    rt.complete("a/c2")
    rt.complete("a/c3")
    # a's turn is spent; both have 0 in flight and b was served least recently.
    assert [b.task_id for b in rt.binds(rt.pump())] == ["b", "b"]


def test_quantum_is_capped_at_1024() -> None:
    assert DispatcherConfig(instance_fairness_quantum=5000).fairness_quantum == 1024
    assert DispatcherConfig(instance_fairness_quantum=1024).fairness_quantum == 1024
    assert DispatcherConfig(instance_fairness_quantum=0).fairness_quantum == 1
    with pytest.raises(ConfigError, match="instance_fairness_quantum"):
        DispatcherConfig(instance_fairness_quantum=-1)
