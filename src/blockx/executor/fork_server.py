"""A warm parent for executor processes: ``python -m blockx.executor.fork_server``.

Theory of operation
-------------------
An executor's cold start is ~100 ms of CPU, most of it the interpreter creating
classes and loading the bytecode of the modules every executor imports
(``bench/executor_start.py``). The fork server pays it once: it imports what an
executor imports, then forks one executor per request, each at its first frame in
~10 ms. The worker's pool starts and asks it (``blockx/worker/pool/fork_server.py``).

**Requests.** The server is started with one end of a ``SOCK_SEQPACKET`` socket pair
(``--socket-fd``). A request is one message: JSON ``{"argv": [executor flags],
"mark": run mark or null, "env": {the worker's environment}}`` with the write ends of
the executor's stdout and stderr pipes as ``SCM_RIGHTS``. The answer is one message,
``{"pid": N}`` or ``{"error": "why"}``; the worker then spawns that executor itself.
The server serves requests one at a time and exits when the socket closes (with
``os._exit``: the worker waits for it as it stops).

**The worker is the executor's parent.** The server forks with
``clone(CLONE_PARENT)`` (:func:`clone_parent`): the child's parent is the server's
parent, the worker, so the pool reaps it, reads its exit status through a pidfd and
kills its process group exactly as for a process it started itself. Python has no
``clone``: the system call goes through ctypes, between ``PyOS_BeforeFork`` and
``PyOS_AfterFork_Child``/``PyOS_AfterFork_Parent``, as ``os.fork`` does (the at-fork
hooks run: ``random`` is reseeded in the child). The server has a single thread
(checked before each fork), so the child inherits no lock another thread held.
What ``fork()`` does and the raw call does not -- glibc's at-fork handlers, and the
thread id glibc caches -- matters to no caller here: glibc asks the kernel for the
id where it signals its own thread (``raise``), and the executor's threads are
created in the child. Only ``x86_64`` and ``aarch64`` Linux with glibc take this
path (:func:`unsupported`); elsewhere the pool spawns as before. The executors of
one server share its string-hash seed (as children of any ``fork`` do); ``random``,
``os.urandom`` and OpenSSL's generator (reseeded on a new pid) do not repeat.

**The child**, before the executor's ``main``:

* ``setsid``: its own session and process group (the pool signals the group);
* ``PR_SET_PDEATHSIG`` = SIGKILL, then a check that its parent is still the worker
  (had the worker died in between, it exits ``EXIT_PARENT_GONE``). The signal is tied
  to the worker thread that started the server: that thread must outlive the executors,
  as for a spawn (the pool's spawner thread, or ``blockx run``'s main thread);
* its stdout and stderr are the pipes it was sent; stdin is the server's
  ``/dev/null``;
* the environment it was sent (only when it differs from the server's), and its
  run mark;
* its identity in ``/proc`` (:func:`write_identity`): the command line of a cold
  executor (``python -m blockx.executor --executor-id …``) written over the
  server's, which was started with room for it (``--cmdline-room``), and its run mark
  over the placeholder value of the mark variable in the environment block (the
  server's last variable): ``ps``, ``pgrep -f`` and the pool's mark scan
  (``/proc/<pid>/environ``) see what they see of a cold executor;
* then the executor's ``main`` (``blockx/executor/__main__.py``) and ``os._exit``.

A request the server cannot honour -- flags longer than the room, a mark longer than
the placeholder, a failed ``clone`` -- gets an error answer, and the pool spawns that
executor the cold way.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final, NoReturn

if TYPE_CHECKING:
    import argparse

# ctypes is imported where it is used: the worker imports this module for unsupported()
# and MARK_PLACEHOLDER, at blockx run's first step.

__all__ = [
    "EXIT_PARENT_GONE",
    "MARK_PLACEHOLDER",
    "clone_parent",
    "main",
    "unsupported",
    "write_identity",
]

#: The child found its parent (the worker) gone before the parent-death signal was armed.
EXIT_PARENT_GONE: Final = 75
#: The child's start failed before the executor's main ran.
EXIT_CHILD_FAILED: Final = 70

#: The mark variable's value in the server's environment: room for a run mark.
MARK_PLACEHOLDER: Final = "fork-server" + "." * 245

_CLONE_PARENT: Final = 0x00008000
_SIGCHLD: Final = 17
_PR_SET_PDEATHSIG: Final = 1
#: ``clone``'s number, by machine; its first argument is the flags on both, and the
#: other four are zero (no new stack, no thread-id words), so their order differs
#: harmlessly.
_SYS_CLONE: Final = {"x86_64": 56, "aarch64": 220}
_REQUEST_MAX: Final = 1 << 20


def unsupported() -> str | None:
    """Why this platform cannot fork executors from a server (None: it can)."""
    if not sys.platform.startswith("linux"):
        return "not Linux"
    machine = os.uname().machine
    if machine not in _SYS_CLONE:
        return f"no clone(CLONE_PARENT) path for {machine}"
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        libc = ""
    if not libc.startswith("glibc"):
        return "not glibc"
    if sys.implementation.name != "cpython":
        return "not CPython"
    gil = getattr(sys, "_is_gil_enabled", None)
    if gil is not None and not gil():
        return "a free-threaded interpreter"
    return None


def clone_parent() -> int:
    """``fork()`` whose child is the caller's parent's child: 0 in the child, its pid in
    the caller. Only from a single-threaded process (see the module docstring)."""
    import ctypes

    if threading.active_count() != 1:
        raise OSError("the fork server has more than one thread")
    api = ctypes.pythonapi
    libc = ctypes.PyDLL(None, use_errno=True)  # PyDLL: the GIL stays held across the call
    libc.syscall.restype = ctypes.c_long
    for name in ("PyOS_BeforeFork", "PyOS_AfterFork_Child", "PyOS_AfterFork_Parent"):
        getattr(api, name).restype = None
    zero = ctypes.c_ulong(0)
    api.PyOS_BeforeFork()
    pid = libc.syscall(
        ctypes.c_long(_SYS_CLONE[os.uname().machine]),
        ctypes.c_ulong(_CLONE_PARENT | _SIGCHLD),
        zero,
        zero,
        zero,
        zero,
    )
    if pid == 0:
        api.PyOS_AfterFork_Child()
        return 0
    error = ctypes.get_errno()
    api.PyOS_AfterFork_Parent()
    if pid < 0:
        raise OSError(error, f"clone(CLONE_PARENT): {os.strerror(error)}")
    return int(pid)


def _regions() -> tuple[int, int, int, int]:
    """``arg_start, arg_end, env_start, env_end`` of this process (``/proc/self/stat``)."""
    with open("/proc/self/stat", "rb") as f:
        stat = f.read()
    fields = stat[stat.rfind(b")") + 2 :].split()
    # Fields 48-51 of proc(5), counted from 1; fields[0] here is field 3 (state).
    arg_start, arg_end, env_start, env_end = (int(v) for v in fields[45:49])
    return arg_start, arg_end, env_start, env_end


def identity_fits(cmdline: bytes, mark: str | None, mark_env: str) -> str | None:
    """Whether :func:`write_identity` can write these here (None), else why not."""
    import ctypes

    arg_start, arg_end, env_start, env_end = _regions()
    if len(cmdline) > arg_end - arg_start:
        return f"the command line ({len(cmdline)} bytes) is longer than the room left for it"
    if mark is not None and len(mark.encode()) > len(MARK_PLACEHOLDER):
        return f"the run mark ({len(mark)} characters) is longer than its placeholder"
    block = ctypes.string_at(env_start, env_end - env_start)
    if _placeholder_at(block, mark_env) < 0:
        return f"no {mark_env} placeholder in the server's environment"
    return None


def _placeholder_at(block: bytes, mark_env: str) -> int:
    """Where the mark variable's entry starts in the environment block (-1: absent)."""
    entry = f"{mark_env}={MARK_PLACEHOLDER}".encode()
    at = block.find(entry)
    while at > 0 and block[at - 1] != 0:
        at = block.find(entry, at + 1)
    return at


