"""Activity is stamped at every switch into a call's greenlet (issue 15, "The backstop
judges a call by its own budget"): heartbeats say which call runs now, for how long
since the scheduler last switched into it, and what budget it had left then.
"""

from __future__ import annotations

from textwrap import dedent
from typing import Any

from executor_harness import Harness

from blockx.wire import keys

BEAT_AFTER = dedent(
    """
    def _(p):
        clock.advance_ms(p)
        beat = holder['rt'].build_heartbeat()
        return [beat['runningCallId'], beat['runningForMs'], beat['runningCallBudgetMs']]
    """
)


def _harness(make_harness: Any) -> tuple[Harness, dict[str, Any]]:
    holder: dict[str, Any] = {}
    h = make_harness(prelude={"holder": holder}, max_inflight=0)
    holder["rt"] = h.rt
    return h, holder


def test_running_for_ms_counts_from_the_switch_into_the_call(make_harness: Any) -> None:
    h, _ = _harness(make_harness)
    h.execute("c1", BEAT_AFTER, 3000)
    h.run()
    assert h.output("c1") == ["c1", 3000, 0]  # unbudgeted: 0 = unlimited


def test_a_long_pass_of_healthy_calls_never_looks_stalled(make_harness: Any) -> None:
    """128 calls of 100 ms in one run_until_idle pass: the last one has run for its own
    100 ms, not for the 12.7 s the pass has taken so far."""
    h, _ = _harness(make_harness)
    for i in range(128):
        h.execute(f"c{i}", BEAT_AFTER, 100, call_budget_ms=30_000)
    h.run()
    outputs = [h.output(f"c{i}") for i in range(128)]
    assert all(out[1] == 100 for out in outputs)
    assert all(out[2] == 30_000 for out in outputs)  # each switched in with its whole budget


def test_budget_left_at_switch_in_counts_slices_and_charged_waits(make_harness: Any) -> None:
    h, _ = _harness(make_harness)
    source = dedent(
        """
        from blockx.sdk import db

        def _(p):
            clock.advance_ms(300)
            db.get("t", 1)
            clock.advance_ms(50)
            beat = holder['rt'].build_heartbeat()
            return [beat['runningForMs'], beat['runningCallBudgetMs']]
        """
    )
    h.execute("c1", source, None, call_budget_ms=1000)
    h.run()
    h.clock.advance(7.0)  # suspended: never counted as running
    h.resume(h.last_wait("c1"), {"v": 1}, budget_used_ms=200)
    h.run()
    assert h.output("c1") == [50, 500]  # 1000 - 300 (CPU) - 200 (the IO wait)


def test_between_calls_nothing_runs(make_harness: Any) -> None:
    h, _ = _harness(make_harness)
    h.execute("c1", BEAT_AFTER, 5000)
    h.run()
    h.clock.advance(60.0)
    beat = h.rt.build_heartbeat()
    assert beat[keys.FP_RUNNING_CALL_ID] is None
    assert beat[keys.FP_RUNNING_FOR_MS] == 0
    assert beat[keys.FP_RUNNING_CALL_BUDGET_MS] == 0


def test_last_scheduler_activity_is_stamped_at_each_switch(make_harness: Any) -> None:
    """A switch into a call is scheduler activity: a pass whose calls each run 1 s
    reports the last switch, not the start of the pass."""
    h, holder = _harness(make_harness)

    def tick(ms: int) -> None:  # both clocks move together, as real ones do
        h.clock.advance_ms(ms)
        h.wall_ms += ms

    holder["tick"] = tick
    source = dedent(
        """
        def _(p):
            holder['tick'](1000)
            return holder['rt'].build_heartbeat()['lastSchedulerActiveAtMs']
        """
    )
    start_ms = h.wall_ms
    for i in range(5):
        h.execute(f"c{i}", source, None)
    h.run()
    # c4 was switched into 4 s after the pass began, 1 s before its heartbeat.
    assert h.output("c4") == start_ms + 4000 == h.wall_ms - 1000
