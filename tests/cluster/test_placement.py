"""blockx.cluster.placement: the driver's pure bookkeeping, without Ray (issue #21).

Windows bound what a node holds, equal keys meet on one node unless it is saturated,
a lost node's calls come back with a ``node_lost`` attempt (failures once out of
attempts), answers are accepted once per call, instances are interleaved fairly.
"""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from blockx.cluster.placement import FairInterleave, Placed, Placement, hrw_score


def _call(i: int, key: str | None = None) -> Placed:
    return Placed(i, key if key is not None else f"k{i}", ("f", i))


def _fill(p: Placement, start: int, count: int) -> int:
    """Place calls start.. while the budget allows; the next index."""
    i = start
    while i < start + count and p.has_room():
        assert p.place(_call(i)) is not None
        i += 1
    return i


def test_equal_keys_meet_on_one_node_and_keys_spread_over_nodes() -> None:
    p = Placement(max_attempts=3)
    for n in ("a", "b", "c"):
        p.add_node(n, 10_000)
    where: dict[str, set[str]] = {}
    for i in range(3000):
        key = f"key{i % 300}"
        slot = p.place(_call(i, key))
        assert slot is not None
        where.setdefault(key, set()).add(slot.node_id)
    assert all(len(nodes) == 1 for nodes in where.values())
    per_node = Counter(next(iter(v)) for v in where.values())
    assert set(per_node) == {"a", "b", "c"}
    assert min(per_node.values()) > 50  # 300 keys: about 100 each


def test_a_saturated_node_sheds_to_the_least_loaded() -> None:
    p = Placement(max_attempts=3)
    p.add_node("a", 4)
    p.add_node("b", 4)
    p.add_node("c", 4)
    hot = next(
        f"hot{i}"
        for i in range(100)
        if max(("a", "b", "c"), key=lambda n: hrw_score(n, f"hot{i}")) == "a"
    )
    placed = [p.place(_call(i, hot)) for i in range(6)]
    assert [s.node_id for s in placed[:4] if s] == ["a"] * 4
    assert {s.node_id for s in placed[4:] if s} <= {"b", "c"}
    assert p.nodes["a"].outstanding == 4  # never past the window
    # Every window full: nothing placed, nothing changed.
    for i in range(6, 12):
        p.place(_call(i, hot))
    assert p.place(_call(99, hot)) is None
    assert p.outstanding == 12


def test_budget_is_half_the_windows() -> None:
    p = Placement(max_attempts=3)
    p.add_node("a", 100)
    p.add_node("b", 100)
    assert _fill(p, 0, 10_000) == 100
    assert not p.has_room()


def test_batches_grow_while_a_node_is_kept_busy_and_flush_sends_the_rest() -> None:
    p = Placement(max_attempts=3, min_batch=4, max_batch=32)
    p.add_node("a", 1000)
    for i in range(200):
        p.place(_call(i))
    sizes = []
    while True:
        batch = p.take_batch("a", flush=False)
        if batch is None:
            break
        sizes.append(len(batch.calls))
    assert sizes[:4] == [4, 4, 8, 16]  # the first alone in flight, then doubling
    assert max(sizes) == 32
    rest = p.take_batch("a", flush=True)
    assert rest is not None or sum(sizes) == 200
    sent = sum(sizes) + (len(rest.calls) if rest else 0)
    assert sent <= 200


def test_settle_accepts_once_and_drops_a_written_off_batch() -> None:
    p = Placement(max_attempts=3, min_batch=10)
    p.add_node("a", 100)
    p.add_node("b", 100)
    for i in range(20):
        p.place(_call(i))
    a = p.take_batch("a", flush=True)
    b = p.take_batch("b", flush=True)
    assert a is not None and b is not None
    assert p.settle(a.batch_id, "a") is a
    assert p.settle(a.batch_id, "a") is None  # twice: dropped
    left_on_b = {c.index for c in p.nodes["b"].buffered}  # placed, never sent
    p.lose_node("b")
    assert p.settle(b.batch_id, "b") is None  # written off: its calls go elsewhere
    assert p.duplicates_dropped == 2
    assert {c.index for c in p.retry} == {c.index for c in b.calls} | left_on_b


def test_a_lost_node_hands_its_calls_back_with_one_attempt_and_fails_exhausted_ones() -> None:
    p = Placement(max_attempts=2, min_batch=100)
    p.add_node("a", 1000)
    for i in range(10):
        p.place(_call(i))
    first = p.take_batch("a", flush=True)
    assert first is not None
    for i in range(10, 15):  # buffered, never sent
        p.place(_call(i))
    exhausted = p.lose_node("a")
    assert exhausted == []
    assert [c.index for c in p.retry] == list(range(15))
    assert all(p.lost_attempts[i] == 1 for i in range(10))
    assert all(i not in p.lost_attempts for i in range(10, 15))  # never ran: no attempt
    # A second loss: the sent ones run out of attempts (max 2).
    p.add_node("b", 1000)
    assert p.place_retries() == 15
    second = p.take_batch("b", flush=True)
    assert second is not None
    exhausted = p.lose_node("b")
    assert sorted(e.placed.index for e in exhausted) == list(range(10))
    assert all(e.attempts == 2 for e in exhausted)
    assert [c.index for c in p.retry] == list(range(10, 15))


