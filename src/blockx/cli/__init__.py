"""The ``blockx`` command: run a task file on an embedded worker, check one, show the configuration.

::

    blockx run TASK [-o FILE] [--executors N] [--config FILE] [--set KNOB=VALUE ...] [--quiet]
    blockx validate TASK
    blockx schema [-o FILE]
    blockx config [--task TASK] [--json]
    blockx submit TASK [--follow] [--server URL] [--token-file FILE]
    blockx status ID | rows ID [--after N] | cancel ID | tasks [--state S]

``python -m blockx`` is the same command. The work is done in
:mod:`blockx.cli.run` (running, signals), :mod:`blockx.cli.validate`
(``blockx validate``), :mod:`blockx.cli.console` (stderr: logs, the progress
line), :mod:`blockx.cli.report` (exit statuses, failure report, summary),
:mod:`blockx.cli.output` (the rows' writer thread),
:mod:`blockx.cli.settings` (configuration sources), :mod:`blockx.cli.taskfile`
(task files) and :mod:`blockx.cli.remote` (the client of ``blockx serve``: submit,
status, rows, cancel, tasks); this module is the argument parser and the dispatch.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import json
import logging
import os
import sys
import threading
from collections.abc import Sequence
from typing import Final, NoReturn

from blockx import __version__, method_cache, native
from blockx.cli.exit_codes import (
    EXIT_OK,
    EXIT_SIGPIPE,
    EXIT_STATUS_HELP,
    EXIT_USAGE,
    INTERRUPTED_STATUS,
)
from blockx.msgspec_import import import_msgspec

__all__ = ["build_parser", "main"]

#: The gen-0 threshold of the command's process from its start (console_main): that of
#: blockx.worker.loop.GC_GEN0_THRESHOLD, which this module must not import (asyncio).
_START_GC_GEN0_THRESHOLD: Final = 50_000

# Before the commands' modules (imported as they are needed) create their dataclasses.
method_cache.install()


_MAIN_DESCRIPTION = """\
BlockX runs huge numbers of calls of plain, synchronous Python functions on a
pool of executor processes: every IO (tables, chain reads), sub-call and sleep
suspends only its own call, while the worker caches, de-duplicates, budgets
and retries the work.

A task file (YAML or JSON) names the functions and the calls; `blockx run`
runs it and writes the outputs as JSON Lines. See docs/taskspec.md and
docs/cli.md.
"""

_MAIN_EPILOG = """\
examples:
  blockx run examples/quickstart/task.yaml
  blockx run task.yaml -o outputs.jsonl --executors 8
  blockx validate task.yaml
  blockx config --set pool.executor_count=4
  blockx submit task.yaml --follow --server http://127.0.0.1:8470

Run `blockx COMMAND --help` for a command's options.
"""

_RUN_DESCRIPTION = """\
Run TASK on an embedded worker and write its outputs as JSON Lines (one row
per line: a call returning a dict gives one row, a list one row per item,
None none) to stdout or -o FILE.

Inline `calls:` run as one task and their rows are written in call order when
it ends; a `calls_file:` is streamed line by line and its rows are written as
they arrive, with flat memory however long the file. Before anything starts,
the task file, every line of its calls file and the output paths (-o,
--errors, --summary-json: writable, not a directory, never one of the
task's input files) are checked (exit 2 on a problem).

On stderr: a live progress line when stderr is a terminal (done/total, rate,
retries, failures), print() output of the functions, a report of every failed
call (function, args, error kind, message, your stack trace with file and
line), and a summary (calls, outputs, failures by kind, retries, cache hits,
IO requests and latency, calls/s, wall time, peak memory).

Ctrl-C or SIGTERM cancels the task (exit 130/143) and writes the rows of the
calls that ended; rows a stdout reader leaves unread for 2 s after that are
dropped (stderr counts them). A second signal exits at once.

Configuration: defaults <- --config FILE (or $BLOCKX_CONFIG) <- environment
variables <- --set / --executors; the task file's `io:` section is applied
over the environment's IO settings. `blockx config` shows the result.
"""

_RUN_EPILOG = (
    """\
examples:
  blockx run examples/quickstart/task.yaml
  blockx run task.yaml -o out.jsonl --executors 4
  blockx run task.yaml --set dispatcher.call_deadline_ms=10000 --set CALL_RETRY_MAX_ATTEMPTS=5
  blockx run task.yaml --set io.rpc.endpoints='eth=http://127.0.0.1:8545'
  blockx run task.yaml --quiet --errors failed.jsonl || echo "some calls failed"

"""
    + EXIT_STATUS_HELP
)

_VALIDATE_DESCRIPTION = """\
Check TASK without running it: the task file's fields, every line of its
calls file, that each function's source compiles and has an entry function (a
def named after the function id, else `def _`, else the first public def),
that every call names a function of the task, and that the task's `io:`
section merges with the configuration. Literal `function.call("name", ...)`
names that the task does not define are warned about.

