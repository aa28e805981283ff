"""A throwaway PostgreSQL server for the tests: ``initdb`` into a temp dir, ``pg_ctl start``.

:func:`find_pg_bin` looks for ``initdb`` on PATH, then under
``/usr/lib/postgresql/*/bin`` (Debian's layout) and ``/usr/pgsql-*/bin``.
:class:`PgCluster` runs the server on a free loopback port with trust
authentication, ``fsync=off``, its unix socket in the data directory and
``pg_stat_statements`` loaded (tests count the statements an engine sends). As
root it runs ``initdb``/``pg_ctl`` as ``nobody`` (``initdb`` refuses root): the
directory is made in ``/tmp`` and handed to that user. ``stop()`` stops the
server (``-m immediate``) and removes the directory.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator

import pytest

INSTALL_HINT = (
    "PostgreSQL server binaries (initdb, pg_ctl) were not found on PATH nor under "
    "/usr/lib/postgresql/*/bin; install them with `sudo scripts/install-system-deps.sh` "
    "(Debian/Ubuntu: apt-get install postgresql)"
)


def find_pg_bin() -> str | None:
    """The directory holding ``initdb`` and ``pg_ctl``, or None."""
    found = shutil.which("initdb")
    if found:
        directory = os.path.dirname(os.path.realpath(found))
        if os.path.exists(os.path.join(directory, "pg_ctl")):
            return directory
        if shutil.which("pg_ctl"):
            return os.path.dirname(found)
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)
    candidates += sorted(glob.glob("/usr/pgsql-*/bin/initdb"), reverse=True)
    for path in candidates:
        directory = os.path.dirname(path)
        if os.path.exists(os.path.join(directory, "pg_ctl")):
            return directory
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgCluster:
    """One PostgreSQL server (see the module docstring)."""

    def __init__(self, bin_dir: str) -> None:
        self.bin_dir = bin_dir
        self.root = tempfile.mkdtemp(prefix="blockx-pg-", dir="/tmp")
        self.data = os.path.join(self.root, "data")
        self.log = os.path.join(self.root, "server.log")
        self.port = _free_port()
        self.user: str | None = None
        if os.geteuid() == 0:
            self.user = "nobody"
            entry = pwd.getpwnam(self.user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        os.chmod(self.root, 0o755)

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        command = [os.path.join(self.bin_dir, args[0]), *args[1:]]
        if self.user is not None:
            command = ["runuser", "-u", self.user, "--", *command]
        return subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.root,
            env={**os.environ, "LC_ALL": "C", "LANG": "C"},
        )

    def start(self) -> PgCluster:
        done = self._run(
            "initdb",
            "-D",
            self.data,
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        )
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed:\n{done.stdout}\n{done.stderr}")
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.data} -F "
            "-c max_connections=60 -c shared_buffers=16MB "
            "-c shared_preload_libraries=pg_stat_statements"
        )
        done = self._run(
            "pg_ctl", "-D", self.data, "-l", self.log, "-o", options, "-w", "-t", "60", "start"
        )
        if done.returncode != 0:
            log = ""
            if os.path.exists(self.log):
                with open(self.log) as f:
                    log = f.read()[-2000:]
            raise RuntimeError(f"pg_ctl start failed:\n{done.stdout}\n{done.stderr}\n{log}")
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return self
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def stop(self) -> None:
        try:
            if os.path.exists(os.path.join(self.data, "postmaster.pid")):
                self._run("pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop", timeout=60)
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    """The DSN of a PostgreSQL server started for this test session (skips without one).

    ``BLOCKX_TEST_PG_DSN`` points the tests at an existing server instead. The conftests
    that need it import it (tests/io, tests/cluster).
    """
    external = os.environ.get("BLOCKX_TEST_PG_DSN", "").strip()
    if external:
        yield external
        return
    bin_dir = find_pg_bin()
    if bin_dir is None:
        pytest.skip(INSTALL_HINT)
    cluster = PgCluster(bin_dir)
    try:
        cluster.start()
    except Exception:
        cluster.stop()
        raise
    try:
        yield cluster.dsn
    finally:
        cluster.stop()
