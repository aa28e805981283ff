"""The values switched between the scheduler and a call's greenlet, besides contexts and payloads.

Theory of operation
-------------------
Only the scheduler switches into a call's greenlet (docs/concepts.md); a call's
greenlet only switches back to its parent, the scheduler. What travels over
those switches is a context (the first switch), a validated
``ResumePayload`` (:mod:`.context`), a framework exception (thrown), or one of
the markers below, compared by identity:

* greenlet → scheduler: :data:`SUSPENDED` (the call waits: ``sdk_bridge``),
  :data:`CALL_FINISHED` (its call sent its terminal frame: ``greenlet_pool``);
* scheduler → greenlet: :data:`SLEEP_WAKE` (a sleep is due),
  :data:`WAIT_CUT_OFF` (an IO / sub-call wait outlasted the call's budget or
  deadline), :data:`RETIRE` (an idle pool greenlet ends its loop).

This module imports nothing of the executor's: :mod:`.greenlet_pool`,
:mod:`.sdk_bridge`, :mod:`.call_runner` and :mod:`.runtime` all read it, and
none of them needs another for these names (no import cycle).
"""

from __future__ import annotations

from typing import Final

__all__ = ["CALL_FINISHED", "RETIRE", "SLEEP_WAKE", "SUSPENDED", "WAIT_CUT_OFF", "Marker"]


class Marker:
    """A named sentinel switched between greenlets (compared by identity)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name}>"


#: What a call's greenlet hands the scheduler when it suspends in a wait.
SUSPENDED: Final = Marker("suspended")
#: What a pool greenlet switches to the scheduler when its call has ended.
CALL_FINISHED: Final = Marker("call-finished")
#: The resume value of a cooperative sleep whose timer is due.
SLEEP_WAKE: Final = Marker("sleep-wake")
#: The resume value of an IO / sub-call wait the runtime cut off at the call's
#: budget or deadline (``ExecutorRuntime._cut_off_wait``).
WAIT_CUT_OFF: Final = Marker("wait-cut-off")
#: What the scheduler switches into an idle pool greenlet to end it.
RETIRE: Final = Marker("retire")
