"""The worker process's event loop and garbage collector: :func:`run` and :func:`tune_gc`.

:func:`run` runs a coroutine on a fresh event loop — uvloop when it is
installed (a dependency on Linux) — after :func:`tune_gc` unless told not to;
``blockx run``, the benches and :func:`blockx.worker.app.run_task_sync` use it.
A host embedding :class:`~blockx.worker.app.Worker` in its own loop decides
both for itself. (Re-exported by :mod:`blockx.worker.app`.)
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable, Coroutine
from typing import Any, Final, TypeVar

__all__ = ["GC_GEN0_THRESHOLD", "run", "tune_gc"]

_T = TypeVar("_T")


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


#: Generation-0 threshold set by :func:`tune_gc` (CPython's default is 700).
GC_GEN0_THRESHOLD: Final = 50_000


def tune_gc() -> None:
    """Make CPython's cyclic GC fit a worker process.

    A worker allocates a few short-lived objects per call (contexts, commands,
    frames); at the default gen-0 threshold of 700 the collector runs every few
    dozen calls and costs ~3 µs per call (measured on the trivial benchmark,
    7% of the worker's CPU). Collecting every 50,000 allocations instead costs
    ~0.2 µs per call. Objects alive at start-up are frozen out of the
    collector's walks. Process-wide: :func:`run` calls it; a host embedding
    :class:`Worker` in its own loop decides for itself.

    No full collection first: it took 5-17 ms of a ``blockx run`` start (walking the
    ~50,000 objects the imports made, while the executors boot on the same cores) to
    free ~740 objects of import-time garbage, which are frozen with the rest instead.
    """
    gc.freeze()
    _gen0, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)


def run(main: Coroutine[Any, Any, _T], *, gc_tuning: bool = True) -> _T:
    """Run ``main`` on a fresh event loop: uvloop when it is installed.

    ``gc_tuning``: apply :func:`tune_gc` first (the worker process's setting).
    """
    if gc_tuning:
        tune_gc()
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        return runner.run(main)
