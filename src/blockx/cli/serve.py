"""``blockx serve``: the worker as a long-running HTTP service (``docs/serve.md``).

Start-up, in order, each step refusing with a clear message (exit 2) before
anything listens: the token file (read, stripped, not empty; a warning when
others may read it), the bind address (a non-loopback host needs a token), the
functions root, the configuration (``--config``, ``--set``, the environment,
``--executors``), the data dir's store. Then the worker and its executors start,
the store's unfinished tasks are taken back, and the HTTP site listens; the
line ``listening on http://HOST:PORT`` on stderr says so (``--port 0`` picks a
free port: that line names it). ``--log-format json`` (or ``BLOCKX_LOG_FORMAT=json``):
every stderr line is a JSON object instead (:mod:`blockx.observability.logs`) — the
service's records, aiohttp's, the executors' forwarded lines — and that line's
``message`` is the same ``listening on http://HOST:PORT``.

SIGTERM or SIGINT drains: new tasks are refused (503), running tasks go on for
``--drain-timeout`` seconds, the rest are cut (their stored batches stay; the
next start resumes them), the site closes, the worker stops; exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import os
import signal
import stat
import sys
from pathlib import Path
from typing import Any, Final

from blockx.cli.exit_codes import EXIT_OK, EXIT_USAGE

__all__ = ["DEFAULT_PORT", "add_serve_parser", "serve_command"]

DEFAULT_PORT: Final = 8470
DEFAULT_MAX_BODY: Final = 64 * 1024 * 1024
DEFAULT_RETENTION_S: Final = 7 * 86400.0
DEFAULT_QUEUE_LIMIT: Final = 64
DEFAULT_DRAIN_S: Final = 30.0


def add_serve_parser(commands: Any, formatter_class: Any, add_config_options: Any) -> None:
    """The ``serve`` subcommand's arguments."""
    serve = commands.add_parser(
        "serve",
        help="run the worker as an HTTP service: submit tasks, read rows, survive restarts",
        description=(
            "Run the worker as a long-running HTTP service (docs/serve.md): tasks are "
            "submitted with POST /v1/tasks (or `blockx submit`), stored in the data dir "
            "before they are accepted, run concurrently on one executor pool, and resumed "
            "after a crash or a restart."
        ),
        formatter_class=formatter_class,
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: any free)"
    )
    serve.add_argument(
        "--data-dir",
        metavar="DIR",
        default=None,
        help="where the service keeps its tasks, calls and rows (SQLite; default: "
        "$BLOCKX_SERVE_DATA_DIR, else ./.blockx-serve)",
    )
    serve.add_argument(
        "--durability",
        choices=("normal", "full"),
        default="normal",
        help="normal: a stored batch survives a crash of the process (kill -9); full: also a "
        "power loss, one disk flush per batch (SQLite synchronous=FULL; docs/serve.md)",
    )
    serve.add_argument(
        "--token-file",
        metavar="FILE",
        help="require `Authorization: Bearer <token>` on every endpoint but /healthz and "
        "/readyz; the token is the file's content, surrounding whitespace stripped",
    )
    serve.add_argument(
        "--functions-root",
        metavar="DIR",
        help="allow functions given by `path`, resolved inside DIR (default: only `source`)",
    )
    serve.add_argument(
        "--require-audit",
        action="store_true",
        help="audit every submitted function and run it restricted (a task cannot turn it off)",
    )
    serve.add_argument(
        "--drain-timeout",
        type=float,
        default=DEFAULT_DRAIN_S,
        metavar="S",
        help=f"on SIGTERM, let running tasks go on this long (default {DEFAULT_DRAIN_S:g} s)",
    )
    serve.add_argument(
        "--max-body",
        type=int,
        default=DEFAULT_MAX_BODY,
        metavar="BYTES",
        help=f"largest request body (default {DEFAULT_MAX_BODY:,}: 64 MiB)",
    )
    serve.add_argument(
        "--retention",
        type=float,
        default=DEFAULT_RETENTION_S / 86400,
        metavar="DAYS",
        help="keep finished tasks this many days (default 7)",
    )
    serve.add_argument(
        "--queue-limit",
        type=int,
        default=DEFAULT_QUEUE_LIMIT,
        metavar="N",
        help="tasks waiting for a run slot before new ones get 429 "
        f"(default {DEFAULT_QUEUE_LIMIT})",
    )
    serve.add_argument(
        "--stream-window",
        type=int,
        default=65_536,
        metavar="N",
        help="a streamed task's calls stored and not yet done before POST .../calls waits "
        "(back-pressure; default 65,536)",
    )
    # Cluster mode (docs/cluster.md): the tasks run on a Ray cluster.
    serve.add_argument(
        "--ray",
        metavar="ADDRESS",
        default=None,
        help="run the tasks on a Ray cluster, one BlockX worker per node (docs/cluster.md): "
        "auto starts a local Ray instance, an address (HEAD_IP:6379) joins a cluster; "
        "needs blockx[ray]",
    )
    serve.add_argument(
        "--executors-per-node",
        type=int,
        default=None,
        metavar="N",
        help="with --ray: executors on every node (default: the node's CPUs)",
    )
    serve.add_argument("-v", "--verbose", action="store_true", help="log the worker's own messages")
    serve.add_argument(
        "--log-format",
        choices=("text", "json"),
        default=None,
        help="stderr as text, or as JSON Lines (one object per line: ts, level, logger, "
        "message, task_id / call_id / executor where known; aiohttp's records too); "
        "default: $BLOCKX_LOG_FORMAT, else text",
    )
    # Observability: traces (docs/observability.md).
    serve.add_argument(
        "--trace-file",
        metavar="FILE",
        help="append every finished span (task, call, io, subcall, execute) to FILE as JSON "
        "Lines (default $BLOCKX_TRACE_FILE); OTEL_TRACES_SAMPLER(_ARG) set the sampling, "
        "OTEL_EXPORTER_OTLP_ENDPOINT exports them too (blockx[otel])",
    )
    add_config_options(serve)


