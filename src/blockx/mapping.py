"""``blockx.map``: a function over an iterable, as a synchronous iterator of results.

::

    import blockx

    for value in blockx.map("functions/token_price.py", ["ETH", "BTC", "SOL"]):
        print(value)

For scripts and notebooks: no ``async``, no task file. Theory of operation:

* A :class:`~blockx.worker.app.Worker` is started for the map (on first
  ``next()``) in a thread of its own, with its own event loop -- so it works
  under a notebook's running loop too -- and stopped when the iterator ends,
  raises, or is closed early (``break`` out of a ``for`` loop and drop the
  iterator, or call ``close()``): the rest of the calls are cancelled, the
  executors terminated.
* The calls are one streaming task (``Task(calls=<generator>)``): the iterable
  is read lazily, in batches, under the worker's credit window, so an endless
  generator works and memory stays flat; equal calls share one execution (the
  task's call cache).
* Each item of the iterable is one call's ``args`` (the wire rule: a list is
  spread as positional arguments, anything else is the one argument).
  Results come in **input order**, one per item, whatever the function
  returns (a list or ``None`` included: the function runs under a thin entry
  that returns its output as one row).
* A failed call (after its attempts): with ``errors="raise"`` (the default)
  :class:`MapCallError` is raised when the iterator reaches it -- it names the
  function, the item's index and args, the error kind and message, and holds
  the user's traceback -- and the map stops. With ``errors="return"`` the
  iterator yields the :class:`~blockx.worker.api.CallFailure` in that place
  and goes on.

Options: ``functions`` (other functions the function calls with
``function.call``: ``{id: path or source}``), ``function_id`` (default: the
file's stem), ``executors`` (processes; default: the configuration's),
``config`` (a :class:`~blockx.worker.config.WorkerConfig`), ``io`` (an IO
configuration, mapping or ``IOConfig``: the tables and chains the calls reach;
default: from the environment, as ``blockx run`` without a task-file ``io``),
``audit``, and the :class:`~blockx.worker.api.TaskPolicy` fields
(``max_attempts``, ``call_budget_ms``, ...) or a whole ``policy``.
"""

from __future__ import annotations

import ast
import asyncio
import os
import threading
from collections.abc import Coroutine, Iterable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar

from blockx.function_files import read_function_source

if TYPE_CHECKING:
    from blockx.worker.api import CallFailure, TaskPolicy
    from blockx.worker.config import WorkerConfig

__all__ = ["MAP_ENTRY_ID", "MapCallError", "MapError", "map"]

_T = TypeVar("_T")

#: The function id the map's calls run under (the user's module plus a thin entry).
MAP_ENTRY_ID: Final = "blockx_map_entry"
_ENTRY_TEMPLATE: Final = (
    "\n\ndef {entry_id}(*args):\n    # blockx.map: the output as one row, whatever it is\n"
    "    return [{entry}(*args)]\n"
)


class MapError(RuntimeError):
    """The map could not run (bad function, the worker or the task failed)."""


class MapCallError(MapError):
    """A call of the map failed; the map stopped there.

    ``index`` / ``call_args``: the item; ``kind``, ``message``, ``stack``, ``attempts``,
    ``retryable``: the failure, as ``CallFailure`` gives them.
    """

    def __init__(self, function_id: str, failure: CallFailure) -> None:
        self.function_id = function_id
        self.index = failure.index
        self.call_args = failure.args
        self.kind = failure.kind
        self.message = failure.message
        self.stack = failure.stack
        self.attempts = failure.attempts
        self.retryable = failure.retryable
        self.failure = failure
        text = (
            f"blockx.map: call #{failure.index} {function_id}({_short(failure.args)}) failed "
            f"({failure.kind}, {failure.attempts} attempt(s)): {failure.message}"
        )
        if failure.stack:
            text += "\n" + failure.stack.rstrip()
        super().__init__(text)


def _short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _entry_source(source: str, function_id: str) -> str:
    """``source`` plus the map's entry, which returns the user's entry output as one row."""
    from blockx.audit.entry import entry_from_defs, top_level_entries

    try:
        tree = ast.parse(source, f"<blockx:{function_id}>")
    except SyntaxError as exc:
        raise MapError(f"function {function_id!r} does not compile: {exc}") from None
    defs, alias = top_level_entries(tree)
    entry = entry_from_defs(defs, alias, function_id)
    if entry is None:
        raise MapError(
            f"no entry function in {function_id!r}: define `def _(...)` "
            "(or a def named after the function, or a public def)"
        )
    if not source.endswith("\n"):
        source += "\n"
    return source + _ENTRY_TEMPLATE.format(entry_id=MAP_ENTRY_ID, entry=entry)