def test_a_node_that_joins_takes_a_share_of_new_keys() -> None:
    p = Placement(max_attempts=3)
    p.add_node("a", 100_000)
    p.add_node("b", 100_000)
    p.add_node("c", 100_000)
    got = Counter()
    for i in range(3000):
        slot = p.place(_call(i))
        assert slot is not None
        got[slot.node_id] += 1
    assert got["c"] > 700


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    calls=st.integers(1, 400),
    nodes=st.integers(1, 4),
    window=st.integers(1, 64),
    max_attempts=st.integers(1, 4),
)
def test_every_call_ends_exactly_once_whatever_is_lost(
    seed: int, calls: int, nodes: int, window: int, max_attempts: int
) -> None:
    """A random schedule of placements, sends, answers, lost batches, lost and new nodes:
    every call is settled once or failed once (node_lost), never both, never twice;
    no window is ever exceeded."""
    rng = random.Random(seed)
    p = Placement(max_attempts=max_attempts, min_batch=2, max_batch=16)
    names = iter(f"n{i}" for i in range(10_000))
    for _ in range(nodes):
        p.add_node(next(names), window)
    in_flight: list[tuple[int, str]] = []
    settled: Counter[int] = Counter()
    failed: Counter[int] = Counter()
    read = 0
    for _step in range(10_000):
        if read == calls and not in_flight and not p.retry and p.outstanding == 0:
            break
        if not p.alive_nodes():
            p.add_node(next(names), window)
        p.place_retries()
        while read < calls and p.has_room() and rng.random() < 0.8:
            assert p.place(_call(read, f"k{rng.randrange(50)}")) is not None
            read += 1
        # the running sums has_room reads agree with the nodes
        alive = p.alive_nodes()
        assert p.outstanding == sum(n.outstanding for n in alive)
        assert p.budget == max(1, sum(n.window for n in alive) // 2)
        assert p.room() == (0 if p.retry else max(0, p.budget - p.outstanding))
        for slot in alive:
            assert slot.outstanding <= slot.window
            batch = p.take_batch(slot.node_id, flush=rng.random() < 0.5 or read == calls)
            if batch is not None:
                in_flight.append((batch.batch_id, slot.node_id))
        if not in_flight:
            continue
        bid, node = in_flight.pop(rng.randrange(len(in_flight)))
        roll = rng.random()
        if roll < 0.8:
            slot = p.nodes[node]
            batch = slot.in_flight.get(bid)
            got = p.settle(bid, node)
            if got is not None:
                assert batch is got
                settled.update(c.index for c in got.calls)
        elif roll < 0.9:
            failed.update(e.placed.index for e in p.lose_batch(bid, node))
        else:
            failed.update(e.placed.index for e in p.lose_node(node))
            if rng.random() < 0.7:
                p.add_node(next(names), window)
    else:
        raise AssertionError("the schedule did not end")
    assert set(settled) | set(failed) == set(range(calls))
    assert not set(settled) & set(failed)
    assert all(n == 1 for n in settled.values())
    assert all(n == 1 for n in failed.values())


def test_fair_interleave_takes_instances_round_robin() -> None:
    fair = FairInterleave()
    for i in range(6):
        fair.push("big", ("big", i))
    fair.push("small", ("small", 0))
    fair.push("other", ("other", 0))
    order = [fair.pop() for _ in range(8)]
    assert order[:3] == [("big", 0), ("small", 0), ("other", 0)]
    assert order[3:] == [("big", i) for i in range(1, 6)]
    assert fair.pop() is None
    assert len(fair) == 0


def test_a_batch_never_mixes_calls_of_different_node_lost_counts() -> None:
    p = Placement(max_attempts=3, min_batch=100)
    p.add_node("a", 1000)
    for i in range(10):
        p.place(_call(i))
    lost = p.take_batch("a", flush=True)
    assert lost is not None and lost.lost_attempts == 0
    p.lose_node("a")  # calls 0..9: one node_lost attempt each
    p.add_node("b", 1000)
    p.place_retries()
    for i in range(10, 20):  # fresh calls, buffered behind the retried ones
        p.place(_call(i))
    first = p.take_batch("b", flush=True)
    second = p.take_batch("b", flush=True)
    assert first is not None and second is not None
    assert [c.index for c in first.calls] == list(range(10)) and first.lost_attempts == 1
    assert [c.index for c in second.calls] == list(range(10, 20))
    assert second.lost_attempts == 0
