"""ModuleRegistry: entry resolution, PRELUDE, per-task namespaces, the compile LRU, code
fetch with singleflight and digest checks, syntax errors and tracebacks of user code."""

from __future__ import annotations

import gc
import linecache
import logging
import signal
from textwrap import dedent
from typing import Any

import pytest
from executor_harness import Harness, digest_of

from blockx.executor import module_registry
from blockx.executor.deadline import on_deadline_signal
from blockx.executor.module_registry import (
    RELEASED_NAMESPACE_CACHE_ENV,
    ModuleRegistry,
    code_cache_max_entries_from_env,
    released_namespace_cache_from_env,
    resolve_entry_name,
)
from blockx.wire import keys

READ = dedent(
    """
    from blockx.sdk import db

    def _(p):
        return db.get("t", p)
    """
)


class TestEntryResolution:
    @pytest.mark.parametrize(
        ("defs", "alias", "selector", "function_id", "expected"),
        [
            (("helper", "main"), False, "main", "x", "main"),
            (("helper", "_"), False, "missing", "x", "_"),
            (("adder", "_"), False, "", "pkg/adder", "adder"),
            (("adder", "_"), False, "", "pkg.mod.adder", "adder"),
            (("adder", "_"), False, "", "tasks/a.b/adder", "adder"),
            (("helper", "_"), False, "", "pkg/other", "_"),
            (("helper",), True, "", "pkg/other", "_"),
            (("_private", "public", "later"), False, "", "x", "public"),
            (("_private",), False, "", "x", None),
            ((), False, "", "x", None),
            (("helper",), True, "_", "x", "_"),
        ],
    )
    def test_the_rules_in_order(
        self,
        defs: tuple[str, ...],
        alias: bool,
        selector: str,
        function_id: str,
        expected: str | None,
    ) -> None:
        assert resolve_entry_name(defs, alias, selector, function_id) == expected

    def test_entry_selector_wins_when_it_names_a_def(self, h: Harness) -> None:
        source = "def _(p):\n    return 'underscore'\ndef main(p):\n    return 'main'\n"
        h.execute("c1", source, None, entry_selector="main")
        h.run()
        assert h.output("c1") == "main"

    def test_the_function_ids_last_segment(self, h: Harness) -> None:
        source = "def _(p):\n    return 'underscore'\ndef adder(p):\n    return 'adder'\n"
        h.execute("c1", source, None, function_id="tenant/pkg.adder")
        h.run()
        assert h.output("c1") == "adder"

    def test_an_underscore_alias(self, h: Harness) -> None:
        source = "def compute(p):\n    return 'compute'\ndef first(p):\n    return 'first'\n_ = compute\n"
        h.execute("c1", source, None, function_id="zzz")
        h.run()
        assert h.output("c1") == "compute"

    def test_the_first_public_def(self, h: Harness) -> None:
        source = "def _helper(p):\n    return 0\nasync def co(p):\n    return 1\ndef go(p):\n    return 'go'\n"
        h.execute("c1", source, None, function_id="zzz")
        h.run()
        assert h.output("c1") == "go"

    def test_a_module_without_an_entry_is_a_user_error(self, h: Harness) -> None:
        h.execute("c1", "X = 1\ndef _hidden(p):\n    return 1\n", None)
        h.run()
        failure = h.failure("c1")
        assert failure[keys.FP_ERROR_KIND] == keys.ERR_USER_ERROR
        assert failure[keys.FP_RETRYABLE] is False
        assert "no entry function" in failure[keys.FP_ERROR_MESSAGE]

    def test_an_entry_rebound_to_a_non_function_is_a_user_error(self, h: Harness) -> None:
        h.execute("c1", "def _(p):\n    return 1\n_ = 5\n", None)
        h.run()
        assert "not a function" in h.failure("c1")[keys.FP_ERROR_MESSAGE]


