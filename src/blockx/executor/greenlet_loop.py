"""The loop a resident greenlet runs (:mod:`.greenlet_pool`), kept interpreted.

A greenlet's ``run`` must be a Python function with a frame of its own: a greenlet
parked in compiled code (mypyc) has none, and setting its ``gr_context`` -- which
the scheduler does before every call (:meth:`CallRunner.step_context`) -- then
fails. So the pool, which runs once per call and is compiled, starts its greenlets
on :func:`resident_loop` through a ``functools.partial``; nothing else lives here.
Keep this module out of the compiled set (setup.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from greenlet import GreenletExit, getcurrent

from .markers import CALL_FINISHED, RETIRE

if TYPE_CHECKING:
    from .context import ExecContext

__all__ = ["resident_loop"]


def resident_loop(
    run_call: Callable[[ExecContext], None],
    fail_call: Callable[[ExecContext, BaseException], None],
    ctx: Any,
) -> None:
    """A resident greenlet: run one call at a time (``run_call``) until :data:`RETIRE`
    is switched in; what escapes ``run_call`` goes to ``fail_call``."""
    parent = getcurrent().parent
    assert parent is not None
    while ctx is not RETIRE:
        try:
            run_call(ctx)
        except GreenletExit:
            raise
        except BaseException as exc:  # a preemption signal that landed in framework code
            fail_call(ctx, exc)
        ctx = parent.switch(CALL_FINISHED)
