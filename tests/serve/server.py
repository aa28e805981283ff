"""A real ``blockx serve`` process for the tests, and plain HTTP to talk to it.

The server runs as ``python -m blockx serve --port 0`` in a clean environment; the
port is read from its ``listening on http://HOST:PORT`` line. HTTP goes through the
standard library's ``http.client`` (the tests never trust the project's own client
to check the server).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tests.cli.cli_support import clean_env

__all__ = ["Reply", "Server", "wait_for"]

_LISTENING = re.compile(r"listening on http://([^\s:]+|\[[^\]]+\]):(\d+)")


class Reply:
    """One HTTP answer: status, headers, body (and its JSON)."""

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def __repr__(self) -> str:
        return f"Reply({self.status}, {self.body[:300]!r})"

    def json(self) -> Any:
        return json.loads(self.body)

    def lines(self) -> list[Any]:
        return [json.loads(line) for line in self.body.splitlines() if line.strip()]


def wait_for(condition: Any, timeout: float = 60.0, what: str = "the condition") -> Any:
    """Poll ``condition()`` until it returns a true value (returned); fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


class Server:
    """``blockx serve`` on a free loopback port, stopped by :meth:`stop` (or :meth:`kill`)."""

    def __init__(
        self,
        data_dir: Path,
        *args: str,
        token: str | None = None,
        executors: int = 2,
        env: dict[str, str] | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.args = args
        self.token = token
        self.executors = executors
        self.env = env or clean_env()
        self.proc: subprocess.Popen[bytes] | None = None
        self.host = "127.0.0.1"
        self.port = 0
        self.stderr_lines: list[str] = []
        self._reader: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"Server({self.url}, pid={self.proc.pid if self.proc else None})"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def stderr(self) -> str:
        return "".join(self.stderr_lines)

    def start(self, timeout: float = 90.0) -> Server:
        cmd = [
            sys.executable,
            "-m",
            "blockx",
            "serve",
            "--port",
            "0",
            "--data-dir",
            str(self.data_dir),
            "--executors",
            str(self.executors),
            *self.args,
        ]
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=self.env
        )
        found = threading.Event()

        def read() -> None:
            assert self.proc is not None and self.proc.stderr is not None
            for raw in self.proc.stderr:
                line = raw.decode("utf-8", "replace")
                self.stderr_lines.append(line)
                match = _LISTENING.search(line)
                if match and not found.is_set():
                    self.host = match.group(1).strip("[]")
                    self.port = int(match.group(2))
                    found.set()

        self._reader = threading.Thread(target=read, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + timeout
        while not found.wait(0.05):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self._reader.join(5)
                raise AssertionError(
                    f"blockx serve did not start (exit {self.proc.poll()}):\n{self.stderr}"
                )
        wait_for(lambda: self.request("GET", "/readyz").status == 200, timeout, "readyz")
        return self

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        token: str | bool | None = True,
        timeout: float = 60.0,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        """One request; ``body`` bytes as is, else JSON. ``token=True``: the server's."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        sent: dict[str, str] = dict(headers or {})
        data: bytes | None = None
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            sent["Content-Type"] = content_type
        bearer = self.token if token is True else (token or None)
        if bearer:
            sent["Authorization"] = f"Bearer {bearer}"
        try:
            conn.request(method, path, body=data, headers=sent)
            response = conn.getresponse()
            payload = response.read()
            return Reply(response.status, dict(response.getheaders()), payload)
        finally:
            conn.close()

    def submit(self, task: dict[str, Any]) -> str:
        reply = self.request("POST", "/v1/tasks", task)
        assert reply.status == 201, reply
        return str(reply.json()["id"])

    def status(self, task_id: str) -> dict[str, Any]:
        reply = self.request("GET", f"/v1/tasks/{task_id}")
        assert reply.status == 200, reply
        return dict(reply.json())

    def wait_finished(self, task_id: str, timeout: float = 120.0) -> dict[str, Any]:
        return dict(
            wait_for(
                lambda: (
                    (s := self.status(task_id))["state"] in ("succeeded", "failed", "cancelled")
                    and s
                ),
                timeout,
                f"task {task_id} to finish",
            )
        )

    def rows(self, task_id: str, after: int = 0) -> list[Any]:
        reply = self.request("GET", f"/v1/tasks/{task_id}/rows?after={after}", timeout=120)
        assert reply.status == 200, reply
        return reply.lines()

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM and wait (the drain); returns the exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._reader is not None:
            self._reader.join(5)
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL: the crash the store must survive (its executors get SIGKILL from the
        kernel too: the pool starts them with a parent-death signal)."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        if self._reader is not None:
            self._reader.join(5)
