"""A task's call cache (``blockx.worker.core.call_cache.CallCache``): the first output of a key
is kept, at most ``limit`` keys, the oldest inserted dropped first -- checked against a
reference model of exactly that (the ``OrderedDict`` the cache replaced) -- and at most
``CALL_CACHE_FIRST_ENTRIES`` until the task repeats a call."""

from __future__ import annotations

from collections import OrderedDict

from hypothesis import given, settings
from hypothesis import strategies as st

from blockx.worker.core.call_cache import CALL_CACHE_FIRST_ENTRIES, CallCache


def test_the_first_output_of_a_key_stays() -> None:
    cache = CallCache()
    cache.put("k", b"1", 4)
    cache.put("k", b"2", 4)
    assert cache.get("k") == b"1" and len(cache) == 1 and "k" in cache


def test_the_oldest_key_is_dropped_past_the_limit_and_a_repeated_put_does_not_refresh_it() -> None:
    cache = CallCache()
    for key in ("a", "b", "c"):
        cache.put(key, key.encode(), 3)
    cache.put("a", b"again", 3)  # kept already: neither replaced nor moved to the back
    cache.put("d", b"d", 3)
    assert (
        len(cache) == 3 and "a" not in cache and repr(cache) == "<CallCache 3 entries, first 4,096>"
    )
    assert cache.get("a") is None and [cache.get(k) for k in "bcd"] == [b"b", b"c", b"d"]


def test_a_miss_is_none() -> None:
    assert CallCache().get("nothing") is None


@settings(max_examples=200, deadline=None)
@given(
    limit=st.integers(min_value=1, max_value=6),
    puts=st.lists(
        st.tuples(st.sampled_from("abcdefghij"), st.binary(min_size=1, max_size=3)), max_size=80
    ),
)
def test_the_cache_matches_a_bounded_first_in_first_out_model(
    limit: int, puts: list[tuple[str, bytes]]
) -> None:
    cache = CallCache()
    model: OrderedDict[str, bytes] = OrderedDict()
    for key, output in puts:
        cache.put(key, output, limit)
        if key not in model:
            if len(model) >= limit:
                model.popitem(last=False)
            model[key] = output
        assert len(cache) == len(model)
        for k in "abcdefghij":
            assert cache.get(k) == model.get(k)


def test_a_task_that_never_repeats_a_call_keeps_only_the_first_bound() -> None:
    cache = CallCache()
    n = CALL_CACHE_FIRST_ENTRIES + 500
    for i in range(n):
        assert cache.get(f"k{i}") is None
        cache.put(f"k{i}", b"x", 65_536)
    assert len(cache) == CALL_CACHE_FIRST_ENTRIES and not cache.grown
    assert cache.get("k499") is None and cache.get("k500") == b"x"  # the oldest went first


def test_a_hit_grows_the_cache_to_its_limit() -> None:
    cache = CallCache()
    for i in range(CALL_CACHE_FIRST_ENTRIES):
        cache.put(f"k{i}", b"x", 65_536)
    assert cache.get("k7") == b"x" and cache.grown
    for i in range(CALL_CACHE_FIRST_ENTRIES, 10_000):
        cache.put(f"k{i}", b"x", 65_536)
    assert len(cache) == 10_000 and cache.get("k0") == b"x"
    assert repr(cache) == "<CallCache 10000 entries, grown>"


def test_grow_keeps_the_full_limit_and_never_more() -> None:
    cache = CallCache()
    cache.grow()
    for i in range(CALL_CACHE_FIRST_ENTRIES + 10):
        cache.put(f"k{i}", b"x", CALL_CACHE_FIRST_ENTRIES + 5)
    assert len(cache) == CALL_CACHE_FIRST_ENTRIES + 5 and cache.get("k4") is None