class TestPrelude:
    def test_prelude_names_need_no_import(self, h: Harness) -> None:
        source = dedent(
            """
            def _(p):
                return [json.__name__, Decimal.__name__, datetime.__name__, date.__name__,
                        function.__name__]
            """
        )
        h.execute("c1", source, None)
        h.run()
        assert h.output("c1") == ["json", "Decimal", "datetime", "date", "blockx.function"]

    def test_other_parts_of_blockx_can_extend_the_prelude(
        self, make_harness, monkeypatch: pytest.MonkeyPatch
    ) -> None:  # type: ignore[no-untyped-def]
        monkeypatch.setitem(module_registry.PRELUDE, "Extra", "added later")
        registry = ModuleRegistry()
        assert registry.prelude is module_registry.PRELUDE
        h = make_harness(registry=registry)
        h.execute("c1", "def _(p):\n    return Extra\n", None)
        h.run()
        assert h.output("c1") == "added later"


COUNTER = dedent(
    """
    from blockx.sdk import db

    SEEN = []

    def _(p):
        SEEN.append(p)
        if p == "hold":
            db.get("t", 1)
        return len(SEEN)
    """
)


class TestNamespaces:
    def test_module_globals_are_shared_within_a_task_and_isolated_between_tasks(
        self, h: Harness
    ) -> None:
        h.execute("hold", COUNTER, "hold", task_id="t1")  # keeps t1 resident
        h.run()
        h.execute("a1", COUNTER, "a", task_id="t1")
        h.execute("b1", COUNTER, "b", task_id="t2")
        h.run()
        assert h.output("a1") == 2
        assert h.output("b1") == 1
        assert len(h.code_waits) == 1  # compiled once, shared by digest

    def test_without_the_released_cache_a_namespace_is_freed_with_its_last_call(
        self, make_harness
    ) -> None:  # type: ignore[no-untyped-def]
        h = make_harness(released_namespaces=0)  # the seed's rule, exactly
        digest = h.add_source(COUNTER)
        h.execute("hold", COUNTER, "hold", task_id="t1")
        h.run()
        assert h.rt.registry.has_namespace("t1", digest)
        h.resume(h.last_wait("hold"), None)
        h.run()
        assert not h.rt.registry.has_namespace("t1", digest)
        assert h.rt.registry.task_count() == 0
        h.execute("again", COUNTER, "x", task_id="t1")
        h.run()
        assert h.output("again") == 1  # a fresh module: SEEN starts empty
        assert len(h.code_waits) == 1  # but no second fetch
        assert h.rt.registry.stats()["module_execs"] == 2


ONE_AT_A_TIME = dedent(
    """
    import weakref

    class Box:
        pass

    BOX = Box()
    record(weakref.ref(BOX))  # once per execution of the module body
    SEEN = []

    def _(p):
        SEEN.append(p)
        return len(SEEN)
    """
)


