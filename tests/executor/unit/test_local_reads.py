"""The executor's per-task immutable-read cache (executor/local_reads.py): bounds,
first-in-first-out eviction, fresh copies, what is never kept, and its settings."""

from __future__ import annotations

import pytest

from blockx.executor.local_reads import (
    DEFAULT_LOCAL_READ_CACHE,
    DEFAULT_LOCAL_READ_CACHE_BYTES,
    ENTRY_OVERHEAD,
    FIRST_ENTRIES,
    LOCAL_READ_CACHE_BYTES_ENV,
    LOCAL_READ_CACHE_ENV,
    MISS,
    TaskReads,
    read_key,
)
from blockx.executor.module_registry import ModuleRegistry, local_read_cache_from_env


def test_kept_values_come_back_and_none_is_a_value() -> None:
    reads = TaskReads(10, 1 << 20)
    assert reads.get("k") is MISS
    for key, value in [("s", "0x10"), ("i", 7), ("f", 1.5), ("b", True), ("n", None)]:
        assert reads.put(key, value)
        assert reads.get(key) == value and reads.get(key) is not MISS
    assert len(reads) == 5


def test_objects_and_arrays_are_fresh_copies() -> None:
    reads = TaskReads(10, 1 << 20)
    block = {"number": "0x7", "transactions": ["0xaa"]}
    assert reads.put("block", block)
    block["number"] = "changed"  # the first caller's own object
    first = reads.get("block")
    first["transactions"].append("mine")
    assert reads.get("block") == {"number": "0x7", "transactions": ["0xaa"]}
    assert reads.get("block") is not reads.get("block")


def test_values_json_cannot_hold_exactly_are_not_kept() -> None:
    reads = TaskReads(10, 1 << 20)
    assert not reads.put("big", 2**70)
    assert not reads.put("bigs", [2**70])
    assert not reads.put("bytes", {"data": b"\x00"})
    assert reads.get("big") is MISS and len(reads) == 0


def test_first_in_first_out_by_entries() -> None:
    reads = TaskReads(3, 1 << 20)
    for i in range(5):
        assert reads.put(f"k{i}", i)
    assert [reads.get(f"k{i}") for i in range(5)] == [MISS, MISS, 2, 3, 4]
    assert reads.evictions == 2 and len(reads) == 3


def test_a_task_keeps_the_first_bound_until_its_first_hit() -> None:
    reads = TaskReads(10_000, 1 << 30)
    for i in range(FIRST_ENTRIES + 10):
        assert reads.put(f"k{i}", i)
    assert len(reads) == FIRST_ENTRIES and reads.get("k9") is MISS
    assert reads.get(f"k{FIRST_ENTRIES}") == FIRST_ENTRIES  # a hit: the full bound
    for i in range(FIRST_ENTRIES + 10, 3000):
        assert reads.put(f"k{i}", i)
    assert len(reads) == 3000 - 10 and reads.evictions == 10


def test_replacing_a_key_keeps_one_entry_and_the_order_compact() -> None:
    reads = TaskReads(10, 1 << 20)
    for i in range(1000):
        assert reads.put("k", i)
    assert reads.get("k") == 999 and len(reads) == 1 and reads.evictions == 0
    assert len(reads._order) <= 2 * len(reads) + 64
    assert reads.nbytes == ENTRY_OVERHEAD + 1


def test_bounded_by_bytes_and_too_large_answers_are_not_kept() -> None:
    size = ENTRY_OVERHEAD + 2 + 100  # key "kN" + a 100-character answer
    reads = TaskReads(100, 4 * size)
    for i in range(6):
        assert reads.put(f"k{i}", "x" * 100)
    assert reads.nbytes <= 4 * size and len(reads) == 4
    assert reads.get("k0") is MISS and reads.get("k5") == "x" * 100
    assert not reads.put("huge", "x" * (4 * size))  # more than a quarter of the bound
    # replacing a key does not count it twice
    before = reads.nbytes
    assert reads.put("k5", "x" * 100)
    assert reads.nbytes == before


def test_drop_backend_forgets_only_that_backend() -> None:
    reads = TaskReads(10, 1 << 20)
    reads.put(read_key("rpc", "eth_getBalance", "a"), "0x1")
    reads.put(read_key("rpc", "eth_getCode", "b"), "0x")
    reads.put(read_key("rpcx", "get", "c"), 1)
    assert reads.drop_backend("rpc") == 2
    assert reads.get(read_key("rpcx", "get", "c")) == 1
    assert reads.get(read_key("rpc", "eth_getBalance", "a")) is MISS


def test_a_task_keeps_its_reads_while_its_namespaces_are_kept() -> None:
    registry = ModuleRegistry(released_namespace_cache=1, local_read_cache=(10, 1 << 20))
    reads = registry.acquire_task("t1")
    assert reads is not None
    reads.put("k", 1)
    assert registry.acquire_task("t1") is reads  # a second call of the task: the same cache
    assert registry.acquire_task("t2") is not reads  # another task: its own
    registry.release_task("t1")
    registry.release_task("t1")
    # Released without a module: nothing kept, the reads go with the namespaces.
    fresh = registry.acquire_task("t1")
    assert fresh is not None and fresh.get("k") is MISS


def test_off_when_either_bound_is_zero() -> None:
    assert ModuleRegistry(local_read_cache=(0, 100)).acquire_task("t") is None
    assert ModuleRegistry(local_read_cache=(10, 0)).acquire_task("t") is None


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, (DEFAULT_LOCAL_READ_CACHE, DEFAULT_LOCAL_READ_CACHE_BYTES)),
        ({LOCAL_READ_CACHE_ENV: "0"}, (0, DEFAULT_LOCAL_READ_CACHE_BYTES)),
        ({LOCAL_READ_CACHE_ENV: "12", LOCAL_READ_CACHE_BYTES_ENV: "4096"}, (12, 4096)),
        (
            {LOCAL_READ_CACHE_ENV: "many"},
            (DEFAULT_LOCAL_READ_CACHE, DEFAULT_LOCAL_READ_CACHE_BYTES),
        ),
        (
            {LOCAL_READ_CACHE_BYTES_ENV: "-1"},
            (DEFAULT_LOCAL_READ_CACHE, DEFAULT_LOCAL_READ_CACHE_BYTES),
        ),
    ],
)
def test_settings_from_the_environment(env: dict[str, str], expected: tuple[int, int]) -> None:
    assert local_read_cache_from_env(env) == expected
