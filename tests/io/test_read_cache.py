"""The worker's per-task read cache (``blockx.worker.io.cache.ReadCache``) on its own:
invalidation by generations, its bounds, and the CLOCK order's dead entries."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from blockx.worker.io.cache import READ_CACHE_FIRST_ENTRIES, ReadCache
from blockx.worker.io.handler import IOResult


def _put(cache: ReadCache, key: str, value: Any, domain: str | None = "d", size: int = 10) -> bool:
    return cache.put(key, IOResult(result=value), "b", domain, cache.generation("b", domain), size)


def test_a_write_to_a_domain_makes_its_entries_stale_and_only_its_own() -> None:
    cache = ReadCache(max_entries=100, max_bytes=100_000)
    _put(cache, "p", "price", "prices")
    _put(cache, "t", "token", "tokens")
    cache.invalidate("b", "prices")
    assert cache.get("p") is None and len(cache) == 1  # dropped by the lookup
    hit = cache.get("t")
    assert hit is not None and hit.result == "token"
    cache.invalidate("b", None)  # the whole backend
    assert cache.get("t") is None and len(cache) == 0 and cache.size_bytes == 0
    # A read that started before a write is not stored after it.
    started = cache.generation("b", "prices")
    cache.invalidate("b", "prices")
    assert not cache.put("late", IOResult(result=1), "b", "prices", started, 1)
    # Another backend's generations are its own.
    assert cache.put(
        "o", IOResult(result=2), "other", "prices", cache.generation("other", "prices"), 1
    )
    assert cache.get("o") is not None


def test_replacing_an_entry_keeps_one_live_entry_and_the_order_compact() -> None:
    cache = ReadCache(max_entries=10, max_bytes=100_000)
    for i in range(1000):
        assert _put(cache, "k", i)
    got = cache.get("k")
    assert got is not None and got.result == 999 and len(cache) == 1
    assert cache.size_bytes == 10 + 1 + 160  # one entry's size: nbytes + key + overhead
    assert len(cache._order) <= 2 * len(cache) + 64  # replaced entries are compacted away


def test_clear_empties_the_cache() -> None:
    cache = ReadCache(max_entries=10, max_bytes=100_000)
    for i in range(5):
        _put(cache, f"k{i}", i)
    cache.clear()
    assert len(cache) == 0 and cache.size_bytes == 0 and cache.get("k1") is None
    assert _put(cache, "k1", 1) and len(cache) == 1


_KEYS = st.sampled_from(["a", "b", "c", "d", "e", "f"])
_DOMAINS = st.sampled_from(["x", "y", None])
_OPS = st.one_of(
    st.tuples(st.just("put"), _KEYS, _DOMAINS, st.integers(min_value=1, max_value=400)),
    st.tuples(st.just("get"), _KEYS),
    st.tuples(st.just("invalidate"), _DOMAINS),
)


@settings(max_examples=300, deadline=None)
@given(
    max_entries=st.integers(min_value=1, max_value=5),
    max_bytes=st.integers(min_value=200, max_value=1500),
    ops=st.lists(_OPS, max_size=60),
)
def test_a_hit_is_always_the_latest_answer_stored_since_the_last_write_to_its_domain(
    max_entries: int, max_bytes: int, ops: list[tuple[Any, ...]]
) -> None:
    cache = ReadCache(max_entries=max_entries, max_bytes=max_bytes)
    # What a hit may answer: the key's latest stored (value, domain, write count seen).
    latest: dict[str, tuple[int, str | None, int, int]] = {}
    writes: dict[str | None, int] = {"x": 0, "y": 0, None: 0}
    serial = 0
    for op in ops:
        if op[0] == "put":
            _, key, domain, size = op
            serial += 1
            if _put(cache, key, serial, domain, size):
                latest[key] = (serial, domain, writes[domain], writes[None])
        elif op[0] == "get":
            hit = cache.get(op[1])
            if hit is not None:
                value, domain, seen, seen_all = latest[op[1]]
                assert hit.result == value
                assert writes[domain] == seen and writes[None] == seen_all  # never stale
        else:
            domain = op[1]
            cache.invalidate("b", domain)
            writes[domain] += 1
        assert len(cache) <= max_entries and cache.size_bytes <= max_bytes
        assert cache.size_bytes == sum(e.size for e in cache._entries.values())
        assert len(cache._order) <= 2 * len(cache) + 64 + 1
    # Nothing stored twice under one key, and every live entry is in the order once.
    live = [e for e in cache._order if e.alive]
    assert sorted(id(e) for e in live) == sorted(id(e) for e in cache._entries.values())
    assert READ_CACHE_FIRST_ENTRIES >= max_entries
