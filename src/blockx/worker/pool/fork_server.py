"""The worker's side of the executor fork server (``blockx/executor/fork_server.py``).

Theory of operation
-------------------
A cold executor spends ~100 ms of CPU importing before its first frame; one forked
from a process that imported all that once is at its first frame in ~10 ms
(``bench/executor_start.py``). :class:`ForkServer` starts that process
(``python -m blockx.executor.fork_server``) and asks it for executors:
:meth:`ForkServer.request` sends one request on a ``SOCK_SEQPACKET`` socket pair --
the executor's flags, its run mark, this process's environment, and the write ends of
two fresh pipes for the executor's stdout and stderr (``SCM_RIGHTS``) -- and returns
what waits for its answer, the pid (:meth:`ForkServer.spawn` does both). Answers come
in the order of the requests and are read by one thread at a time; sending never
waits for them, so ``blockx run``'s main thread is not held by a server still
importing itself. The server forks with ``clone(CLONE_PARENT)``, so the executor is *this*
process's child: the pool reaps it, reads its status through a pidfd and kills its
group as for any process it started. :class:`ForkedProcess` is what the pool holds
for it (the part of ``subprocess.Popen`` it uses, :class:`~.launch.ExecutorProcess`).

Which spawns take this way is the spawner's choice (``blockx/worker/pool/spawner.py``):
the ``process`` mode with the default command, environment and interpreter, where
:func:`blockx.executor.fork_server.unsupported` finds nothing wrong, unless
``pool.fork_server`` is off. Any failure -- the server could not start, died,
answered an error, or did not answer in :data:`ANSWER_TIMEOUT_S` -- raises
:class:`ForkServerError`; the spawner then spawns cold, and stops asking that server.

**Threads.** The server is started by the thread of the first :meth:`spawn` (or of
:func:`start_early`) behind ``setpriv --pdeathsig`` (it dies with that thread), and
each executor's parent-death signal is tied to that thread too: it must outlive
them, as the spawner thread does. ``blockx run`` starts one server on its main thread
at its first step (:func:`start_early`), so the server imports while the CLI does;
the first pool built for the default configuration adopts it (:func:`take_early`).

**The server's own end.** :meth:`ForkServer.close` closes the socket; the server
exits on that and is reaped. A server killed between a fork and its answer leaves an
executor the pool never heard of: the worker's peer check refuses its connection
(it is no slot's process), it exits, and stays a zombie of the worker until the
worker exits. ``stderr`` is inherited (a server that cannot start
says why there); stdout is ``/dev/null``.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any, Final

from blockx.worker.pool import launch
from blockx.worker.pool.process_tree import MARK_ENV

if TYPE_CHECKING:
    from blockx.worker.pool.launch import ExecutorLaunchSpec

__all__ = [
    "ANSWER_TIMEOUT_S",
    "ForkServer",
    "ForkServerError",
    "ForkedProcess",
    "discard_early",
    "start_early",
    "take_early",
]

#: How long a spawn waits for the server's answer, its imports included (seconds).
ANSWER_TIMEOUT_S: Final = 30.0
#: Bytes of room for the executor's command line in the server's (the kernel shows a
#: process's command line from that fixed region): ~4x a long one.
CMDLINE_ROOM: Final = 2048
_ANSWER_MAX: Final = 4096


class ForkServerError(Exception):
    """The fork server could not give an executor (the spawner then spawns it cold)."""


class ForkedProcess:
    """An executor forked by the server as this process's child: what the pool uses of
    a ``subprocess.Popen`` (:class:`~blockx.worker.pool.launch.ExecutorProcess`)."""

    def __init__(self, pid: int, stdout: IO[bytes], stderr: IO[bytes]) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.stdout: IO[bytes] | None = stdout
        self.stderr: IO[bytes] | None = stderr
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"ForkedProcess(pid={self.pid}, returncode={self.returncode})"

    def poll(self) -> int | None:
        """The exit status once it exited (reaping it), else None."""
        with self._lock:
            if self.returncode is not None:
                return self.returncode
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: the status is lost
                self.returncode = 255
                return self.returncode
            if pid == 0:
                return None
            self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the exit (``subprocess.TimeoutExpired`` past ``timeout``)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.0005
        while True:
            returncode = self.poll()
            if returncode is not None:
                return returncode
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise subprocess.TimeoutExpired(f"executor pid {self.pid}", timeout or 0.0)
                delay = min(delay, left)
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """One fork server process and the socket to it (see the module docstring)."""

    def __init__(self, python: str | None = None) -> None:
        self.python = python or sys.executable
        #: Guards the process, the socket and the sends (held only briefly).
        self._lock = threading.Lock()
        #: Held by the one thread reading answers (up to ANSWER_TIMEOUT_S).
        self._receiving = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._socket: socket.socket | None = None
        #: Why the server is out of use (None: usable).
        self.broken: str | None = None
        #: Executors it forked so far.
        self.forked = 0
        #: Requests sent and answers read so far; answers read for a later collector.
        self._sent = 0
        self._received = 0
        self._answers: dict[int, dict[str, Any]] = {}

    def __repr__(self) -> str:
        pid = None if self._process is None else self._process.pid
        state = self.broken or ("running" if pid is not None else "not started")
        return f"ForkServer(pid={pid}, {state}, forked={self.forked})"

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def start(self) -> None:
        """Start the server process now, if it is not running (idempotent). Raises
        :class:`ForkServerError` when it cannot be started."""
        with self._lock:
            self._start()

    def _start(self) -> None:
        if self.broken is not None:
            raise ForkServerError(self.broken)
        if self._process is not None:
            return
        from blockx.executor.fork_server import MARK_PLACEHOLDER, unsupported

        problem = unsupported()
        if problem is not None:
            self.broken = problem
            raise ForkServerError(problem)
        if shutil.which(self.python) is None:  # behind setpriv it would only exit 127
            self.broken = f"cannot start the fork server: {self.python}: no such executable"
            raise ForkServerError(self.broken)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = [
            self.python,
            "-m",
            "blockx.executor.fork_server",
            "--socket-fd",
            str(theirs.fileno()),
            "--mark-env",
            MARK_ENV,
            "--cmdline-room",
            " " * CMDLINE_ROOM,  # blank in `ps`
        ]
        env = {k: v for k, v in os.environ.items() if k != MARK_ENV}
        env[MARK_ENV] = MARK_PLACEHOLDER  # last: the children write their mark over it
        preexec = None
        setpriv = launch.setpriv_path()
        if setpriv is not None:
            argv = [setpriv, "--pdeathsig", "KILL", "--", *argv]
        else:
            preexec = launch.pdeathsig_preexec()
        try:
            self._process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                env=env,
                pass_fds=(theirs.fileno(),),
                close_fds=True,
                start_new_session=True,
                preexec_fn=preexec,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            ours.close()
            self.broken = f"cannot start the fork server: {exc}"
            raise ForkServerError(self.broken) from exc
        finally:
            theirs.close()
        self._socket = ours

    def spawn(self, spec: ExecutorLaunchSpec) -> ForkedProcess:
        """One executor for ``spec``, forked by the server (started first if need be)."""
        return self.request(spec)()

    def request(self, spec: ExecutorLaunchSpec) -> Callable[[], ForkedProcess]:
        """Ask for an executor for ``spec`` now, without waiting for the answer: the
        function returned waits for it (call it exactly once, from any thread). The
        answers come in the order of the requests; a server still importing answers
        once it is ready, so ``blockx run``'s main thread sends its requests and goes
        on importing the worker while the spawner thread waits (``PoolManager.spawn_early``)."""
        with self._lock:
            self._start()
            assert self._socket is not None
            out_r, out_w = os.pipe2(os.O_CLOEXEC)
            err_r, err_w = os.pipe2(os.O_CLOEXEC)
            request: dict[str, Any] = {
                "argv": spec.args.to_argv(),
                "mark": spec.run_mark,
                "env": {k: v for k, v in os.environ.items() if k != MARK_ENV},
            }
            failed: OSError | None = None
            try:
                socket.send_fds(self._socket, [json.dumps(request).encode()], [out_w, err_w])
            except OSError as exc:
                failed = exc
                os.close(out_r)
                os.close(err_r)
            finally:
                os.close(out_w)
                os.close(err_w)
            ticket = self._sent
            self._sent += 1
        if failed is not None:
            self._break(self._ended() or f"the fork server's socket failed: {failed}")
        return functools.partial(self._collect, ticket, out_r, err_r)

    def _collect(self, ticket: int, out_r: int, err_r: int) -> ForkedProcess:
        """The answer to request ``ticket``: its executor, or :class:`ForkServerError`."""
        try:
            with self._receiving:  # one reader at a time; senders do not wait for it
                while ticket not in self._answers:
                    self._answers[self._received] = self._receive()
                    self._received += 1
                answer = self._answers.pop(ticket)
            pid = answer.get("pid")
            if not isinstance(pid, int) or pid <= 0:
                raise ForkServerError(f"the fork server refused: {answer.get('error', answer)}")
            with self._lock:
                self.forked += 1
        except BaseException:
            os.close(out_r)
            os.close(err_r)
            raise
        stdout, stderr = open(out_r, "rb", buffering=0), open(err_r, "rb", buffering=0)
        return ForkedProcess(pid, stdout, stderr)

    def _receive(self) -> dict[str, Any]:
        """The next answer on the socket (breaking the server when there is none)."""
        sock = self._socket
        if sock is None:
            raise ForkServerError(self.broken or "the fork server is closed")
        try:
            sock.settimeout(ANSWER_TIMEOUT_S)
            answer = sock.recv(_ANSWER_MAX)
        except TimeoutError:
            self._break(f"no answer from the fork server in {ANSWER_TIMEOUT_S:.0f}s")
        except OSError as exc:
            self._break(self._ended() or f"the fork server's socket failed: {exc}")
        if not answer:
            self._break(self._ended() or "the fork server closed its socket")
        try:
            decoded = json.loads(answer)
        except ValueError:
            self._break(f"the fork server answered nonsense: {answer[:80]!r}")
        if not isinstance(decoded, dict):
            self._break(f"the fork server answered nonsense: {answer[:80]!r}")
        return dict(decoded)

    def _ended(self) -> str | None:
        """How the server process ended, once it has (within 1 s); None: it runs."""
        from blockx.worker.pool.exits import describe_returncode  # here: it imports blockx.wire

        if self._process is None:
            return None
        try:
            status = self._process.wait(1.0)
        except subprocess.TimeoutExpired:
            return None
        return f"the fork server ended ({describe_returncode(status)})"

    def _break(self, why: str) -> Any:
        """Out of use for good: the server is killed and reaped; raises."""
        with self._lock:
            if self.broken is None:
                self.broken = why
            self._stop(kill=True)
        raise ForkServerError(why)

    def close(self, timeout: float = 5.0) -> None:
        """End the server (its socket closed: it exits) and reap it. Idempotent."""
        with self._lock:
            if self.broken is None:
                self.broken = "closed"
            self._stop(kill=False, timeout=timeout)

    def _stop(self, *, kill: bool, timeout: float = 5.0) -> None:
        if self._socket is not None:
            with contextlib.suppress(OSError):  # wakes a reader blocked on it
                self._socket.shutdown(socket.SHUT_RDWR)
            self._socket.close()
            self._socket = None
        process, self._process = self._process, None
        if process is None:
            return
        if kill:
            process.kill()
        try:
            wait_for_exit(process, timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_for_exit(process: subprocess.Popen[bytes], timeout: float) -> int:
    """``process.wait(timeout)``, woken by the exit itself where Linux gives a pidfd.

    ``Popen.wait`` with a timeout polls with a doubling sleep (0.5 ms, 1, 2, 4 ...):
    the server, which leaves ~1-2 ms after its socket closes, was reaped 1-3 ms late
    at the end of every ``blockx run`` (its pool's stop waits for it). Raises
    ``subprocess.TimeoutExpired`` as ``wait`` does."""
    if process.returncode is not None:
        return process.returncode
    try:
        pidfd = os.pidfd_open(process.pid)
    except (AttributeError, OSError):  # not Linux >= 5.3, or already reaped elsewhere
        return process.wait(timeout)
    try:
        # poll, not select: a worker holding many connections has descriptors past
        # select's FD_SETSIZE (1024), and the pidfd would be one of them.
        watch = select.poll()
        watch.register(pidfd, select.POLLIN)
        ready = watch.poll(max(timeout, 0.0) * 1000)
    finally:
        os.close(pidfd)
    if not ready and process.poll() is None:
        raise subprocess.TimeoutExpired(process.args, timeout)
    return process.wait()  # it exited: reaped at once


# --- blockx run's server, started at its first step ------------------------------------

_early: ForkServer | None = None
_early_thread: threading.Thread | None = None


def start_early(python: str | None = None) -> None:
    """Start a server now, from this thread (``blockx run``'s main thread), for the first
    pool to adopt (:func:`take_early`). Nothing happens where it would not be used."""
    global _early, _early_thread
    if _early is not None:
        return
    server = ForkServer(python)
    try:
        server.start()
    except ForkServerError:
        return
    _early, _early_thread = server, threading.current_thread()
    atexit.register(discard_early)  # a command that ends before any pool took it


def take_early() -> ForkServer | None:
    """The server :func:`start_early` started, for a spawner whose spawns this thread
    makes (once; None: none, or another thread started it). A spawn for another
    interpreter than the server's starts cold all the same."""
    global _early, _early_thread
    server = _early
    if server is None or threading.current_thread() is not _early_thread:
        return None
    _early = _early_thread = None
    return server


def discard_early() -> None:
    """Close the early server if no pool took it (idempotent)."""
    global _early, _early_thread
    server, _early, _early_thread = _early, None, None
    if server is not None:
        server.close()