Prints a one-line summary on stdout and exits 0 when the task is valid; prints
every problem (file, field or line, and what is wrong) on stderr and exits 2
when it is not.
"""

_VALIDATE_EPILOG = """\
examples:
  blockx validate examples/quickstart/task.yaml
  blockx validate task.yaml --quiet && blockx run task.yaml
"""

_CONFIG_DESCRIPTION = """\
Print the effective configuration: every worker and IO knob with its value
and where the value came from (default, file, env VARIABLE, task, --set,
--executors, derived). Takes the same --config/--set/--executors as `blockx
run`; with --task, the task file's `io:` section is applied too.

docs/configuration.md describes every knob.
"""

_CONFIG_EPILOG = """\
examples:
  blockx config
  EXECUTOR_COUNT=4 blockx config --set io.data_dir=/var/lib/blockx
  blockx config --task examples/quickstart/task.yaml --json
"""


class _Formatter(argparse.RawDescriptionHelpFormatter):
    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=30, width=92)


def _positive_int(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _add_config_options(parser: argparse.ArgumentParser, *, executors: bool = True) -> None:
    group = parser.add_argument_group("configuration")
    group.add_argument(
        "--config",
        metavar="FILE",
        help="worker configuration file, TOML (or JSON): [pool], [dispatcher], ..., [io] "
        "tables (default: $BLOCKX_CONFIG when set)",
    )
    group.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KNOB=VALUE",
        help="set one knob, by dotted name (pool.executor_count, io.blockdb.sqlite_path) or "
        "environment variable (EXECUTOR_COUNT); repeatable; beats the file and the environment",
    )
    if executors:
        group.add_argument(
            "--executors",
            "-n",
            type=_positive_int,
            metavar="N",
            help="executor processes (default: EXECUTOR_COUNT, else the number of CPU cores)",
        )


_SUBMIT_DESCRIPTION = """\
Send TASK to a `blockx serve` server: the task file and its function files are
read and checked here (the messages of `blockx validate`), the functions sent
by source, the calls inline (a calls_file is uploaded in batches). Prints the
task's id on stdout.

