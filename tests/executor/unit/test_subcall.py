"""Sub-calls: CallWaiting(subcall) shape, budgets carved from the caller, error mapping,
admission of children, and blockx.function.call."""

from __future__ import annotations

from textwrap import dedent

import pytest
from executor_harness import Harness

import blockx.function
from blockx.sdk.runtime import NoProviderError
from blockx.wire import keys

CALLER = dedent(
    """
    def _(*p):
        return {"child": function.call("adder", *p)}
    """
)


def _sub_wait(h: Harness, call_id: str) -> dict:  # type: ignore[type-arg]
    (wait,) = h.waits(call_id, keys.WAIT_SUBCALL)
    return wait


class TestSubcallWaiting:
    @pytest.mark.parametrize(
        ("call_args", "wire_args"),
        [
            ([{"left": 1, "right": 2}], {"left": 1, "right": 2}),
            ([1, 2], [1, 2]),
            ([], []),
            ([[1, 2]], [1, 2]),
        ],
    )
    def test_function_call_packs_its_arguments(
        self,
        h: Harness,
        call_args: list,
        wire_args: object,  # type: ignore[type-arg]
    ) -> None:
        h.execute("c1", CALLER, call_args)
        h.run()
        payload = _sub_wait(h, "c1")[keys.F_PAYLOAD]
        assert payload[keys.FP_FUNCTION_ID] == "adder"
        assert payload[keys.FP_ARGS] == wire_args
        assert payload[keys.FP_TASK_ID] == "t1"
        assert payload[keys.FP_ATTEMPT_SEQ] == 1

    def test_ancestry_is_the_callers_plus_its_own_call_key(self, h: Harness) -> None:
        h.execute("c1", CALLER, [1], call_key="k-c1", ancestry=["k-root", "k-mid"])
        h.run()
        assert _sub_wait(h, "c1")[keys.F_PAYLOAD][keys.FP_ANCESTRY] == ["k-root", "k-mid", "k-c1"]

    def test_a_root_call_starts_the_ancestry(self, h: Harness) -> None:
        h.execute("c1", CALLER, [1], call_key="k-c1")
        h.run()
        assert _sub_wait(h, "c1")[keys.F_PAYLOAD][keys.FP_ANCESTRY] == ["k-c1"]

    def test_the_granted_budget_is_the_callers_remaining_budget(self, h: Harness) -> None:
        source = "def _(p):\n    clock.advance_ms(120)\n    return function.call('child', 1)\n"
        h.execute("c1", source, None, call_budget_ms=1000)
        h.run()
        assert _sub_wait(h, "c1")[keys.F_PAYLOAD][keys.FP_GRANTED_BUDGET_MS] == 880

    def test_an_unlimited_caller_grants_zero(self, h: Harness) -> None:
        h.execute("c1", CALLER, [1])
        h.run()
        assert _sub_wait(h, "c1")[keys.F_PAYLOAD][keys.FP_GRANTED_BUDGET_MS] == 0

    def test_the_child_output_is_returned(self, h: Harness) -> None:
        h.execute("c1", CALLER, [1])
        h.run()
        h.resume(_sub_wait(h, "c1"), {"sum": 3})
        h.run()
        assert h.output("c1") == {"child": {"sum": 3}}

    def test_unserializable_args_fail_at_the_call_site(self, h: Harness) -> None:
        h.execute("c1", "def _(p):\n    return function.call('child', {1, 2})\n", None)
        h.run()
        failure = h.failure("c1")
        assert failure[keys.FP_ERROR_KIND] == keys.ERR_USER_ERROR
        assert "NotSerializableError" in failure[keys.FP_ERROR_MESSAGE]
        assert h.waits("c1", keys.WAIT_SUBCALL) == []

    def test_call_subfunc_passes_args_through(self, h: Harness) -> None:
        source = (
            "from blockx.sdk import call_subfunc\ndef _(p):\n    return call_subfunc('child', p)\n"
        )
        h.execute("c1", source, {"a": 1})
        h.run()
        assert _sub_wait(h, "c1")[keys.F_PAYLOAD][keys.FP_ARGS] == {"a": 1}