def write_identity(cmdline: bytes, mark: str | None, mark_env: str) -> None:
    """Rewrite this process's ``/proc/<pid>/cmdline`` and the mark variable's entry of
    ``/proc/<pid>/environ`` in place (the regions the kernel reads them from); the
    rest of each region is zeroed. ``cmdline`` keeps the server's ``argv[0]`` (glibc's
    ``program_invocation_name`` points there); no mark zeroes the whole entry."""
    import ctypes

    arg_start, arg_end, env_start, env_end = _regions()
    room = arg_end - arg_start
    ctypes.memmove(arg_start, cmdline + bytes(room - len(cmdline)), room)
    block = ctypes.string_at(env_start, env_end - env_start)
    at = _placeholder_at(block, mark_env)
    if at < 0:
        return
    entry = len(mark_env) + 1 + len(MARK_PLACEHOLDER)
    value = b"" if mark is None else f"{mark_env}={mark}".encode()
    ctypes.memmove(env_start + at, value + bytes(entry - len(value)), entry)


def executor_cmdline(argv: Sequence[str]) -> bytes:
    """A cold executor's ``/proc`` command line with these flags, this ``argv[0]``."""
    import ctypes

    arg_start, arg_end, _, _ = _regions()
    head = ctypes.string_at(arg_start, arg_end - arg_start)
    argv0 = head[: head.index(b"\0") + 1]
    return argv0 + b"".join(a.encode() + b"\0" for a in ("-m", "blockx.executor", *argv))