With --follow the id goes to stderr, the task's rows are written to stdout as
they are persisted (byte for byte the lines `blockx run` writes; a dropped
connection is reopened where it broke off) and, when the task ends, the
failure report and the summary go to stderr as `blockx run` prints them, with
its exit statuses. Ctrl-C stops following and leaves the task running.
"""

_REMOTE_EPILOG = """\
server and token: --server URL (default $BLOCKX_SERVER, else http://127.0.0.1:8470);
--token-file FILE (its content, whitespace stripped; default $BLOCKX_TOKEN).

examples:
  blockx submit task.yaml
  blockx submit task.yaml --follow > rows.jsonl
  blockx status t-0123456789abcdef
  blockx rows t-0123456789abcdef --after 1000
  blockx tasks --state running
"""

#: The client's commands: (name, one-line help); their work is blockx.cli.remote's.
_REMOTE_HELP = {
    "submit": "send a task file to a `blockx serve` server (--follow: stream its rows)",
    "status": "print a submitted task's status as JSON",
    "rows": "write a submitted task's rows as JSON Lines (following it while it runs)",
    "cancel": "cancel a submitted task",
    "tasks": "list the server's tasks",
}


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0..65535, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def _add_remote_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``submit``, ``status``, ``rows``, ``cancel``, ``tasks`` (run by blockx.cli.remote)."""
    for name, help_text in _REMOTE_HELP.items():
        cmd = commands.add_parser(
            name,
            help=help_text,
            description=_SUBMIT_DESCRIPTION
            if name == "submit"
            else help_text[0].upper() + help_text[1:] + ".",
            epilog=_REMOTE_EPILOG,
            formatter_class=_Formatter,
        )
        if name == "submit":
            cmd.add_argument("task", metavar="TASK", help="the task file (.yaml, .yml or .json)")
            cmd.add_argument(
                "--follow",
                "-f",
                action="store_true",
                help="stream the rows to stdout, then the report and summary to stderr",
            )
            cmd.add_argument("-q", "--quiet", action="store_true", help="with --follow: no summary")
        elif name == "tasks":
            cmd.add_argument(
                "--state",
                choices=("queued", "running", "succeeded", "failed", "cancelled"),
                help="only the tasks in this state",
            )
        else:
            cmd.add_argument("id", metavar="ID", help="the task's id (t-... as submit printed)")
        if name == "rows":
            cmd.add_argument(
                "--after",
                type=_non_negative_int,
                default=0,
                metavar="N",
                help="skip the first N rows (those already read)",
            )
        server = cmd.add_argument_group("server")
        server.add_argument("--server", metavar="URL", help="the server (default $BLOCKX_SERVER)")
        server.add_argument(
            "--token-file", metavar="FILE", help="the bearer token's file (default $BLOCKX_TOKEN)"
        )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="blockx",
        description=_MAIN_DESCRIPTION,
        epilog=_MAIN_EPILOG,
        formatter_class=_Formatter,
    )
    parser.add_argument(
        "--version", action="version", version=f"blockx {__version__}, {native.status().describe()}"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")

    run = commands.add_parser(
        "run",
        help="run a task file and write its outputs as JSON Lines",
        description=_RUN_DESCRIPTION,
        epilog=_RUN_EPILOG,
        formatter_class=_Formatter,
    )
    run.add_argument("task", metavar="TASK", help="the task file (.yaml, .yml or .json)")
    out = run.add_argument_group("output")
    out.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="write the output rows to FILE instead of stdout (created or truncated; "
        "refused when it is the task file, a function file or the calls file)",
    )
    out.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no progress line, no summary, no print() output of the functions: only "
        "warnings, errors and the failure report",
    )
    out.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="also log the worker's and executors' own messages (start-up, executors "
        "attaching, shutdown)",
    )
    out.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="show the live progress line (default: when stderr is a terminal)",
    )
    out.add_argument(
        "--log-format",
        choices=("text", "json"),
        default=None,
        help="stderr as text, or as JSON Lines: one object per line with ts, level, logger, "
        "message and task_id / call_id / executor where known, no progress line "
        "(default: $BLOCKX_LOG_FORMAT, else text; docs/observability.md)",
    )
    out.add_argument(
        "--errors",
        dest="errors_out",
        metavar="FILE",
        help="write every failed call as JSON Lines to FILE (index, function, args, kind, "
        "message, stack, attempts); the report on stderr shows the first 20",
    )
    out.add_argument(
        "--summary-json",
        metavar="FILE",
        help="write the run's statistics as JSON to FILE (calls, failures by kind, IO, "
        "timings, peak memory)",
    )
    # Observability: traces (docs/observability.md).
    run.add_argument(
        "--trace-file",
        metavar="FILE",
        help="append every finished span (task, call, io, subcall, execute) to FILE as JSON "
        "Lines (default $BLOCKX_TRACE_FILE); OTEL_TRACES_SAMPLER(_ARG) set the sampling, "
        "OTEL_EXPORTER_OTLP_ENDPOINT exports them too (blockx[otel])",
    )
    _add_config_options(run)
    cluster = run.add_argument_group("cluster (docs/cluster.md)")
    cluster.add_argument(
        "--ray",
        metavar="auto|ADDRESS",
        help="run on a Ray cluster, one BlockX worker per node: auto starts a local Ray "
        "instance, ADDRESS (the head's ip:port) joins one (blockx[ray])",
    )
    cluster.add_argument(
        "--executors-per-node",
        type=_positive_int,
        metavar="N",
        help="with --ray: executors of each node's worker (default: the node's CPUs)",
    )
    observe = run.add_argument_group("observability")
    observe.add_argument(
        "--metrics-port",
        type=_port,
        metavar="PORT",
        help="serve Prometheus metrics at http://127.0.0.1:PORT/metrics while the task "
        "runs (on 127.0.0.1 only: this machine; 0 picks a free port and prints it)",
    )

    validate = commands.add_parser(
        "validate",
        help="check a task file without running it",
        description=_VALIDATE_DESCRIPTION,
        epilog=_VALIDATE_EPILOG,
        formatter_class=_Formatter,
    )
    validate.add_argument("task", metavar="TASK", help="the task file (.yaml, .yml or .json)")
    validate.add_argument(
        "-q", "--quiet", action="store_true", help="print nothing when the task is valid"
    )
    _add_config_options(validate, executors=False)

    config = commands.add_parser(
        "config",
        help="print the effective configuration: every knob, its value and its source",
        description=_CONFIG_DESCRIPTION,
        epilog=_CONFIG_EPILOG,
        formatter_class=_Formatter,
    )
    config.add_argument("--task", metavar="TASK", help="apply this task file's io: section too")
    config.add_argument(
        "--json", action="store_true", help="print a JSON list of {knob, value, source, env}"
    )
    _add_config_options(config)

    schema = commands.add_parser(
        "schema",
        help="print the JSON Schema of a task file (for editors: docs/taskspec.md)",
        description="Print the JSON Schema (draft 2020-12) of a task file, generated from "
        "the checks' task model. Editors with the YAML language server use it through a "
        "`# yaml-language-server: $schema=...` comment (docs/taskspec.md).",
        formatter_class=_Formatter,
    )
    schema.add_argument("-o", "--output", metavar="FILE", help="write it to FILE, not stdout")

    from blockx.cli.serve import add_serve_parser

    add_serve_parser(commands, _Formatter, _add_config_options)
    _add_remote_commands(commands)
    return parser