class TestSubcallErrors:
    @pytest.mark.parametrize("retryable", [True, False])
    def test_an_uncaught_child_failure_fails_the_caller_as_subcall_failed(
        self, h: Harness, retryable: bool
    ) -> None:
        h.execute("c1", CALLER, [1])
        h.run()
        error = {"kind": keys.ERR_USER_ERROR, "message": "child blew up", "retryable": retryable}
        h.resume(_sub_wait(h, "c1"), error=error)
        h.run()
        failure = h.failure("c1")
        assert failure[keys.FP_ERROR_KIND] == keys.ERR_SUBCALL_FAILED
        assert failure[keys.FP_RETRYABLE] is retryable
        assert "child blew up" in failure[keys.FP_ERROR_MESSAGE]
        assert "function.call" in failure[keys.FP_ERROR_STACK]

    def test_a_caught_child_failure_is_the_callers_business(self, h: Harness) -> None:
        source = dedent(
            """
            from blockx.executor.sdk_bridge import SubcallFailedError

            def _(p):
                try:
                    return function.call("child", 1)
                except SubcallFailedError as exc:
                    return {"fallback": exc.child_error_kind, "retryable": exc.retryable}
            """
        )
        h.execute("c1", source, None)
        h.run()
        h.resume(
            _sub_wait(h, "c1"),
            error={"kind": "deadline_exceeded", "message": "slow", "retryable": False},
        )
        h.run()
        assert h.output("c1") == {"fallback": "deadline_exceeded", "retryable": False}

    @pytest.mark.parametrize(
        ("kind", "class_name"),
        [
            (keys.ERR_SUBCALL_DEPTH_EXCEEDED, "SubcallDepthExceededError"),
            (keys.ERR_SUBCALL_CYCLE_DETECTED, "SubcallCycleDetectedError"),
        ],
    )
    def test_depth_and_cycle_refusals_have_their_own_errors(
        self, h: Harness, kind: str, class_name: str
    ) -> None:
        h.execute("c1", CALLER, [1])
        h.run()
        h.resume(_sub_wait(h, "c1"), error={"kind": kind, "message": "no", "retryable": False})
        h.run()
        failure = h.failure("c1")
        assert failure[keys.FP_ERROR_KIND] == kind
        assert failure[keys.FP_RETRYABLE] is False
        assert failure[keys.FP_ERROR_MESSAGE].startswith(class_name)


class TestSubcallAdmission:
    CHILD = "def adder(p):\n    return {'sum': p['left'] + p['right']}\n"

    def test_a_child_runs_on_the_parents_executor_even_at_capacity(self, make_harness) -> None:  # type: ignore[no-untyped-def]
        h = make_harness(max_inflight=1)
        h.execute("c1", CALLER, [{"left": 1, "right": 2}], call_key="k1")
        h.run()
        wait = _sub_wait(h, "c1")
        h.execute(
            "c1/sub1",
            self.CHILD,
            wait[keys.F_PAYLOAD][keys.FP_ARGS],
            function_id="adder",
            parent_call_id="c1",
            ancestry=wait[keys.F_PAYLOAD][keys.FP_ANCESTRY],
        )
        h.execute("c2", CALLER, [1])  # a top-level call at capacity is refused
        h.run()
        assert h.output("c1/sub1") == {"sum": 3}
        assert h.failure("c2")[keys.FP_ERROR_KIND] == keys.ERR_EXECUTOR_CAPACITY_EXHAUSTED
        h.resume(wait, h.output("c1/sub1"))
        h.run()
        assert h.output("c1") == {"child": {"sum": 3}}

    def test_a_child_whose_parent_is_not_resident_is_refused(self, h: Harness) -> None:
        h.execute("c9/sub", self.CHILD, {"left": 1, "right": 1}, parent_call_id="c9")
        h.run()
        failure = h.failure("c9/sub")
        assert failure[keys.FP_ERROR_KIND] == keys.ERR_SUBCALL_PARENT_NOT_RESIDENT
        assert failure[keys.FP_RETRYABLE] is False

    def test_the_seed_example_runs_with_the_prelude_names(self, h: Harness) -> None:
        seed = dedent(
            """
            def _(p):
                child = function.call("adder", {"left": p["left"], "right": p["right"]})
                total = Decimal(str(child["sum"])) + Decimal("0.50")
                return {
                    "child": child,
                    "encoded": json.dumps({"sum": child["sum"]}, sort_keys=True, separators=(",", ":")),
                    "total": str(total),
                    "day": date(2026, 6, 10).isoformat(),
                    "stamp": datetime(2026, 6, 10, 9, 30).isoformat(),
                }
            """
        )
        h.execute("c1", seed, {"left": 2, "right": 3})
        h.run()
        h.resume(_sub_wait(h, "c1"), {"sum": 5})
        h.run()
        assert h.output("c1") == {
            "child": {"sum": 5},
            "encoded": '{"sum":5}',
            "total": "5.50",
            "day": "2026-06-10",
            "stamp": "2026-06-10T09:30:00",
        }


class TestFunctionCallOutsideACall:
    def test_outside_the_executor_it_says_so(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.delenv("BLOCKX_EXECUTOR_RUNTIME", raising=False)
        with pytest.raises(
            blockx.function.FunctionCallOutsideExecutorError, match="inside a BlockX call"
        ):
            blockx.function.call("adder", 1)

    def test_in_the_executor_process_but_outside_a_call(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("BLOCKX_EXECUTOR_RUNTIME", "1")
        with pytest.raises(NoProviderError, match="only work inside a call"):
            blockx.function.call("adder", 1)

    def test_a_provider_installed_by_hand_is_used(self) -> None:
        from blockx.sdk.runtime import reset_provider, set_provider

        calls: list[tuple[str, object]] = []

        class Recorder:
            def subcall(self, function_id: str, args: object) -> object:
                calls.append((function_id, args))
                return "ok"

        token = set_provider(Recorder())  # type: ignore[arg-type]
        try:
            assert blockx.function.call("f", 1, 2) == "ok"
            assert blockx.function.call("g") == "ok"
        finally:
            reset_provider(token)
        assert calls == [("f", [1, 2]), ("g", [])]