def _warm() -> None:
    """Import what every executor imports, once, here."""
    import importlib

    for name in (
        "ast",  # an executor's first compile needs it
        "blockx.executor.__main__",
        "blockx.executor.containment",
        "blockx.executor.heartbeat",
        "blockx.executor.process_metrics",
        "blockx.executor.runtime",
        "blockx.executor.uds_session",
        "blockx.portability",
        "blockx.wire.blackbox",
    ):
        importlib.import_module(name)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m blockx.executor.fork_server")
    parser.add_argument("--socket-fd", type=int, required=True)
    parser.add_argument("--mark-env", required=True)
    parser.add_argument("--cmdline-room", default="", help="ignored: room for a command line")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Serve fork requests until the socket closes; return the exit status."""
    args = _parse(argv)
    problem = unsupported()
    if problem is not None:
        sys.stderr.write(f"blockx fork server: cannot run here: {problem}\n")
        return 2
    sock = socket.socket(fileno=args.socket_fd)
    _warm()
    gc.collect()
    gc.freeze()  # the imported objects stay out of the children's collections (and pages)
    worker = os.getppid()
    while True:
        try:
            message, fds, _flags, _addr = socket.recv_fds(sock, _REQUEST_MAX, 2)
        except InterruptedError:  # pragma: no cover - PEP 475 retries
            continue
        except OSError:
            return 0
        if not message:
            for fd in fds:
                os.close(fd)
            return 0
        answer = _serve(sock, message, fds, worker, args.mark_env)
        try:
            sock.send(json.dumps(answer).encode())
        except OSError:
            # The worker gave up on this answer: the executor it would not know of dies.
            pid = answer.get("pid")
            if isinstance(pid, int):
                os.kill(pid, signal.SIGKILL)
            return 0


def _serve(sock: socket.socket, message: bytes, fds: list[int], worker: int, mark_env: str) -> Any:
    try:
        try:
            request = json.loads(message)
            argv = [str(a) for a in request["argv"]]
            mark = request.get("mark")
            env = {str(k): str(v) for k, v in request["env"].items()}
            if len(fds) != 2:
                return {"error": f"expected 2 descriptors (stdout, stderr), got {len(fds)}"}
            if mark is not None and not isinstance(mark, str):
                return {"error": "the mark must be a string"}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            return {"error": f"malformed request: {type(exc).__name__}: {exc}"}
        cmdline = executor_cmdline(argv)
        why = identity_fits(cmdline, mark, mark_env)
        if why is not None:
            return {"error": why}
        try:
            pid = clone_parent()
        except OSError as exc:
            return {"error": str(exc)}
        if pid == 0:
            _become_executor(sock, fds, argv, cmdline, mark, env, worker, mark_env)
        return {"pid": pid}
    finally:
        for fd in fds:
            os.close(fd)


def _become_executor(
    sock: socket.socket,
    fds: list[int],
    argv: list[str],
    cmdline: bytes,
    mark: str | None,
    env: dict[str, str],
    worker: int,
    mark_env: str,
) -> NoReturn:
    """The child: the steps of the module docstring, then the executor's main."""
    import ctypes

    status = EXIT_CHILD_FAILED
    try:
        sock.close()
        os.setsid()
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != worker:
            os._exit(EXIT_PARENT_GONE)
        out, err = fds
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.close(out)
        os.close(err)
        fds.clear()
        inherited = dict(os.environ)
        inherited.pop(mark_env, None)
        if env != inherited:
            os.environ.clear()
            os.environ.update(env)
        if mark is None:
            os.environ.pop(mark_env, None)
        else:
            os.environ[mark_env] = mark
        write_identity(cmdline, mark, mark_env)
        from blockx.executor import __main__ as executor_main

        sys.argv = [executor_main.__file__ or "blockx.executor", *argv]
        sys.orig_argv = [sys.executable, "-m", "blockx.executor", *argv]
        status = executor_main.main(argv)
    except SystemExit as exc:  # argparse on a bad flag
        status = exc.code if isinstance(exc.code, int) else EXIT_CHILD_FAILED
    except BaseException:
        import traceback

        try:
            os.write(2, f"blockx executor (forked): {traceback.format_exc()}".encode())
        except OSError:
            pass
    try:
        from blockx.executor.__main__ import _exit_now
    except BaseException:
        os._exit(status)
    _exit_now(status)  # as a cold executor leaves: streams flushed, no finalization


if __name__ == "__main__":
    # Out at once, as an executor leaves: the interpreter's teardown (~10-20 ms) would
    # hold the worker's own exit, which reaps this process last.
    code = main()
    sys.stderr.flush()
    os._exit(code)
