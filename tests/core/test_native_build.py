"""The compiled modules (mypyc): built when a compiler is at hand, never run stale.

``setup.py`` compiles the per-call modules and stamps the sources it compiled;
``blockx.native`` runs them compiled only when every source is still the one
compiled and ``BLOCKX_PURE_PYTHON`` is not set.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from tests.helpers.compiled import skip_if_compiled

import blockx
from blockx import native
from blockx.worker.core.records import Record

PACKAGE_DIR = Path(blockx.__file__).parent
STAMP = PACKAGE_DIR / native.STAMP_NAME


def _stamp() -> dict[str, object]:
    if not STAMP.exists():
        pytest.skip(f"no {native.STAMP_NAME}: this source tree was not installed (make setup)")
    return json.loads(STAMP.read_text())


def _compiler_at_hand() -> bool:
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    return shutil.which(cc) is not None


def _python(code: str, **env: str) -> str:
    run_env = {k: v for k, v in os.environ.items() if k != native.ENV_PURE}
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        env={**run_env, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return result.stdout.strip()


def test_the_install_compiled_every_listed_module_when_a_compiler_is_at_hand() -> None:
    stamp = _stamp()
    modules = stamp["modules"]
    assert isinstance(modules, dict)
    for hot in (  # one per compiled package
        "blockx.worker.core.dispatcher",
        "blockx.worker.actor.orchestrator",
        "blockx.worker.io.scope",
        "blockx.executor.runtime",
        "blockx.wire.frames",
    ):
        assert hot in modules
    if not _compiler_at_hand():
        pytest.skip("no C compiler here: the build is pure Python by design")
    assert all(modules.values()), f"the build compiled nothing: {stamp.get('note')}"
    # In a fresh process, without the switch: every listed module is its extension.
    code = (
        "import importlib, blockx.native as n; s = n.status(); "
        f"mods = {sorted(modules)!r}; "
        "print(s.describe()); "
        "print(all(not importlib.import_module(m).__file__.endswith('.py') for m in mods))"
    )
    described, all_compiled = _python(code).splitlines()
    assert described == f"{len(modules)} modules compiled (mypyc)"
    assert all_compiled == "True"


def test_blockx_pure_python_runs_every_listed_module_from_its_source() -> None:
    modules = _stamp()["modules"]
    assert isinstance(modules, dict)
    code = (
        "import importlib, blockx.native as n; "
        f"mods = {sorted(modules)!r}; "
        "print(n.status().describe()); "
        "print(sorted({importlib.import_module(m).__file__.rsplit('.', 1)[1] for m in mods}))"
    )
    described, suffixes = _python(code, BLOCKX_PURE_PYTHON="1").splitlines()
    assert described == f"pure Python ({native.ENV_PURE} is set)"
    assert suffixes == "['py']"
    # "0" and "" leave the decision to the build.
    assert "BLOCKX_PURE_PYTHON is set" not in _python(
        "import blockx.native as n; print(n.status().describe())", BLOCKX_PURE_PYTHON="0"
    )


def test_a_source_edited_after_the_build_runs_as_source_and_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(native.ENV_PURE, raising=False)
    lifecycle = PACKAGE_DIR / "worker" / "core" / "lifecycle.py"
    dispatcher = PACKAGE_DIR / "worker" / "core" / "dispatcher.py"
    current = {
        "blockx.worker.core.lifecycle": native.source_digest(str(lifecycle)),
        "blockx.worker.core.dispatcher": native.source_digest(str(dispatcher)),
    }
    fresh = native._decide({"modules": current})
    assert fresh.compiled == tuple(sorted(current)) and fresh.pure == ()

    stale = native._decide({"modules": {**current, "blockx.worker.core.lifecycle": "0" * 64}})
    assert stale.compiled == ()
    assert stale.pure == tuple(sorted(current))  # all or nothing: they call each other natively
    assert "blockx/worker/core/lifecycle.py" in stale.reason
    assert "dispatcher.py" not in stale.reason
    assert "make setup" in stale.reason

    missing = native._decide({"modules": {"blockx.worker.core.gone": "0" * 64}})
    assert missing.pure == ("blockx.worker.core.gone",)
    assert "blockx/worker/core/gone.py" in missing.reason


def test_a_source_whose_size_and_mtime_are_the_stamped_ones_is_not_read_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(native.ENV_PURE, raising=False)
    lifecycle = PACKAGE_DIR / "worker" / "core" / "lifecycle.py"
    name = "blockx.worker.core.lifecycle"
    digest = native.source_digest(str(lifecycle))
    info = lifecycle.stat()
    read: list[str] = []
    original = native.source_digest

    def counting_digest(path: str) -> str:
        read.append(path)
        return original(path)

    monkeypatch.setattr(native, "source_digest", counting_digest)
    same = {name: [info.st_size, info.st_mtime_ns]}
    # Stat unchanged: trusted, not read (even a wrong digest stands: the stamp vouches).
    assert native._decide({"modules": {name: digest}, "stats": same}).compiled == (name,)
    assert native._decide({"modules": {name: "0" * 64}, "stats": same}).compiled == (name,)
    assert read == []
    # Stat changed (touched, or edited): read and compared.
    moved = {name: [info.st_size, info.st_mtime_ns + 1]}
    assert native._decide({"modules": {name: digest}, "stats": moved}).compiled == (name,)
    stale = native._decide({"modules": {name: "0" * 64}, "stats": moved})
    assert stale.compiled == () and "lifecycle.py" in stale.reason
    assert len(read) == 2


def test_a_compiled_build_stamps_each_sources_size_and_mtime() -> None:
    stamp = json.loads((PACKAGE_DIR / native.STAMP_NAME).read_text(encoding="utf-8"))
    if not all(stamp["modules"].values()):
        pytest.skip(f"this install is pure Python: {stamp.get('note')}")
    assert set(stamp["stats"]) == set(stamp["modules"])
    for name, (size, mtime_ns) in stamp["stats"].items():
        assert isinstance(size, int) and size > 0 and isinstance(mtime_ns, int), name


def test_a_pure_build_says_why_and_no_stamp_decides_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(native.ENV_PURE, raising=False)
    pure = native._decide(
        {"modules": {"blockx.worker.core.lifecycle": None}, "note": "the C compile failed: x"}
    )
    assert pure.compiled == () and pure.pure == ("blockx.worker.core.lifecycle",)
    assert pure.describe() == "pure Python (the C compile failed: x)"
    nothing = native._decide({})
    assert nothing == native.NativeStatus((), (), "")
    assert nothing.describe() == "pure Python (no native build)"


@pytest.fixture
def installed_copy(tmp_path: Path) -> Path:
    """A copy of the installed package (sources, compiled files, stamp) to spoil."""
    if not any(_stamp()["modules"].values()):  # type: ignore[union-attr]
        pytest.skip("the build here is pure Python: nothing compiled to run stale")
    shutil.copytree(PACKAGE_DIR, tmp_path / "blockx", ignore=shutil.ignore_patterns("__pycache__"))
    for group_library in PACKAGE_DIR.parent.glob("*__mypyc*"):  # mypyc's shared code
        shutil.copy2(group_library, tmp_path)
    return tmp_path


def _run_in(root: Path) -> subprocess.CompletedProcess[str]:
    code = (
        "import blockx.native as n, blockx.worker.core.lifecycle as l, "
        "blockx.executor.runtime as r; "
        "print(n.status().describe()); print(l.__file__); print(r.__file__)"
    )
    env = {k: v for k, v in os.environ.items() if k != native.ENV_PURE}
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


def test_an_installed_copy_runs_compiled_until_a_source_changes(installed_copy: Path) -> None:
    untouched = _run_in(installed_copy)
    described, lifecycle, runtime = untouched.stdout.splitlines()
    assert described.endswith("modules compiled (mypyc)")
    assert lifecycle.startswith(str(installed_copy)) and not lifecycle.endswith(".py")
    assert untouched.stderr == ""

    source = installed_copy / "blockx" / "worker" / "core" / "lifecycle.py"
    source.write_text(source.read_text() + "\n# edited after the build\n")
    edited = _run_in(installed_copy)
    described, lifecycle, runtime = edited.stdout.splitlines()
    assert described.startswith("pure Python (sources changed since the build: ")
    assert "blockx/worker/core/lifecycle.py" in described
    # All or nothing: the untouched runtime runs from its source too.
    assert lifecycle == str(source) and runtime.endswith("executor/runtime.py")
    assert "running pure Python" in edited.stderr and "lifecycle.py" in edited.stderr


def test_an_unreadable_stamp_vouches_for_nothing(installed_copy: Path) -> None:
    (installed_copy / "blockx" / native.STAMP_NAME).write_text("{not json")
    spoiled = _run_in(installed_copy)
    described, lifecycle, runtime = spoiled.stdout.splitlines()
    assert described.startswith(f"pure Python (unreadable {native.STAMP_NAME}: ")
    assert lifecycle.endswith("core/lifecycle.py") and runtime.endswith("executor/runtime.py")
    assert "running pure Python" in spoiled.stderr

    (installed_copy / "blockx" / native.STAMP_NAME).write_text("[]")
    described = _run_in(installed_copy).stdout.splitlines()[0]
    assert described == f"pure Python (unreadable {native.STAMP_NAME}: not a JSON object)"


def test_the_source_finder_loads_the_py_file() -> None:
    finder = native._SourceFinder(["blockx.worker.core.retry"])
    spec = finder.find_spec("blockx.worker.core.retry", None)
    assert spec is not None and spec.origin == str(PACKAGE_DIR / "worker" / "core" / "retry.py")
    assert finder.find_spec("blockx.worker.core.state", None) is None


@skip_if_compiled("blockx.worker.core.records", "a compiled Record takes no Python subclass")
def test_a_record_whose_fields_disagree_with_its_init_is_refused() -> None:
    with pytest.raises(TypeError, match="_fields must be the __init__ parameters, in order"):

        class Swapped(Record):
            __slots__ = ("a", "b")
            _fields = ("b", "a")

            def __init__(self, a: int, b: int) -> None:
                self.a = a
                self.b = b

    with pytest.raises(TypeError, match="__slots__ must be exactly"):

        class Unslotted(Record):
            __slots__ = ("a",)
            _fields = ("a", "b")

            def __init__(self, a: int, b: int) -> None:
                self.a = a
                self.b = b
