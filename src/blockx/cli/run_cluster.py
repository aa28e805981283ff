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
3. the verdict (:func:`blockx.cli.run_verdict.verdict`): the same failure report, summary,
   ``--errors`` and ``--summary-json``, plus the per-node figures (``"nodes"``).

The run joins Ray and owns its :class:`~blockx.cluster.nodes.NodePool` itself (handed
to the driver: ``pool=``), so that what watches the run can read the node workers:

* ``--progress`` (or a terminal): the progress line of ``blockx run``
  (:class:`~blockx.cli.console.Progress`), fed from the driver's counters
  (:func:`driver_counts`: calls ended, retries -- ``node_lost`` re-dispatches, and
  the nodes' own once they reported them -- and failed) and the pool's started node
  workers' executors, with the number of node workers at its end (``2 nodes``);
* ``--metrics-port``: ``GET /metrics`` on 127.0.0.1 (the same
  :class:`~blockx.observability.metrics.MetricsServer` as a local run's) with the
  local series' names, read from the node workers at each scrape and summed
  (:class:`~blockx.cluster.metrics.ClusterMetrics`), plus ``blockx_cluster_*``;
* ``--trace-file`` (and OTLP, as configured by the environment): the driver's own
  spans (:class:`~blockx.cluster.spans.DriverSpans`): one ``task`` span for the run
  and one ``node`` span per node worker it used, its child. The nodes' ``call``,
  ``io``, ``execute`` spans are not written: on a real cluster a node cannot reach a
  file on the driver's machine (docs/cluster.md).
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

__all__ = [
    "RAY_MISSING",
    "RunParts",
    "driver_counts",
    "run_on_ray",
    "table_problem",
]

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


def driver_counts(cluster: Any) -> tuple[int, int, int] | None:
    """``(calls ended, retries, failed)`` of a running cluster run (a
    :class:`~blockx.cluster.driver.ClusterRun`) from its driver's counters; None before
    its driver runs. Retries: the calls re-dispatched after a node loss, plus the nodes'
    own retries as of their latest batch reply (the figures each reply carries)."""
    driver = cluster.driver
    if driver is None:
        return None
    failed = len(driver.errors)
    done = driver.succeeded + failed + driver.cancelled
    retries = cluster.node_lost + sum(
        int(figures["stats"].get("retries", 0))
        for tasks in list(driver.node_figures.values())
        for figures in list(tasks.values())
    )
    return done, retries, failed


def _shows_progress(options: RunOptions, console: Console) -> bool:
    # as blockx.cli.run's: a terminal or --progress, never mixed into JSON lines
    show = options.progress if options.progress is not None else console.tty
    return bool(show) and not options.quiet and not console.json


async def _watch_run(
    cluster: Any,
    pool: Any,
    progress: Any,
    console: Console,
    spans: Any,
    executors_per_node: int | None,
) -> None:
    """The run's ticker: the progress line and the spans' view of the nodes."""
    from blockx.cli.console import PROGRESS_INTERVAL_S

    while True:
        if spans is not None:
            spans.look(cluster.nodes)
        if progress is not None:
            counts = driver_counts(cluster)
            if counts is not None:
                progress.last = counts
            done, retries, failed = progress.last or (0, 0, 0)
            attached = sum(node.executors for node in pool.ready())
            expected = sum(executors_per_node or cpus for cpus in pool.alive.values())
            progress.executors = max(expected, attached)
            nodes = len(pool.ready())
            line = progress.render(done, retries, failed, attached)
            console.show_progress(f"{line}  {nodes} node{'s' if nodes != 1 else ''}")
        await asyncio.sleep(PROGRESS_INTERVAL_S)


async def _run(options: RunOptions, console: Console, checked: Checked, parts: RunParts) -> Any:
    from blockx.cli.console import Progress
    from blockx.cluster.driver import ClusterRun
    from blockx.cluster.metrics import ClusterMetrics
    from blockx.cluster.nodes import NodePool, init_ray
    from blockx.cluster.spans import DriverSpans
    from blockx.observability.tracing import Tracing

    settings = checked.settings
    address = options.ray or "auto"
    started_ray = init_ray(address)  # on the loop's thread: Ray's signal handlers
    pool = NodePool(settings.worker, settings.io, options.executors_per_node)
    cluster = ClusterRun()
    metrics = ClusterMetrics(pool)
    server: Any = None
    ticker: asyncio.Task[None] | None = None
    tracing = Tracing.from_env(options.trace_file)
    spans = DriverSpans(tracing, checked.spec.task_id) if tracing is not None else None
    outcome: Any = None
    try:
        if options.metrics_port is not None:
            server = await _metrics_server(options.metrics_port, metrics, cluster, console)
        progress = (
            Progress(console, checked.total, 0) if _shows_progress(options, console) else None
        )
        if progress is not None or spans is not None:
            ticker = asyncio.get_running_loop().create_task(
                _watch_run(cluster, pool, progress, console, spans, options.executors_per_node),
                name="blockx-ray-ticker",
            )
        outcome = await _run_task(options, console, checked, parts, pool, cluster)
        return outcome
    finally:
        if ticker is not None:
            ticker.cancel()
            await asyncio.gather(ticker, return_exceptions=True)
            console.clear_progress()
        if spans is not None:
            try:
                spans.finish(getattr(outcome, "result", None), cluster.nodes)
            finally:
                spans.close()
        if server is not None:
            await server.stop()
        metrics.close()
        await pool.close()
        if started_ray:
            import ray

            await asyncio.to_thread(ray.shutdown)


async def _metrics_server(port: int, metrics: Any, cluster: Any, console: Console) -> Any:
    """``--metrics-port`` of a cluster run: the node workers' series summed, refreshed at
    each scrape, and the driver's (``blockx_cluster_batches_total``,
    ``blockx_cluster_node_lost_total``)."""
    from blockx.observability.metrics import MetricsServer, make_registry

    def snapshot() -> dict[str, Any]:
        snap = metrics.current()
        return {
            **snap,
            "cluster": {
                **snap["cluster"],
                "batches": cluster.batches,
                "node_lost": cluster.node_lost,
            },
        }

    def tasks() -> dict[str, int]:
        return {"running": 1} if cluster.driver is not None else {}

    server = MetricsServer(
        make_registry(None, tasks=tasks, snapshot=snapshot), port=port, refresh=metrics.refresh
    )
    await server.start()
    if port == 0:
        console.print(f"blockx: metrics at http://127.0.0.1:{server.port}/metrics")
    return server


async def _run_task(
    options: RunOptions,
    console: Console,
    checked: Checked,
    parts: RunParts,
    pool: Any,
    cluster: Any,
) -> Any:
    from blockx.cli.output import PUT_SLICE_ROWS, OutputClosed
    from blockx.cli.report import RunOutcome
    from blockx.cluster.driver import ClusterOptions, run_on_cluster

    spec, settings, sink = checked.spec, checked.settings, checked.sink
    outcome = RunOutcome()
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    assert main is not None
    interruption = parts.interruption(outcome, main, console)
    interruption.install(loop)
    t0 = time.monotonic()

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
                keep_ray=True,  # _run shuts down a Ray it started, after the pool
                pool=pool,
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
