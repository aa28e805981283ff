"""``blockx run TASK --ray auto|ADDRESS``: the same command, one BlockX worker per Ray node.

Theory of operation
-------------------
The three steps of :mod:`blockx.cli.run`, with the run itself handed to the cluster
driver (:func:`blockx.cluster.driver.run_on_cluster`, ``docs/cluster.md``):

1. the input is checked exactly as ``blockx run`` checks it
   (:func:`~blockx.cli.run_input.check_input`); then what only a cluster run refuses,
   before anything starts (exit status 2): ``ray`` not installed, and a task whose
   functions use ``Table`` while the blockdb backend is SQLite (node-local: every
   node would have tables of its own) -- the message says to configure
   ``io.blockdb.engine: postgres`` and its DSN;
2. the run: Ray joined (or started: ``auto``), the calls streamed to the nodes; rows
   go to the same :class:`~blockx.cli.output.RowWriter` in call order (the driver's
   reorder buffer), as a local run writes them; SIGINT/SIGTERM cancel the run
   as they cancel a local one;
3. the verdict (:func:`blockx.cli.run.verdict`): the same failure report, summary,
   ``--errors`` and ``--summary-json``, plus the per-node figures (``"nodes"``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Final

from blockx.cli.console import Console, print_problems
from blockx.cli.exit_codes import EXIT_FAILED, EXIT_USAGE, INTERRUPTED_STATUS
from blockx.cli.run_input import Checked, RunOptions, check_input

__all__ = ["RAY_MISSING", "RunParts", "run_on_ray", "table_problem"]

RAY_MISSING: Final = (
    "--ray needs Ray, which is not installed: pip install 'blockx[ray]' (docs/cluster.md)"
)


@dataclass(frozen=True, slots=True)
class RunParts:
    """The parts of :mod:`blockx.cli.run` a cluster run shares (handed over by it: it
    imports this module, so this module does not import it)."""

    verdict: Callable[..., int]
    interruption: Callable[..., Any]
    drain_output: Callable[..., Any]
    calls_until_a_bad_line: Callable[..., Any]
    output_grace_s: float


def table_problem(checked: Checked) -> str | None:
    """Why the task cannot run on a cluster with its table store, or None."""
    from blockx.cluster.tables import functions_using_table

    users = functions_using_table({fid: fn.source for fid, fn in checked.spec.functions.items()})
    if not users or checked.settings.io.blockdb.effective_engine != "sqlite":
        return None
    return (
        f"--ray: function{'s' if len(users) > 1 else ''} {', '.join(map(repr, users))} "
        "use Table, and the blockdb backend is SQLite, which is local to one machine: "
        "every node would have tables of its own. Configure a PostgreSQL server all "
        "nodes reach: io.blockdb.engine: postgres and io.blockdb.postgres_dsn "
        "(--set io.blockdb.engine=postgres --set io.blockdb.postgres_dsn=postgresql://...)"
    )


def run_on_ray(options: RunOptions, console: Console, parts: RunParts) -> int:
    """``blockx run --ray``: check, run on the cluster, give the verdict; the exit status."""
    from blockx.cluster.nodes import ray_available

    if not ray_available():
        print_problems(console, [RAY_MISSING])
        return EXIT_USAGE
    checked = check_input(options, console)
    if isinstance(checked, int):
        return checked
    unsupported = [
        name
        for name, value in (
            ("--metrics-port", options.metrics_port),
            ("--trace-file", options.trace_file),
            ("--progress", options.progress),
        )
        if value
    ]
    if unsupported:
        console.print(
            f"blockx: warning: {', '.join(unsupported)} not supported with --ray yet: ignored"
        )
    problem = table_problem(checked)
    if problem is not None:
        checked.sink.close(timeout=0.0)
        print_problems(console, [problem])
        return EXIT_USAGE
    from blockx.worker.app import run

    try:
        outcome = run(_run(options, console, checked, parts))
    except KeyboardInterrupt:
        console.print("blockx: interrupted")
        return INTERRUPTED_STATUS["SIGINT"]
    except Exception as exc:
        console.print(f"blockx: error: the cluster run failed: {type(exc).__name__}: {exc}")
        if options.verbose:
            import traceback

            console.print("".join(traceback.format_exception(exc)).rstrip())
        return EXIT_FAILED
    finally:
        if console.writer is not None:
            console.writer.keep_all()
        checked.sink.close(timeout=parts.output_grace_s)
    executors = sum(int(n.get("executors", 0)) for n in (outcome.nodes or {}).values())
    if executors:
        settings = checked.settings
        worker = replace(
            settings.worker, pool=replace(settings.worker.pool, executor_count=executors)
        )
        checked = replace(checked, settings=replace(settings, worker=worker))
    return parts.verdict(options, console, checked, outcome)


async def _run(options: RunOptions, console: Console, checked: Checked, parts: RunParts) -> Any:
    from blockx.cli.output import PUT_SLICE_ROWS, OutputClosed
    from blockx.cli.report import RunOutcome
    from blockx.cluster.driver import ClusterOptions, ClusterRun, run_on_cluster

    spec, settings, sink = checked.spec, checked.settings, checked.sink
    outcome = RunOutcome()
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    assert main is not None
    interruption = parts.interruption(outcome, main, console)
    interruption.install(loop)
    t0 = time.monotonic()
    cluster = ClusterRun()

    async def on_rows(rows: list[Any]) -> None:
        if outcome.output_closed:
            return
        try:
            for start in range(0, len(rows), PUT_SLICE_ROWS):
                end = start + PUT_SLICE_ROWS
                sink.put_rows(rows if start == 0 and end >= len(rows) else rows[start:end])
                if sink.full:
                    await sink.wait_for_room()
        except OutputClosed:
            outcome.output_closed = True
            main.cancel()

    try:
        task = spec.to_task(parts.calls_until_a_bad_line(spec, outcome) if spec.is_stream else None)
        try:
            outcome.result = await run_on_cluster(
                task,
                settings.worker,
                settings.io,
                ClusterOptions(
                    address=options.ray or "auto", executors_per_node=options.executors_per_node
                ),
                on_rows,
                cluster,
            )
        finally:
            outcome.nodes = cluster.nodes
            outcome.node_lost = cluster.node_lost
            outcome.io_stats = cluster.io_stats
        interruption.cancel_main = False
        try:
            await parts.drain_output(sink, outcome, main)
        except OutputClosed:
            outcome.output_closed = True
    finally:
        outcome.wall_s = time.monotonic() - t0
        interruption.uninstall(loop)
    return outcome
