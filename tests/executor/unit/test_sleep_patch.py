"""The global time.sleep patch: cooperative on a call's greenlet, real everywhere else."""

from __future__ import annotations

import time
from textwrap import dedent

import pytest
from executor_harness import Harness

from blockx.executor import sleep_patch
from blockx.wire import keys


class TestInsideACall:
    def test_sleep_suspends_the_call_without_a_frame_and_others_run(self, h: Harness) -> None:
        h.execute("c1", "import time\ndef _(p):\n    time.sleep(5)\n    return 'slept'\n", None)
        h.execute("c2", "def _(p):\n    return 'quick'\n", None)
        frames = h.run()
        assert h.state("c1") == "WAITING_SLEEP"
        assert [f[keys.F_CALL_ID] for f in frames] == ["c2"]
        assert h.waits("c1", keys.WAIT_IO) == h.waits("c1", keys.WAIT_SUBCALL) == []
        h.clock.advance(5)
        h.run()
        assert h.output("c1") == "slept"

    def test_sleepers_wake_in_due_order(self, h: Harness) -> None:
        source = "import time\ndef _(p):\n    time.sleep(p)\n    record(p)\n"
        h.execute("c1", source, 0.3)
        h.execute("c2", source, 0.1)
        h.execute("c3", source, 0.2)
        h.run()
        h.clock.advance(1)
        h.run()
        assert h.records == [0.1, 0.2, 0.3]

    def test_sleep_zero_yields_to_other_runnable_calls(self, h: Harness) -> None:
        source = dedent(
            """
            import time

            def _(p):
                record(p + "-a")
                if p == "one":
                    time.sleep(0)
                record(p + "-b")
            """
        )
        h.rt.registry.compile_source("fn", h.add_source(source), source)
        h.execute("c1", source, "one")
        h.execute("c2", source, "two")
        h.run()
        assert h.records == ["one-a", "two-a", "two-b", "one-b"]

    def test_from_time_import_sleep_binds_the_patch(self, h: Harness) -> None:
        h.execute("c1", "from time import sleep\ndef _(p):\n    sleep(1)\n    return 1\n", None)
        h.run()
        assert h.state("c1") == "WAITING_SLEEP"

    def test_blockx_sdk_sleep_is_the_same_sleep(self, h: Harness) -> None:
        h.execute(
            "c1", "from blockx import sdk\ndef _(p):\n    sdk.sleep(0.5)\n    return 1\n", None
        )
        h.run()
        assert h.state("c1") == "WAITING_SLEEP"
        h.clock.advance(0.5)
        h.run()
        assert h.payload("c1")[keys.FP_BUDGET_USED_MS] == 500

    @pytest.mark.parametrize(
        ("value", "error"),
        [
            (-1, "ValueError"),
            (float("nan"), "ValueError"),
            ("1", "TypeError"),
            (None, "TypeError"),
            ([1], "TypeError"),
        ],
    )
    def test_bad_durations_raise_like_time_sleep(
        self, h: Harness, value: object, error: str
    ) -> None:
        source = f"import time\ndef _(p):\n    time.sleep({value!r})\n"
        h.execute("c2", source.replace("nan", "float('nan')"), None)
        h.run()
        failure = h.failure("c2")
        assert failure[keys.FP_ERROR_KIND] == keys.ERR_USER_ERROR
        assert failure[keys.FP_ERROR_MESSAGE].startswith(error)

    def test_a_thread_started_by_user_code_sleeps_for_real(self, make_harness) -> None:  # type: ignore[no-untyped-def]
        h = make_harness(real_clock=True)
        source = dedent(
            """
            import threading
            import time

            def _(p):
                worker = threading.Thread(target=lambda: (time.sleep(0.02), record("thread")))
                started = time.perf_counter()
                worker.start()
                worker.join()
                return time.perf_counter() - started
            """
        )
        h.execute("c1", source, None)
        h.run()
        assert h.output("c1") >= 0.02
        assert h.records == ["thread"]


class TestOutsideACall:
    def test_outside_a_call_sleep_really_sleeps(self, h: Harness) -> None:
        assert sleep_patch.is_sleep_patch_installed()
        started = time.perf_counter()
        time.sleep(0.02)
        assert time.perf_counter() - started >= 0.02

    def test_install_is_idempotent_and_uninstall_restores(self, h: Harness) -> None:
        patched = time.sleep
        sleep_patch.install_global_sleep_patch()
        assert time.sleep is patched
        sleep_patch.uninstall_global_sleep_patch()
        try:
            assert not sleep_patch.is_sleep_patch_installed()
            assert time.sleep is not patched
        finally:
            sleep_patch.install_global_sleep_patch()
        assert time.sleep is patched

    def test_the_original_sleep_is_kept(self) -> None:
        started = time.perf_counter()
        sleep_patch.original_sleep(0.01)
        assert time.perf_counter() - started >= 0.01
