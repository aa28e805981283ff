"""blockx.cluster.placement: the driver's pure bookkeeping, without Ray (issue #21).

Windows bound what a node holds, equal keys meet on one node unless it is saturated,
a lost node's calls come back with a ``node_lost`` attempt (failures once out of
attempts), answers are accepted once per call.
"""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from blockx.cluster.placement import Placed, Placement, hrw_score


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
    """A random schedule of placements, sends, answers, lost batches, lost and new nodes,
    a stop (the unsent calls cancelled): every call is settled once or failed once
    (node_lost) or cancelled unsent, never two of these, never twice; no window is ever
    exceeded; the rows leave in call order, each once, and the calls read and not
    written never exceed the reorder limit (the pointer never sticks: all written)."""
    rng = random.Random(seed)
    p = Placement(max_attempts=max_attempts, min_batch=2, max_batch=16)
    names = iter(f"n{i}" for i in range(10_000))
    for _ in range(nodes):
        p.add_node(next(names), window)
    in_flight: list[tuple[int, str]] = []
    settled: Counter[int] = Counter()
    failed: Counter[int] = Counter()
    cancelled: set[int] = set()
    written: list[int] = []
    read = 0
    stopped = False
    limit_seen = 0
    for _step in range(10_000):
        written.extend(p.take_writable())
        limit_seen = max(limit_seen, p.reorder_limit)
        if (read == calls or stopped) and not in_flight and not p.retry and p.outstanding == 0:
            break
        if not p.alive_nodes():
            p.add_node(next(names), window)
        p.place_retries()
        while read < calls and not stopped and p.has_room() and rng.random() < 0.8:
            assert p.place(_call(read, f"k{rng.randrange(50)}")) is not None
            read += 1
            assert p.unwritten <= p.reorder_limit
            limit_seen = max(limit_seen, p.reorder_limit)
        if not stopped and rng.random() < 0.002:  # fast_fail or a signal: nothing more sent
            stopped = True
            before = {c.index for n in p.alive_nodes() for c in n.buffered} | {
                c.index for c in p.retry
            }
            assert p.cancel_unsent() == len(before)
            cancelled |= before
        # the running sums has_room reads agree with the nodes
        alive = p.alive_nodes()
        assert p.outstanding == sum(n.outstanding for n in alive)
        assert p.budget == max(1, sum(n.window for n in alive) // 2)
        assert p.room() == (
            0 if p.retry else max(0, min(p.budget - p.outstanding, p.reorder_limit - p.unwritten))
        )
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
            # The output of a call: its index (the row), None for a failed call (no row).
            outputs = None if batch is None else [c.index for c in batch.calls]
            got = p.settle(bid, node, outputs)
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
    written.extend(p.take_writable())
    assert set(settled) | set(failed) | cancelled == set(range(read))
    assert not set(settled) & set(failed)
    assert not (set(settled) | set(failed)) & cancelled
    assert stopped or read == calls
    # Rows in call order, each once: exactly the settled calls'; nothing left behind.
    assert written == sorted(settled)
    assert p.next_to_write == read and not p.ended and p.unwritten == 0
    # (Nothing read at all when the run stopped at its first step.)
    assert (read == 0 or 0 < p.unwritten_peak) and p.unwritten_peak <= max(
        limit_seen, p.reorder_limit
    )
    assert all(n == 1 for n in settled.values())
    assert all(n == 1 for n in failed.values())


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


def test_rows_leave_in_call_order_and_a_straggler_stops_the_reading_at_the_limit() -> None:
    """Batch 1 (call 0) straggles while node b settles thousands of calls: their rows wait
    for call 0, the reading stops at the reorder limit (calls read and not written), and
    once call 0 settles every row leaves in call order."""
    p = Placement(max_attempts=3, min_batch=1, max_batch=1, reorder_windows=2)
    p.add_node("a", 1)  # holds the straggler: its window is full from then on
    p.add_node("b", 8)
    assert p.reorder_limit == 18
    straggler = p.place(_call(0, "x"))
    assert straggler is not None
    first = p.take_batch(straggler.node_id, flush=True)
    assert first is not None and first.calls[0].index == 0
    read, written = 1, []
    for _ in range(5_000):
        read = _fill(p, read, 1)
        for slot in p.alive_nodes():
            batch = p.take_batch(slot.node_id, flush=True)
            if batch is not None and batch.batch_id != first.batch_id:
                assert p.settle(batch.batch_id, slot.node_id, [c.index for c in batch.calls])
        written.extend(p.take_writable())
        assert p.unwritten <= p.reorder_limit
    assert written == []  # nothing passes call 0
    assert read == p.reorder_limit and p.unwritten_peak == p.reorder_limit
    assert not p.has_room()
    assert p.settle(first.batch_id, first.node_id, [b"0"]) is first
    assert p.take_writable() == [b"0", *range(1, read)]
    assert p.unwritten == 0 and p.has_room()


def test_lost_exhausted_and_cancelled_calls_close_their_slots() -> None:
    """A call out of node_lost attempts and calls cancelled unsent have no row, but the
    pointer moves past them."""
    p = Placement(max_attempts=1, min_batch=4, max_batch=4)
    p.add_node("a", 100)
    p.add_node("b", 100)
    _fill(p, 0, 10)
    a = p.take_batch("a", flush=True)
    b = p.take_batch("b", flush=True)
    assert a is not None and b is not None
    lost = p.lose_node("a")  # max_attempts=1: its sent calls fail, its buffered come back
    assert {x.placed.index for x in lost} == {c.index for c in a.calls}
    assert p.settle(b.batch_id, "b", [f"r{c.index}" for c in b.calls]) is b
    unsent = p.cancel_unsent()
    assert unsent == 10 - len(a.calls) - len(b.calls)
    assert p.take_writable() == [f"r{c.index}" for c in b.calls]
    assert p.next_to_write == 10 and p.unwritten == 0