class TestReleasedNamespaces:
    """A task with one call in flight at a time keeps its namespace between calls."""

    def _call(self, h: Harness, call_id: str, task_id: str) -> Any:
        h.execute(call_id, ONE_AT_A_TIME, call_id, task_id=task_id)
        h.run()
        return h.output(call_id)

    def test_a_tasks_next_call_reuses_its_namespace(self, h: Harness) -> None:
        digest = h.add_source(ONE_AT_A_TIME)
        assert [self._call(h, f"c{i}", "t1") for i in range(4)] == [1, 2, 3, 4]
        registry = h.rt.registry
        assert registry.stats()["module_execs"] == 1
        assert registry.stats()["namespace_reuses"] == 3
        assert registry.task_count() == 0  # nothing resident ...
        assert registry.has_namespace("t1", digest)  # ... but the namespace is kept
        assert len(h.code_waits) == 1

    def test_another_task_never_gets_a_released_namespace(self, h: Harness) -> None:
        assert self._call(h, "a1", "t1") == 1
        assert self._call(h, "b1", "t2") == 1  # its own module, not t1's
        assert self._call(h, "a2", "t1") == 2
        assert self._call(h, "b2", "t2") == 2
        assert h.rt.registry.stats()["module_execs"] == 2

    def test_the_kept_namespaces_are_bounded_least_recently_released_first(
        self, make_harness
    ) -> None:  # type: ignore[no-untyped-def]
        h = make_harness(released_namespaces=2)
        digest = h.add_source(ONE_AT_A_TIME)
        for task_id in ("t1", "t2", "t3"):
            self._call(h, f"{task_id}/c1", task_id)
        registry = h.rt.registry
        assert registry.released_task_count() == 2
        assert not registry.has_namespace("t1", digest)  # released first, evicted
        assert registry.has_namespace("t2", digest) and registry.has_namespace("t3", digest)
        assert registry.stats()["released_evictions"] == 1
        assert self._call(h, "t1/c2", "t1") == 1  # a fresh module
        assert self._call(h, "t3/c2", "t3") == 2  # still kept
        assert registry.released_task_count() == 2

    def test_an_evicted_namespace_is_freed(self, make_harness) -> None:  # type: ignore[no-untyped-def]
        h = make_harness(released_namespaces=1)
        self._call(h, "t1/c1", "t1")
        [box_of_t1] = h.records
        gc.collect()
        assert box_of_t1() is not None  # kept for t1's next call
        self._call(h, "t2/c1", "t2")  # evicts t1
        gc.collect()
        assert box_of_t1() is None
        assert h.records[1]() is not None  # t2's is kept

    def test_shutdown_drops_the_kept_namespaces(self, h: Harness) -> None:
        self._call(h, "c1", "t1")
        [box] = h.records
        h.close()
        gc.collect()
        assert box() is None
        assert h.rt.registry.released_task_count() == 0

    @pytest.mark.parametrize(
        ("value", "expected"), [("0", 0), ("5", 5), ("", 32), ("-1", 32), ("many", 32)]
    )
    def test_the_size_comes_from_the_environment(
        self, value: str, expected: int, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        assert released_namespace_cache_from_env({RELEASED_NAMESPACE_CACHE_ENV: value}) == expected
        monkeypatch.setenv(RELEASED_NAMESPACE_CACHE_ENV, value)
        assert ModuleRegistry().released_namespace_cache == expected

    def test_a_negative_size_is_refused(self) -> None:
        with pytest.raises(ValueError, match="released_namespace_cache"):
            ModuleRegistry(released_namespace_cache=-1)


class TestCompileCache:
    def _run_digest(self, h: Harness, call_id: str, source: str) -> None:
        h.execute(call_id, source, None)
        h.run()

    def test_the_lru_evicts_the_least_recently_used_digest(self, make_harness) -> None:  # type: ignore[no-untyped-def]
        # No kept namespaces: they would hold an evicted digest's module for the task.
        h = make_harness(max_entries=2, released_namespaces=0)
        sources = [f"def _(p):\n    return {i}\n" for i in range(3)]
        self._run_digest(h, "c0", sources[0])
        self._run_digest(h, "c1", sources[1])
        self._run_digest(h, "c0b", sources[0])  # refresh 0: 1 is now the oldest
        self._run_digest(h, "c2", sources[2])  # evicts 1
        assert len(h.code_waits) == 3
        self._run_digest(h, "c0c", sources[0])
        assert len(h.code_waits) == 3
        self._run_digest(h, "c1b", sources[1])
        assert len(h.code_waits) == 4
        assert h.rt.registry.stats()["evictions"] == 2

    def test_an_evicted_digest_still_held_by_a_live_task_is_not_fetched_again(
        self, make_harness
    ) -> None:  # type: ignore[no-untyped-def]
        h = make_harness(max_entries=1)
        h.execute("hold", COUNTER, "hold", task_id="t1")  # t1 keeps COUNTER's module alive
        h.run()
        self._run_digest(h, "other", "def _(p):\n    return 0\n")  # evicts COUNTER
        assert h.rt.registry.stats()["evictions"] == 1
        h.execute("t3-call", COUNTER, "x", task_id="t3")
        h.run()
        assert h.output("t3-call") == 1
        assert len(h.code_waits) == 2

    def test_zero_means_unlimited(self, make_harness) -> None:  # type: ignore[no-untyped-def]
        h = make_harness(max_entries=0)
        for i in range(20):
            self._run_digest(h, f"c{i}", f"def _(p):\n    return {i}\n")
        assert h.rt.registry.stats()["code_entries"] == 20
        assert h.rt.registry.stats()["evictions"] == 0

    @pytest.mark.parametrize(
        ("value", "expected"),
        [(None, 512), ("", 512), ("7", 7), ("0", 0), ("-1", 512), ("many", 512)],
    )
    def test_the_size_comes_from_the_environment(self, value: str | None, expected: int) -> None:
        environ = {} if value is None else {module_registry.CODE_CACHE_ENV: value}
        assert code_cache_max_entries_from_env(environ) == expected

    def test_the_default_registry_reads_the_environment(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv(module_registry.CODE_CACHE_ENV, "3")
        assert ModuleRegistry().max_entries == 3


class TestCodeFetch:
    def test_concurrent_misses_of_one_digest_send_one_fetch(self, make_harness) -> None:  # type: ignore[no-untyped-def]
        h = make_harness(auto_code=False)
        source = "def _(p):\n    return p * 2\n"
        digest = h.add_source(source)
        for i in range(3):
            h.execute(f"c{i}", digest=digest, args=i, task_id=f"t{i}")
        h.run()
        (fetch,) = h.code_waits
        assert fetch[keys.F_PAYLOAD][keys.FP_FUNCTION_CODE_DIGEST] == digest
        assert fetch[keys.F_PAYLOAD][keys.FP_FUNCTION_ID] == "fn"
        assert [h.state(f"c{i}") for i in range(3)] == ["WAITING_FUNCTION_CODE"] * 3
        h.resume(fetch, {keys.FP_SOURCE: source, keys.FP_FUNCTION_CODE_DIGEST: digest})
        h.run()
        assert [h.output(f"c{i}") for i in range(3)] == [0, 2, 4]
        assert h.rt.registry.stats()["compiles"] == 1

    def test_a_preemption_signal_while_the_leader_wakes_followers_strands_none(
        self,
        make_harness,  # type: ignore[no-untyped-def]
    ) -> None:
        # SIGALRM may land while the leader, resumed, wakes its followers. Simulate it
        # arriving at the first wake with the leader over budget: every follower must still
        # be woken (the leader is not preemptible there), and all three calls complete.
        h = make_harness(auto_code=False)
        source = "def _(p):\n    return p\n"
        digest = h.add_source(source)
        for i in range(3):
            h.execute(f"c{i}", digest=digest, args=i)
        h.run()
        (fetch,) = h.code_waits
        fired: list[bool] = []

        class SignalAtFirstWake:
            """The runtime as the SDK bridge's host, a SIGALRM landing in its first wake.
            (Wraps the host rather than patching the runtime's method: a mypyc-compiled
            runtime's methods cannot be replaced on the instance.)"""

            def __getattr__(self, name: str) -> Any:
                return getattr(h.rt, name)

            def wake_context(self, ctx, outcome):  # type: ignore[no-untyped-def]
                if not fired:
                    fired.append(True)
                    leader = h.rt._contexts["c0"]
                    leader.budget_ms, leader.cpu_s = 1, 1.0  # over budget from here on
                    on_deadline_signal(signal.SIGALRM, None)
                    leader.budget_ms, leader.cpu_s = 0, 0.0
                h.rt.wake_context(ctx, outcome)

        h.rt._bridge._host = SignalAtFirstWake()
        h.resume(fetch, {keys.FP_SOURCE: source, keys.FP_FUNCTION_CODE_DIGEST: digest})
        h.run()
        assert fired
        assert [h.output(f"c{i}") for i in range(3)] == [0, 1, 2]

    def test_a_cancelled_leader_hands_the_fetch_to_a_follower(self, make_harness) -> None:  # type: ignore[no-untyped-def]
        h = make_harness(auto_code=False)
        source = "def _(p):\n    return p\n"
        digest = h.add_source(source)
        h.execute("c0", digest=digest, args=0)
        h.execute("c1", digest=digest, args=1)
        h.run()
        (first,) = h.code_waits
        assert first[keys.F_CALL_ID] == "c0"
        h.cancel("c0")
        h.run()
        assert len(h.code_waits) == 2
        second = h.code_waits[1]
        assert second[keys.F_CALL_ID] == "c1"
        h.resume(first, {keys.FP_SOURCE: source, keys.FP_FUNCTION_CODE_DIGEST: digest})
        assert h.rt.stats()["stale_resume_dropped"] == 1
        h.resume(second, {keys.FP_SOURCE: source, keys.FP_FUNCTION_CODE_DIGEST: digest})
        h.run()
        assert h.output("c1") == 1
        assert h.failure("c0")[keys.FP_ERROR_KIND] == keys.ERR_CANCELLED

    def test_a_cancelled_follower_leaves_the_fetch(self, make_harness) -> None:  # type: ignore[no-untyped-def]
        h = make_harness(auto_code=False)
        source = "def _(p):\n    return p\n"
        digest = h.add_source(source)
        h.execute("c0", digest=digest, args=0)
        h.execute("c1", digest=digest, args=1)
        h.run()
        h.cancel("c1")
        h.resume(h.code_waits[0], {keys.FP_SOURCE: source, keys.FP_FUNCTION_CODE_DIGEST: digest})
        h.run()
        assert h.output("c0") == 0
        assert h.failure("c1")[keys.FP_ERROR_KIND] == keys.ERR_CANCELLED

    @pytest.mark.parametrize(
        ("result", "retryable", "text"),
        [
            ({keys.FP_SOURCE: "def _(p):\n    return 'evil'\n"}, True, "hashes to"),
            ({keys.FP_SOURCE: None}, True, "no source"),
            ("not an object", True, "must be an object"),
            (
                {
                    keys.FP_SOURCE: "def _(p):\n    return 1\n",
                    keys.FP_FUNCTION_CODE_DIGEST: "sha256:" + "1" * 64,
                },
                True,
                "the worker sent",
            ),
        ],
    )
    def test_a_bad_fetch_fails_the_leader_and_every_follower(
        self, make_harness, result: Any, retryable: bool, text: str
    ) -> None:  # type: ignore[no-untyped-def]
        h = make_harness(auto_code=False)
        digest = h.add_source("def _(p):\n    return 1\n")
        h.execute("c0", digest=digest)
        h.execute("c1", digest=digest)
        h.run()
        h.resume(h.code_waits[0], result)
        h.run()
        for call_id in ("c0", "c1"):
            failure = h.failure(call_id)
            assert failure[keys.FP_ERROR_KIND] == keys.ERR_FUNCTION_CODE_FETCH_FAILED
            assert failure[keys.FP_RETRYABLE] is retryable
            assert text in failure[keys.FP_ERROR_MESSAGE]

    @pytest.mark.parametrize(("given", "expected"), [(None, True), (False, False), (True, True)])
    def test_a_fetch_error_from_the_worker(
        self, make_harness, given: bool | None, expected: bool
    ) -> None:  # type: ignore[no-untyped-def]
        h = make_harness(auto_code=False)
        digest = h.add_source("def _(p):\n    return 1\n")
        h.execute("c0", digest=digest)
        h.run()
        error: dict[str, Any] = {"kind": "function_code_not_found", "message": "no such digest"}
        if given is not None:
            error["retryable"] = given
        h.resume(h.code_waits[0], error=error)
        h.run()
        failure = h.failure("c0")
        assert failure[keys.FP_ERROR_KIND] == keys.ERR_FUNCTION_CODE_FETCH_FAILED
        assert failure[keys.FP_RETRYABLE] is expected
        assert "no such digest" in failure[keys.FP_ERROR_MESSAGE]

    def test_an_unsupported_digest_is_not_retryable(self, make_harness) -> None:  # type: ignore[no-untyped-def]
        h = make_harness(auto_code=False)
        h.execute("c0", digest="md5:abc")
        h.run()
        h.resume(h.code_waits[0], {keys.FP_SOURCE: "def _(p):\n    return 1\n"})
        h.run()
        failure = h.failure("c0")
        assert failure[keys.FP_RETRYABLE] is False
        assert "unsupported function code digest" in failure[keys.FP_ERROR_MESSAGE]


class TestUserCodeErrors:
    def test_a_syntax_error_is_a_user_error_with_line_and_column(self, h: Harness) -> None:
        source = "def _(p):\n    x = 1\n    return x +\n"
        h.execute("c1", source, None)
        h.execute("c2", source, None)
        h.run()
        failure = h.failure("c1")
        assert failure[keys.FP_ERROR_KIND] == keys.ERR_USER_ERROR
        assert failure[keys.FP_RETRYABLE] is False
        assert "line 3, column" in failure[keys.FP_ERROR_MESSAGE]
        assert "<blockx:fn>" in failure[keys.FP_ERROR_MESSAGE]
        assert "return x +" in failure[keys.FP_ERROR_STACK]
        assert "^" in failure[keys.FP_ERROR_STACK]
        assert h.failure("c2")[keys.FP_ERROR_KIND] == keys.ERR_USER_ERROR
        assert h.rt.registry.stats()["compiles"] == 1  # the failure is cached too
        assert len(h.code_waits) == 1

    def test_an_exception_shows_the_users_lines_and_no_executor_frames(self, h: Harness) -> None:
        source = dedent(
            """
            def helper(values):
                total = 0
                for v in values:
                    total += 10 / v
                return total

            def _(p):
                scale = 3
                return helper(p["values"]) * scale
            """
        )
        h.execute("c1", source, {"values": [1, 2, 0]})
        h.run()
        failure = h.failure("c1")
        stack = failure[keys.FP_ERROR_STACK]
        assert failure[keys.FP_ERROR_MESSAGE] == "ZeroDivisionError: division by zero"
        assert stack.startswith("Traceback (most recent call last):\n")
        assert 'File "<blockx:fn>", line 10, in _' in stack
        assert 'return helper(p["values"]) * scale' in stack
        assert 'File "<blockx:fn>", line 5, in helper' in stack
        assert "total += 10 / v" in stack
        assert "blockx/executor" not in stack and "greenlet" not in stack
        assert failure[keys.FP_LOCAL_VARS] == {"values": "[1, 2, 0]", "total": "15.0", "v": "0"}

    def test_an_error_in_the_module_body(self, h: Harness) -> None:
        h.execute("c1", "X = 1\nY = X / 0\ndef _(p):\n    return 1\n", None)
        h.run()
        stack = h.failure("c1")[keys.FP_ERROR_STACK]
        assert 'File "<blockx:fn>", line 2, in <module>' in stack
        assert "Y = X / 0" in stack

    def test_the_source_is_registered_in_linecache(self, h: Harness) -> None:
        h.execute("c1", "def _(p):\n    return 'line two'\n", None, function_id="lines")
        h.run()
        assert linecache.getline("<blockx:lines>", 2) == "    return 'line two'\n"

    def test_two_versions_of_one_function_each_show_their_own_lines(self, h: Harness) -> None:
        v1 = "def _(p):\n    from blockx.sdk import db\n    db.get('t', 1)\n    raise ValueError('version one')\n"
        v2 = "def _(p):\n    raise ValueError('version two')\n"
        h.execute("old", v1, None, task_id="t1")
        h.run()
        h.execute("new", v2, None, task_id="t2")
        h.run()
        h.resume(h.last_wait("old"), None)
        h.run()
        assert "raise ValueError('version one')" in h.failure("old")[keys.FP_ERROR_STACK]
        assert "raise ValueError('version two')" in h.failure("new")[keys.FP_ERROR_STACK]


class TestAuditedCalls:
    def test_an_audited_call_uses_the_restricted_namespace_factory(self, h: Harness) -> None:
        seen: list[dict[str, Any]] = []

        def restricted(namespace: dict[str, Any]) -> dict[str, Any]:
            seen.append(namespace)
            return {**namespace, "MODE": "restricted"}

        h.rt.registry.restricted_namespace_factory = restricted
        source = "def _(p):\n    return globals().get('MODE', 'open')\n"
        h.execute(
            "c1", source, None, audit={"policy": "default", "verdictDigest": "sha256:" + "a" * 64}
        )
        h.execute("c2", source, None)
        h.run()
        assert h.output("c1") == "restricted"
        assert h.output("c2") == "open"
        assert len(seen) == 1

    def test_without_a_factory_an_audited_call_runs_and_warns_once(
        self, h: Harness, caplog: pytest.LogCaptureFixture
    ) -> None:
        with caplog.at_level(logging.WARNING, logger="blockx.executor"):
            for i in range(2):
                h.execute(
                    f"c{i}",
                    "def _(p):\n    return 1\n",
                    None,
                    audit={"policy": "default"},
                    task_id=f"t{i}",
                )
            h.run()
        assert h.output("c0") == h.output("c1") == 1
        assert sum("restricted namespace" in r.getMessage() for r in caplog.records) == 1


def test_digest_helper_matches_the_protocol() -> None:
    assert digest_of("x").startswith("sha256:") and len(digest_of("x")) == 71