class _Refused(Exception):
    """A reason not to start (exit 2)."""


def _say(level: str, text: str, *, json_lines: bool) -> None:
    """One line on stderr: ``blockx serve: LEVEL: text``, or a JSON record (``--log-format
    json``; logger ``blockx.serve``)."""
    if json_lines:
        from blockx.observability.logs import json_line

        print(json_line(level, "blockx.serve", text), file=sys.stderr, flush=True)
    else:
        print(f"blockx serve: {level}: {text}", file=sys.stderr)


def _configure_logging(*, verbose: bool, json_lines: bool) -> None:
    """The root logger on stderr: the worker's records, the forwarded executors' lines and
    aiohttp's, through one formatter (JSON Lines with ``--log-format json``)."""
    level = logging.DEBUG if verbose else logging.INFO
    if json_lines:
        from blockx.observability.logs import JsonLogFormatter, executors_write_json

        executors_write_json()  # the executors' own lines: JSON too, forwarded tagged
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonLogFormatter())
        logging.basicConfig(level=level, handlers=[handler])
        logging.captureWarnings(True)  # a Python warning: a record, not a text line
        sys.excepthook = _log_uncaught  # what ends the process (a port in use): a record too
    else:
        logging.basicConfig(
            level=level,
            format="blockx serve: %(levelname)s %(name)s: %(message)s",
            stream=sys.stderr,
        )
    if not verbose:
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def _log_uncaught(kind: type[BaseException], value: BaseException, tb: Any) -> None:
    """``sys.excepthook`` under ``--log-format json``: the traceback as one record."""
    logging.getLogger("blockx.serve").critical(
        "%s: %s", kind.__name__, value, exc_info=(kind, value, tb)
    )


