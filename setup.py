"""Build hook: compile the hot modules with mypyc, or fall back to pure Python.

Everything else about the package is in ``pyproject.toml``. This file exists for
``ext_modules``: the per-call modules in ``NATIVE_MODULES`` (the dispatcher core,
the worker's runtime and IO scope, the executor's runtime, the frame codec) are
compiled by mypyc, which takes their bookkeeping out of the interpreter
(``docs/operations.md``, "Compiled modules", has the figures). The group is one
C file compiled on one core: most of the install's ~2-3 extra minutes.

The build never fails for want of a compiler: if mypyc cannot be imported, its
type check or the C compiler fails, or ``BLOCKX_PURE_PYTHON`` is set to anything
but ``0``, the package is built pure and says so. Either way it writes the stamp
``blockx/_native_build.json`` (into the wheel too: ``BuildPy`` for a pure build,
``BuildExt`` for a compiled one) that ``blockx.native`` reads at import time: the
modules and the SHA-256 of each source compiled (``null`` for a pure build), so
a source edited after the build runs as source, never as the stale ``.so``.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
SRC = ROOT / "src"
STAMP = Path("blockx") / "_native_build.json"

#: Compiled together, as one mypyc group (they call each other natively). Each
#: module is on the hot path of every call; ``docs/operations.md`` says why the
#: others stay interpreted:
#: the core -- ``__init__`` (nothing hot), ``errors`` (exceptions deriving from
#: builtins), ``config`` (user-built values whose bad fields must raise
#: ``ConfigError``, not a compiled class's ``TypeError``);
#: the executor -- ``greenlet_loop`` (a pooled greenlet parked in compiled code has
#: no frame: setting its ``gr_context`` fails), ``compiled_module`` (weak references
#: to its instances), ``markers`` (names only, no code per call), ``errors``,
#: ``__main__`` and the start-up modules;
#: the worker's runtime -- ``actor/events`` (dataclasses naming a
#: TYPE_CHECKING-only class), ``completed_frames`` (msgspec Structs),
#: ``io/read_answer`` (an ``asyncio.Future`` subclass), ``io/handler`` and
#: ``io/backend`` (runtime-checkable Protocols; the values they name are
#: ``io/answers``), the error modules, and what is not per call (pool,
#: spawner, sandbox, postgres, config);
#: the CLI -- everything but ``calls_file`` (its chunk parser runs once per call of a
#: calls file; the rest runs once per command);
#: the wire -- ``messages`` (the slow paths' validation, not per call), ``schema`` (msgspec
#: Structs, whose ``tag=`` mypyc drops), ``type_params`` (a branch for type checkers
#: only, which mypyc would take for unreachable), ``errors``.
NATIVE_MODULES = [
    "blockx/worker/core/attempts.py",
    "blockx/worker/core/blame.py",
    "blockx/worker/core/call_cache.py",
    "blockx/worker/core/commands.py",
    "blockx/worker/core/convergence.py",
    "blockx/worker/core/dispatcher.py",
    "blockx/worker/core/fairness.py",
    "blockx/worker/core/invariants.py",
    "blockx/worker/core/isolation.py",
    "blockx/worker/core/keys.py",
    "blockx/worker/core/lifecycle.py",
    "blockx/worker/core/records.py",
    "blockx/worker/core/registration.py",
    "blockx/worker/core/release.py",
    "blockx/worker/core/retry.py",
    "blockx/worker/core/selection.py",
    "blockx/worker/core/state.py",
    "blockx/worker/core/subcalls.py",
    "blockx/worker/core/types.py",
    "blockx/worker/link/callbacks.py",
    "blockx/worker/link/connection.py",
    "blockx/worker/link/adapter.py",
    "blockx/worker/link/state.py",
    "blockx/worker/link/function_code.py",
    "blockx/worker/link/handlers.py",
    "blockx/worker/link/frame_checks.py",
    "blockx/worker/link/eras.py",
    "blockx/worker/actor/orchestrator.py",
    "blockx/worker/actor/call_specs.py",
    "blockx/worker/actor/attempts.py",
    "blockx/worker/actor/execute.py",
    "blockx/worker/actor/tasks.py",
    "blockx/worker/actor/waits.py",
    "blockx/worker/actor/tick.py",
    "blockx/worker/actor/stats.py",
    "blockx/worker/actor/runs.py",
    "blockx/worker/actor/snapshot_sync.py",
    "blockx/worker/link/outbound.py",
    "blockx/worker/link/reservations.py",
    "blockx/worker/link/snapshot.py",
    "blockx/worker/io/answers.py",
    "blockx/worker/io/rate_limit.py",
    "blockx/worker/io/blockdb.py",
    "blockx/worker/io/blockdb_sqlite.py",
    "blockx/worker/io/cache.py",
    "blockx/worker/io/registry.py",
    "blockx/worker/io/rpc.py",
    "blockx/worker/io/scope.py",
    "blockx/worker/io/stats.py",
    "blockx/executor/call_runner.py",
    "blockx/executor/context.py",
    "blockx/executor/deadline.py",
    "blockx/executor/execute_frames.py",
    "blockx/executor/greenlet_pool.py",
    "blockx/executor/inbound_frames.py",
    "blockx/executor/local_reads.py",
    "blockx/executor/module_registry.py",
    "blockx/executor/outbox.py",
    "blockx/executor/outputs.py",
    "blockx/executor/runtime.py",
    "blockx/executor/sdk_bridge.py",
    "blockx/executor/sdk_bridge_provider.py",
    "blockx/executor/timers.py",
    "blockx/executor/uds_session.py",
    "blockx/wire/blackbox.py",
    "blockx/cli/calls_file.py",
    "blockx/wire/frames.py",
    "blockx/wire/keys.py",
    "blockx/wire/values.py",
]


def _module_name(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def _stamp(compiled: bool, note: str) -> str:
    modules = {
        _module_name(path): (
            hashlib.sha256((SRC / path).read_bytes()).hexdigest() if compiled else None
        )
        for path in NATIVE_MODULES
    }
    stamp: dict[str, object] = {"modules": modules, "note": note}
    if compiled:
        # Size and mtime of each source as compiled: a process start that finds them
        # unchanged trusts the digest without reading the file (blockx.native).
        stamp["stats"] = {
            _module_name(path): [(SRC / path).stat().st_size, (SRC / path).stat().st_mtime_ns]
            for path in NATIVE_MODULES
        }
    return json.dumps(stamp, indent=1, sort_keys=True) + "\n"


def _short(error: object, limit: int = 160) -> str:
    """An error in one line short enough for ``blockx --version`` (a compiler's
    failure names its whole command line)."""
    text = " ".join(str(error).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _say(message: str) -> None:
    print(f"blockx build: {message}", file=sys.stderr)


class BuildExt(build_ext):
    """On a compiler failure, build pure. Always write the stamp."""

    def run(self) -> None:
        compiled, note = bool(self.extensions), NOTE
        if self.extensions:
            try:
                super().run()
            except Exception as exc:  # CompileError, LinkError, a missing compiler
                _say(f"compiling failed ({exc}); installing pure Python")
                compiled, note = False, f"the C compile failed: {_short(exc)}"
                self._remove_partial_outputs()
        self._write_stamp(compiled, note)

    def _targets(self) -> list[Path]:
        # A wheel takes the stamp from build_lib; an editable install reads the
        # source tree (its .so files are copied there), so both get it.
        targets = [Path(self.build_lib) / STAMP]
        if self.inplace or getattr(self, "editable_mode", False):
            targets.append(SRC / STAMP)
        return targets

    def _write_stamp(self, compiled: bool, note: str) -> None:
        text = _stamp(compiled, note)
        for target in self._targets():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")

    def _remove_partial_outputs(self) -> None:
        for ext in self.extensions:
            for base in (Path(self.build_lib), SRC):
                out = base / self.get_ext_filename(ext.name)
                if out.exists():
                    out.unlink()

    def get_outputs(self) -> list[str]:
        return [*super().get_outputs(), str(Path(self.build_lib) / STAMP)]


class BuildPy(build_py):
    """A pure build stamps the wheel too: with no extensions ``build_ext`` never runs,
    so without this the wheel had no ``_native_build.json`` and ``blockx --version``
    could not say why nothing is compiled. A compiled build's stamp is ``BuildExt``'s
    (it runs after this and overwrites nothing here)."""

    def run(self) -> None:
        super().run()
        if not EXTENSIONS:
            target = Path(self.build_lib) / STAMP
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(_stamp(False, NOTE), encoding="utf-8")

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = super().get_outputs(include_bytecode)
        if not EXTENSIONS:
            outputs.append(str(Path(self.build_lib) / STAMP))
        return outputs


def _native_extensions() -> tuple[list, str]:
    if os.environ.get("BLOCKX_PURE_PYTHON", "") not in ("", "0"):
        return [], "BLOCKX_PURE_PYTHON was set when it was installed"
    try:
        from mypyc.build import mypycify
    except ImportError as exc:
        return [], f"mypyc is not available to the build ({exc})"
    # pyproject.toml's mypy settings (strict for the core and the wire); its
    # sections for modules outside this build must not fail it. Modules outside
    # the build are read for their types only (silent): the build environment has
    # the libraries the compiled modules use (pyproject's build requires), not
    # every one the package imports.
    options = [
        "--config-file",
        str(ROOT / "pyproject.toml"),
        "--no-warn-unused-configs",
        "--follow-imports=silent",
    ]
    cwd = os.getcwd()
    os.chdir(SRC)  # mypyc names modules from paths relative to the working directory
    report = io.StringIO()
    try:
        with contextlib.redirect_stdout(report):
            extensions = mypycify(
                [*options, *NATIVE_MODULES],
                opt_level="3",
                target_dir=str(ROOT / "build" / "mypyc"),
            )
        return extensions, ""
    except (Exception, SystemExit) as exc:  # mypyc reports type errors, then exits
        lines = [line for line in report.getvalue().splitlines() if "error:" in line]
        detail = _short("; ".join(lines[:3]) or repr(exc), 300)
        return [], f"mypyc could not compile the modules: {detail}"
    finally:
        os.chdir(cwd)


EXTENSIONS, NOTE = _native_extensions()
if NOTE:
    _say(f"installing pure Python: {NOTE}")
    # No extensions: build_ext will not run, so stamp the source tree here (an
    # editable install reads it; compiled files left by an earlier build must
    # not shadow the sources).
    (SRC / STAMP).write_text(_stamp(False, NOTE), encoding="utf-8")

setup(ext_modules=EXTENSIONS, cmdclass={"build_ext": BuildExt, "build_py": BuildPy})
