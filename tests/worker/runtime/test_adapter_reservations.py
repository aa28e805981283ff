"""Reservations: sans-IO, no sockets, no clock."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blockx.worker.errors import ParentNotResidentError
from blockx.worker.link.reservations import LostCall, Reservations


def test_bind_unbind_and_terminal_release_are_idempotent() -> None:
    r = Reservations("exec-0", era=1)
    r.bind("a")
    r.bind("b")
    assert len(r) == 2 and "a" in r and r.is_live("a")
    assert r.release_on_terminal("a", 1) is True
    assert r.release_on_terminal("a", 1) is False
    assert r.unbind("a") is False
    assert r.unbind("b") is True and r.unbind("b") is False
    assert len(r) == 0


def test_draining_blocks_unbind_and_subcalls_until_the_terminal_frame() -> None:
    r = Reservations("exec-0", era=1)
    r.bind("p")
    r.bind_subcall("p/sub-1", "p")
    assert r.parent_of("p/sub-1") == "p"
    assert r.mark_draining("p")
    assert not r.is_live("p") and r.is_draining("p") and r.draining_count == 1
    with pytest.raises(ParentNotResidentError) as info:
        r.bind_subcall("p/sub-2", "p")
    assert info.value.parent_call_id == "p" and info.value.error_kind == (
        "subcall_parent_not_resident"
    )
    assert r.unbind("p") is False and "p" in r
    assert r.release_on_terminal("p", 1) is True
    assert not r.is_draining("p") and r.draining_count == 0
    assert r.mark_draining("ghost") is False


def test_rebinding_a_draining_call_makes_it_live_again() -> None:
    r = Reservations("exec-0", era=1)
    r.bind("c")
    r.mark_draining("c")
    r.bind("c")
    assert r.is_live("c") and len(r) == 1


def test_subcall_needs_a_reserved_parent() -> None:
    r = Reservations("exec-0", era=1)
    with pytest.raises(ParentNotResidentError):
        r.bind_subcall("x/sub-1", "x")
    assert len(r) == 0


def test_terminal_frame_of_an_older_attempt_is_stale() -> None:
    r = Reservations("exec-0", era=1)
    r.bind("c")
    r.note_dispatched("c", 1)
    r.note_dispatched("c", 2)
    assert r.dispatched_attempt("c") == 2
    assert r.release_on_terminal("c", 1) is False
    assert r.release_on_terminal("c", 2) is True
    # A frame without a usable attemptSeq releases: the executor is the truth.
    r.bind("d")
    r.note_dispatched("d", 3)
    assert r.release_on_terminal("d", None) is True


def test_note_dispatched_ignores_unreserved_calls() -> None:
    r = Reservations("exec-0", era=1)
    r.note_dispatched("ghost", 1)
    assert r.dispatched_attempt("ghost") is None


def test_take_all_ends_the_era_in_bind_order() -> None:
    r = Reservations("exec-0", era=3)
    r.bind("a")
    r.note_dispatched("a", 2)
    r.bind_subcall("a/sub-1", "a")
    r.bind("b")
    r.mark_draining("b")
    assert r.take_all() == (
        LostCall("a", 2, None, False),
        LostCall("a/sub-1", None, "a", False),
        LostCall("b", None, None, True),
    )
    assert len(r) == 0 and r.draining_count == 0 and r.take_all() == ()
    assert "era=3" in repr(r)


_calls = st.sampled_from(["a", "b", "c", "a/sub-1", "b/sub-1"])
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("bind"), _calls),
        st.tuples(st.just("bind_subcall"), _calls),
        st.tuples(st.just("unbind"), _calls),
        st.tuples(st.just("drain"), _calls),
        st.tuples(st.just("dispatch"), _calls, st.integers(1, 3)),
        st.tuples(st.just("terminal"), _calls, st.integers(1, 3)),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(_ops)
def test_invariants_hold_across_any_sequence(ops: list[tuple]) -> None:
    r = Reservations("exec-0", era=1)
    for op in ops:
        kind, call_id = op[0], op[1]
        if kind == "bind":
            r.bind(call_id)
        elif kind == "bind_subcall":
            parent = call_id.split("/")[0]
            try:
                r.bind_subcall(call_id + "/x", parent)
            except ParentNotResidentError:
                assert not r.is_live(parent)
        elif kind == "unbind":
            was_draining = r.is_draining(call_id)
            r.unbind(call_id)
            assert (call_id in r) == was_draining
        elif kind == "drain":
            r.mark_draining(call_id)
        elif kind == "dispatch":
            r.note_dispatched(call_id, op[2])
        else:
            r.release_on_terminal(call_id, op[2])
        reserved = set(r.call_ids())
        assert len(reserved) == len(r)
        assert r.draining_count <= len(r)
        for c in list(reserved):
            assert r.is_live(c) != r.is_draining(c)
            attempt = r.dispatched_attempt(c)
            assert attempt is None or 1 <= attempt <= 3
    lost = r.take_all()
    assert len(r) == 0 and len({c.call_id for c in lost}) == len(lost)
