"""Instance fairness: max-min fair release across instances (tenants)."""

from __future__ import annotations

from collections import Counter

from dispatcher_harness import make_runtime, specs
from hypothesis import given, settings
from hypothesis import strategies as st

from blockx.worker.core import DispatcherConfig, FailurePolicy, TaskDispatchState, TaskMode
from blockx.worker.core.fairness import ReadyScheduler


def _fair(**kw: object) -> DispatcherConfig:
    return DispatcherConfig(instance_fairness=True, **kw)  # type: ignore[arg-type]


def test_fairness_is_off_by_default() -> None:
    assert DispatcherConfig().instance_fairness is False


def test_instances_share_binds_not_tasks() -> None:
    # Instance "a" has three tasks, "b" one: round-robin over tasks would give
    # "a" three binds in four; max-min fairness gives each instance half.
    rt = make_runtime(_fair(), executors=1, usable_contexts=8)
    for name in ("a1", "a2", "a3"):
        rt.register(name, specs(10), instance="a")
    rt.register("b1", specs(10), instance="b")
    binds = rt.binds(rt.pump())
    per_instance = Counter("a" if b.task_id.startswith("a") else "b" for b in binds)
    assert per_instance == {"a": 4, "b": 4}
    a_tasks = [b.task_id for b in binds if b.task_id.startswith("a")]
    assert sorted(a_tasks[:3]) == ["a1", "a2", "a3"]  # round-robin inside an instance


def test_without_fairness_tasks_are_round_robin() -> None:
    rt = make_runtime(DispatcherConfig(), executors=1, usable_contexts=8)
    for name in ("a1", "a2", "a3"):
        rt.register(name, specs(10), instance="a")
    rt.register("b1", specs(10), instance="b")
    per_instance = Counter(b.task_id[0] for b in rt.binds(rt.pump()))
    assert per_instance == {"a": 6, "b": 2}


def test_the_instance_with_fewest_calls_in_flight_is_served_first() -> None:
    rt = make_runtime(_fair(), executors=1, usable_contexts=6)
    rt.register("a", specs(10), instance="a")
    assert len(rt.binds(rt.pump())) == 6  # "a" alone fills the executor
    rt.register("b", specs(10), instance="b")
    for call_id in ("a/c0", "a/c1", "a/c2"):
        rt.complete(call_id)
    binds = rt.binds(rt.pump())
    assert [b.task_id for b in binds] == ["b", "b", "b"]  # b: 0 in flight < a: 3
    rt.complete("a/c3")
    rt.complete("b/c0")
    binds = rt.binds(rt.pump())
    # a: 2, b: 2 in flight -> tie, b was served last -> a first, then b.
    assert [b.task_id for b in binds] == ["a", "b"]


def test_max_min_converges_to_equal_shares() -> None:
    rt = make_runtime(_fair(), executors=2, usable_contexts=10)
    for inst in ("x", "y", "z", "w"):
        rt.register(inst, specs(100), instance=inst)
    for _ in range(30):
        rt.pump()
        inflight = Counter(c.split("/")[0] for c in rt.running)
        assert len(rt.running) == 20
        assert max(inflight.values()) - min(inflight.values()) <= 1, inflight
        # Instance x finishes calls fast, the others slowly: x must still get
        # no more than its share of the 20 slots.
        for call_id in [c for c in rt.running if c.startswith("x/")][:3]:
            rt.complete(call_id)
        for call_id in [c for c in rt.running if not c.startswith("x/")][:1]:
            rt.complete(call_id)
        rt.core.check_invariants()


def test_tasks_without_an_instance_are_their_own_instance() -> None:
    rt = make_runtime(_fair(), executors=1, usable_contexts=4)
    rt.register("t1", specs(5))
    rt.register("t2", specs(5))
    assert Counter(b.task_id for b in rt.binds(rt.pump())) == {"t1": 2, "t2": 2}


def test_an_instance_is_forgotten_with_its_last_task() -> None:
    rt = make_runtime(_fair())
    rt.register("t1", specs(1), instance="a")
    rt.pump()
    rt.complete("t1/c0")
    rt.pump()
    assert rt.core._core.scheduler.instance("a") is None


def _brute_force_instance(tasks: list, window: int) -> str | None:  # type: ignore[type-arg]
    candidates = {
        t.instance.key: t.instance
        for t in tasks
        if t.ready_queue and not t.stop_dispatching and t.inflight_roots < window
    }
    if not candidates:
        return None
    best = min(candidates.values(), key=lambda i: (i.inflight, i.last_served, i.key))
    return best.key


@settings(max_examples=300, deadline=None)
@given(
    layout=st.lists(st.sampled_from("abcde"), min_size=1, max_size=8),
    ops=st.lists(
        st.tuples(
            st.sampled_from(["bind", "bind", "release", "add", "stop", "replace"]),
            st.integers(0, 7),
        ),
        max_size=80,
    ),
    window=st.integers(1, 3),
)
def test_max_min_pick_matches_a_brute_force_minimum(
    layout: list[str], ops: list[tuple[str, int]], window: int
) -> None:
    config = DispatcherConfig(instance_fairness=True, task_max_inflight_calls=window)
    scheduler = ReadyScheduler(config)

    def new_task(name: str, key: str) -> TaskDispatchState:
        task = TaskDispatchState(
            task_id=name,
            mode=TaskMode.ONE_SHOT,
            instance=scheduler.acquire_instance(key),
            max_attempts=1,
            base_backoff_ms=0,
            call_budget_ms=0,
            failure_policy=FailurePolicy.CONTINUE,
        )
        task.ready_queue.extend(range(3))  # type: ignore[arg-type]
        scheduler.wake(task)
        return task

    tasks = [new_task(f"t{n}", key) for n, key in enumerate(layout)]
    for op, n in ops:
        task = tasks[n % len(tasks)]
        if op == "replace" and not task.inflight_roots:
            # The task converges and a new one of the same instance arrives
            # (possibly re-creating the instance record).
            scheduler.remove_task(task)
            tasks[n % len(tasks)] = new_task(f"{task.task_id}+", task.instance.key)
            continue
        if op == "bind":
            expected = _brute_force_instance(tasks, window)
            picked = scheduler.pick()
            assert (None if picked is None else picked.instance.key) == expected
            if picked is not None:
                picked.ready_queue.popleft()
                picked.inflight_roots += 1
                scheduler.note_bind(picked)
                scheduler.served(picked)
        elif op == "release" and task.inflight_roots:
            task.inflight_roots -= 1
            scheduler.note_release(task)
            if task.ready_queue:
                scheduler.wake(task)
        elif op == "add":
            task.ready_queue.append(0)  # type: ignore[arg-type]
            scheduler.wake(task)
        elif op == "stop":
            task.stop_dispatching = True
        assert scheduler.check_invariants() == []