def _read_token(path: str, *, json_lines: bool = False) -> str:
    try:
        info = os.stat(path)
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise _Refused(f"--token-file {path}: cannot read it: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise _Refused(f"--token-file {path}: not UTF-8 text") from None
    token = text.strip()
    if not token:
        raise _Refused(f"--token-file {path}: the file is empty")
    if info.st_mode & (stat.S_IRGRP | stat.S_IROTH):
        _say(
            "warning",
            f"{path} can be read by other users (mode {stat.filemode(info.st_mode)}); chmod 600 it",
            json_lines=json_lines,
        )
    return token


def _is_loopback(host: str) -> bool:
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _lock_data_dir(data_dir: Path) -> int | None:
    """An exclusive lock on ``DATA_DIR/serve.lock``, held (by the open descriptor) as long
    as the process lives -- a kill -9 lets it go; None when another process holds it."""
    import fcntl

    fd = os.open(data_dir / "serve.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def serve_command(args: argparse.Namespace) -> int:
    """``blockx serve`` (see the module docstring)."""
    from blockx.cli.settings import UsageError, build_settings
    from blockx.observability.logs import LogFormatError, resolve_log_format

    try:
        args.log_format = resolve_log_format(args.log_format)
    except LogFormatError as exc:
        _say("error", str(exc), json_lines=False)
        return EXIT_USAGE
    json_lines = args.log_format == "json"
    try:
        token = _read_token(args.token_file, json_lines=json_lines) if args.token_file else None
        if token is None and not _is_loopback(args.host):
            raise _Refused(
                f"--host {args.host} is not a loopback address: anyone who can reach it could "
                "run code on this machine. Give --token-file FILE (or bind 127.0.0.1)"
            )
        if not 0 <= args.port <= 65535:
            raise _Refused(f"--port {args.port}: expected 0 to 65535")
        for name, value in (
            ("--max-body", args.max_body),
            ("--queue-limit", args.queue_limit),
            ("--stream-window", args.stream_window),
        ):
            if value < 1:
                raise _Refused(f"{name} {value}: expected a positive integer")
        if args.drain_timeout < 0 or args.retention <= 0:
            raise _Refused("--drain-timeout must be >= 0 and --retention > 0")
        if args.executors_per_node is not None and (args.executors_per_node < 1 or not args.ray):
            raise _Refused("--executors-per-node N: a positive integer, with --ray")
        if args.ray:
            from blockx.cli.run_cluster import RAY_MISSING
            from blockx.cluster.nodes import ray_available

            if not ray_available():
                raise _Refused(RAY_MISSING)
        root: Path | None = None
        if args.functions_root:
            root = Path(args.functions_root).resolve()
            if not root.is_dir():
                raise _Refused(f"--functions-root {args.functions_root}: not a directory")
        _check_trace_file(args.trace_file)
        settings = build_settings(config_file=args.config, sets=args.sets, executors=args.executors)
    except (_Refused, UsageError) as exc:
        _say("error", str(exc), json_lines=json_lines)
        return EXIT_USAGE

    from blockx.serve.store import StoreError, TaskStore

    data_dir = args.data_dir or os.environ.get("BLOCKX_SERVE_DATA_DIR") or ".blockx-serve"
    try:
        store = TaskStore(data_dir, synchronous="FULL" if args.durability == "full" else "NORMAL")
    except StoreError as exc:
        _say("error", str(exc), json_lines=json_lines)
        return EXIT_USAGE
    lock = _lock_data_dir(Path(data_dir))
    if lock is None:
        store.close()
        _say(
            "error",
            f"another blockx serve is using {data_dir} (two servers on "
            "one data dir would both run its tasks); stop it or give another --data-dir",
            json_lines=json_lines,
        )
        return EXIT_USAGE
    _configure_logging(verbose=args.verbose, json_lines=json_lines)
    from blockx.worker.app import run

    return run(_serve(args, settings, store, token, root))


def _check_trace_file(flag_value: str | None) -> None:
    """A trace file (``--trace-file``, else ``BLOCKX_TRACE_FILE``) that cannot be written is
    bad usage, said before anything starts (not a traceback once the worker runs)."""
    from blockx.cli.paths import why_unwritable

    named, path = "--trace-file", flag_value
    if path is None:
        named, path = "BLOCKX_TRACE_FILE", os.environ.get("BLOCKX_TRACE_FILE") or None
    if path is None:
        return
    if os.path.isdir(path):
        raise _Refused(f"{named} {path}: is a directory; name a file")
    why = why_unwritable(path)
    if why is not None:
        raise _Refused(f"{named} {path}: {why}")


async def _serve(
    args: argparse.Namespace, settings: Any, store: Any, token: str | None, root: Path | None
) -> int:
    from aiohttp import web

    from blockx.observability.tracing import Tracing
    from blockx.serve.app import ServeOptions, make_app
    from blockx.serve.documents import task_from_spec
    from blockx.serve.runner import StoreThread, TaskManager
    from blockx.worker.app import Worker
    from blockx.worker.io.registry import IOSubsystem

    log = logging.getLogger("blockx.serve")
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    store_thread = StoreThread(store)
    worker: Any
    if args.ray:  # the tasks run on a Ray cluster (docs/cluster.md)
        from blockx.cluster.driver import ClusterOptions
        from blockx.cluster.service import ClusterWorker

        worker = ClusterWorker(
            settings.worker,
            settings.io,
            ClusterOptions(address=args.ray, executors_per_node=args.executors_per_node),
            tracing=Tracing.from_env(args.trace_file),  # the drivers' spans (docs/cluster.md)
        )
    else:
        worker = Worker(settings.worker, tracing=Tracing.from_env(args.trace_file))
    io = IOSubsystem(settings.io)
    runner: web.AppRunner | None = None
    try:
        await worker.start()
        manager = TaskManager(
            worker,
            io,
            store_thread,
            slots=settings.worker.admission.executor_task_slots,
            queue_limit=args.queue_limit,
            retention_s=args.retention * 86400.0,
            stream_window=args.stream_window,
            task_factory=task_from_spec,
        )
        resumed = await manager.start()
        if resumed:
            log.info("resuming %d unfinished task(s)", resumed)
        options = ServeOptions(
            token=token,
            max_body=args.max_body,
            functions_root=root,
            require_audit=args.require_audit,
            worker=worker,
        )
        runner = web.AppRunner(make_app(manager, options), shutdown_timeout=2.0)
        await runner.setup()
        site = web.TCPSite(runner, args.host, args.port)
        await site.start()
        host, port = args.host, args.port
        server = getattr(site, "_server", None)
        sockets = getattr(server, "sockets", None) or ()
        if sockets:
            port = sockets[0].getsockname()[1]
        shown = f"[{host}]" if ":" in host else host
        listening = f"listening on http://{shown}:{port}"
        if args.log_format == "json":  # the message holds that text, unchanged
            log.info("%s", listening, extra={"fields": {"host": host, "port": port}})
        else:
            print(listening, file=sys.stderr, flush=True)
        await stop.wait()
        log.info("draining: new tasks refused; running tasks get %g s", args.drain_timeout)
        cut = await manager.drain(args.drain_timeout)
        if cut:
            log.info("%d task(s) cut by the drain: they resume at the next start", cut)
        return EXIT_OK
    finally:
        if runner is not None:
            await runner.cleanup()
        try:
            await worker.close()
        finally:
            await io.close(grace_s=2.0)
            store_thread.close()