class _LoopThread:
    """An event loop running in a daemon thread; :meth:`run` waits for a coroutine."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="blockx-map", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        future: Future[_T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


def map(
    function_file: str | os.PathLike[str],
    iterable_of_args: Iterable[Any],
    *,
    functions: Mapping[str, str | os.PathLike[str]] | None = None,
    function_id: str | None = None,
    errors: Literal["raise", "return"] = "raise",
    executors: int | None = None,
    config: WorkerConfig | None = None,
    io: Any = None,
    audit: bool = False,
    policy: TaskPolicy | None = None,
    **policy_options: Any,
) -> Iterator[Any]:
    """Run ``function_file`` once per item of ``iterable_of_args``; yield the results in
    input order (see the module docstring). ``function_file`` may also be source text.

    Raises :class:`MapError` at once for a missing file, a module that does not
    compile or has no entry function, or bad options; :class:`MapCallError` (with
    ``errors="raise"``) when iteration reaches a failed call.
    """
    if errors not in ("raise", "return"):
        raise MapError(f"errors must be 'raise' or 'return', got {errors!r}")
    source, path = read_function_source(function_file, function_id=function_id or "")
    main_id = function_id or (path.stem if path is not None else "function")
    sources = {main_id: source}
    for child_id, value in (functions or {}).items():
        sources[child_id] = read_function_source(value, function_id=child_id)[0]
    sources[MAP_ENTRY_ID] = _entry_source(source, main_id)

    from blockx.worker.api import TaskPolicy

    if policy is None:
        policy = TaskPolicy(**policy_options)
    elif policy_options:
        raise MapError("pass either policy= or policy fields, not both")
    policy = replace(policy, failure="continue")  # failures are reported at their place
    return _run_map(
        main_id, sources, iterable_of_args, errors, executors, config, io, audit, policy
    )


def _run_map(
    main_id: str,
    sources: dict[str, str],
    iterable_of_args: Iterable[Any],
    errors: str,
    executors: int | None,
    config: WorkerConfig | None,
    io: Any,
    audit: bool,
    policy: TaskPolicy,
) -> Iterator[Any]:
    from blockx.worker.api import Call, Task
    from blockx.worker.app import Worker
    from blockx.worker.config import load_config
    from blockx.worker.io.registry import IOSubsystem

    if config is None:
        config = load_config()
    if executors is not None:
        config = config.replace(**{"pool.executor_count": executors})
    calls = (Call(MAP_ENTRY_ID, args) for args in iterable_of_args)
    task = Task(functions=sources, calls=calls, policy=policy, audit=audit, function_paths=False)

    runner = _LoopThread()
    io_system = IOSubsystem(io)
    worker = Worker(config, io_handlers=io_system)
    handle: Any = None
    batches: Any = None
    finished = False
    try:

        async def start() -> Any:
            await worker.start()
            return worker.submit(task, collect=False)

        handle = runner.run(start())
        batches = handle.settled_batches()
        next_index = 0
        while True:
            try:
                settled = runner.run(batches.__anext__())
            except StopAsyncIteration:
                break
            failures = {f.index: f for f in settled.failures}
            rows = iter(settled.rows)
            for index in range(settled.first_call, settled.first_call + settled.call_count):
                if index != next_index:
                    raise MapError(f"blockx.map: results out of order ({index}, {next_index})")
                next_index += 1
                failure = failures.get(index)
                if failure is not None:
                    failure = replace(failure, function_id=main_id)
                    if errors == "raise":
                        raise MapCallError(main_id, failure)
                    yield failure
                    continue
                try:
                    yield next(rows)
                except StopIteration:
                    raise MapError(
                        f"blockx.map: call #{index} of {main_id} settled without an output "
                        "(cancelled?)"
                    ) from None

        async def outcome() -> Any:
            return await handle.result()

        result = runner.run(outcome())
        if not result.success and result.failure is not None:
            raise MapError(f"blockx.map: the task failed: {result.failure.message}")
        finished = True
    finally:

        async def stop() -> None:
            if handle is not None and not finished:
                handle.cancel("blockx.map closed")
            if batches is not None:
                await batches.aclose()
            await worker.close()
            await io_system.close()

        try:
            runner.run(stop())
        finally:
            runner.stop()