def _config_command(args: argparse.Namespace) -> int:
    from blockx.cli.settings import UsageError, build_settings
    from blockx.cli.taskfile import SpecError, load_task_file

    task_io = None
    label = None
    task_dir = None
    try:
        if args.task is not None:
            spec = load_task_file(args.task)
            task_io, label, task_dir = spec.io, spec.label, str(spec.path.resolve().parent)
        settings = build_settings(
            config_file=args.config,
            sets=args.sets,
            executors=args.executors,
            task_io=task_io,
            task_label=label,
            task_dir=task_dir,
        )
    except (SpecError, UsageError) as exc:
        for problem in exc.problems:
            print(f"blockx: error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    rows = settings.rows()
    if args.json:
        print(
            json.dumps(
                [
                    {"knob": r.knob, "value": r.value, "source": r.source, "env": r.env or None}
                    for r in rows
                ],
                indent=2,
            )
        )
        return EXIT_OK
    knob_w = max(len(r.knob) for r in rows)
    value_w = min(max(len(r.value) for r in rows), 40)
    print(f"{'KNOB':<{knob_w}}  {'VALUE':<{value_w}}  SOURCE")
    for r in rows:
        print(f"{r.knob:<{knob_w}}  {r.value:<{value_w}}  {r.source}")
    if settings.config_file:
        print(f"\nconfiguration file: {settings.config_file}")
    return EXIT_OK


def console_main() -> None:
    """The ``blockx`` executable and ``python -m blockx``: :func:`main`, then exit with
    its status.

    An interrupted run ends with its own status (130 / 143), its rows and report
    already written. Left to the interpreter's exit, a Ctrl-C that came while the
    executors started could still end the process *by* SIGINT although the run
    caught it (CPython keeps a "KeyboardInterrupt was unhandled" mark; seen in about
    one run in ten): so such an exit flushes and leaves at once.
    """
    # The command's imports allocate hundreds of thousands of objects that live as long
    # as the process: at CPython's gen-0 threshold of 700 the collector walked them ~70
    # times during a `blockx run` start (~26 M instructions, callgrind). The worker's
    # own threshold (blockx.worker.loop.tune_gc, applied once it runs) from the start.
    _gen0, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(_START_GC_GEN0_THRESHOLD, gen1, gen2)
    import_msgspec()  # the process's own start: no thread of ours imports anything yet
    code = main()
    if code in INTERRUPTED_STATUS.values():
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    _leave(code)


def _leave(code: int) -> NoReturn:
    """Exit with ``code`` as the interpreter's own exit would, without its finalization.

    Once a command returned, its outputs are closed (the rows, the report files, the
    trace file, stderr's writer drained); what the interpreter does next is wait for
    non-daemon threads, run the exit handlers, flush the standard streams -- and then
    tear down every module and object of a process about to end: 14-22 ms after the
    last exit handler of a ``blockx run`` (strace), while its caller waits. This does
    the first three and leaves. A non-daemon thread still running, a standard stream
    that cannot be flushed, or a profiler or tracer watching the process (``python -m
    cProfile -m blockx ...`` writes its figures after the program returns; a debugger,
    coverage) takes the interpreter's way, which says and does what it always did.
    """
    if sys.getprofile() is not None or sys.gettrace() is not None:
        sys.exit(code)
    main_thread = threading.main_thread()
    if any(t is not main_thread and not t.daemon and t.is_alive() for t in threading.enumerate()):
        sys.exit(code)
    run_exit_handlers = getattr(atexit, "_run_exitfuncs", None)
    if run_exit_handlers is None:  # pragma: no cover - every CPython has it
        sys.exit(code)
    run_exit_handlers()  # logging's shutdown, blockx.method_cache's save, weakref finalizers
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        sys.exit(code)
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    """The ``blockx`` command; returns the exit status."""
    try:
        return _main(argv)
    except BrokenPipeError:  # `blockx config | head`: the reader went away
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except OSError:  # pragma: no cover
            pass
        return EXIT_SIGPIPE


def _start_fork_server() -> None:
    """The executors' fork server, started before the worker is imported
    (``blockx/worker/pool/fork_server.py``): its imports run beside the command's. Not
    when the environment says the executors start otherwise; a config file or ``--set``
    that does leaves it unused, and ``blockx run`` closes it at its end."""
    env = os.environ
    if env.get("EXECUTOR_FORK_SERVER", "").strip().lower() in ("0", "false", "no", "off"):
        return
    if env.get("EXECUTOR_SPAWN_MODE", "").strip().lower() == "sandbox":
        return
    if env.get("EXECUTOR_PYTHON", "").strip():
        return
    from blockx.worker.pool.fork_server import start_early

    start_early()


def _main(argv: Sequence[str] | None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    if words[:1] == ["run"] and not any(w == "--ray" or w.startswith("--ray=") for w in words):
        _start_fork_server()  # before the parser is built: ~20 ms sooner
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    if args.command in ("run", "serve"):  # they start a worker and executors: not on Windows
        from blockx.portability import platform_problem

        problem = platform_problem()
        if problem is not None:
            print(f"blockx: error: {problem}", file=sys.stderr)
            return EXIT_USAGE
    if args.command == "run":
        from blockx.cli.run import RunOptions, run_command

        return run_command(
            RunOptions(
                task=args.task,
                output=args.output,
                executors=args.executors,
                config=args.config,
                sets=tuple(args.sets),
                quiet=args.quiet,
                verbose=args.verbose,
                errors_out=args.errors_out,
                summary_json=args.summary_json,
                progress=args.progress,
                metrics_port=args.metrics_port,
                log_format=args.log_format,
                trace_file=args.trace_file,
                ray=args.ray,
                executors_per_node=args.executors_per_node,
            )
        )
    if args.command in _REMOTE_HELP:
        from blockx.cli.remote import remote_command

        return remote_command(args)
    if args.command == "validate":
        from blockx.cli.validate import validate_command

        return validate_command(args.task, config=args.config, sets=args.sets, quiet=args.quiet)
    if args.command == "schema":
        from blockx.cli.schema import main as schema_command

        return schema_command(args)
    if args.command == "serve":
        from blockx.cli.serve import serve_command

        return serve_command(args)
    return _config_command(args)
