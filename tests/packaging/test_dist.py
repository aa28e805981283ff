"""Packaging (issue #22, item 6): ``python -m build`` makes an sdist and a wheel that
``twine check`` accepts; the sdist carries LICENSE, docs, examples and tests; the wheel
carries the package and the build's stamp, so ``blockx --version`` says why nothing is
compiled.

The build runs on a copy of the source tree (``--no-isolation``: no network in tests;
``BLOCKX_PURE_PYTHON=1``: no compiler run), never on the tree itself: setup.py stamps
the tree it builds, and a pure stamp in a developer's compiled checkout would make it run
pure. The dependency check is skipped because a pure build needs setuptools alone (the
exact mypy pin is for compiled builds); setuptools' version is checked here instead.
"""

from __future__ import annotations

import email
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
_NOT_SOURCES = shutil.ignore_patterns(
    ".git",
    ".venv",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    "*.so",
    "*.pyc",
    "_native_build.json",
    ".data",
    ".blockx",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    ".hypothesis",
)


@dataclass(frozen=True)
class Dist:
    sdist: Path
    wheel: Path
    sdist_names: frozenset[str]
    wheel_names: frozenset[str]
    build_log: str


def _setuptools_version() -> tuple[int, ...]:
    from importlib.metadata import version

    return tuple(int(p) for p in version("setuptools").split(".")[:2] if p.isdigit())


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Dist:
    if _setuptools_version() < (77,):
        pytest.fail(
            "setuptools >= 77 is needed to build (SPDX licence, license-files): "
            "pip install -e '.[test]' installs it"
        )
    work = tmp_path_factory.mktemp("packaging")
    tree = work / "blockx-src"
    shutil.copytree(ROOT, tree, ignore=_NOT_SOURCES)
    out = work / "dist"
    env = {**os.environ, "BLOCKX_PURE_PYTHON": "1"}
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "build", "--no-isolation", "--skip-dependency-check"),
            *("--outdir", str(out), str(tree)),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    [sdist] = out.glob("*.tar.gz")
    [wheel] = out.glob("*.whl")
    with tarfile.open(sdist) as tar:
        top = sdist.name.removesuffix(".tar.gz") + "/"
        sdist_names = frozenset(m.name.removeprefix(top) for m in tar.getmembers() if m.isfile())
    with zipfile.ZipFile(wheel) as zf:
        wheel_names = frozenset(zf.namelist())
    return Dist(sdist, wheel, sdist_names, wheel_names, proc.stdout + proc.stderr)


def test_twine_check_accepts_both(dist: Dist) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(dist.sdist), str(dist.wheel)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("PASSED") == 2, proc.stdout


def test_the_wheel_holds_the_package_the_stamp_and_the_licence(dist: Dist) -> None:
    names = dist.wheel_names
    for name in (
        "blockx/__init__.py",
        "blockx/py.typed",
        "blockx/_native_build.json",
        "blockx/cli/schema.py",
        "blockx/cli/yaml12.py",
        "blockx/serve/dashboard/index.html",
        "blockx/serve/dashboard/vendor/uPlot.LICENSE",
    ):
        assert name in names, name
    info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
    assert f"{info}/licenses/LICENSE" in names
    assert not [n for n in names if n.endswith(".so") or n.startswith(("tests/", "docs/"))]
    with zipfile.ZipFile(dist.wheel) as zf:
        stamp = json.loads(zf.read("blockx/_native_build.json"))
        metadata = email.message_from_bytes(zf.read(f"{info}/METADATA"))
        entry_points = zf.read(f"{info}/entry_points.txt").decode()
    assert "BLOCKX_PURE_PYTHON" in stamp["note"], stamp
    assert stamp["modules"] and all(v is None for v in stamp["modules"].values())
    assert metadata["License-Expression"] == "Apache-2.0"
    classifiers = metadata.get_all("Classifier") or []
    assert "Operating System :: MacOS" in classifiers
    assert "Operating System :: POSIX :: Linux" in classifiers
    assert metadata.get_all("Project-URL"), "project URLs"
    assert "blockx = blockx.cli:console_main" in entry_points


def test_the_sdist_holds_licence_docs_examples_and_tests(dist: Dist) -> None:
    names = dist.sdist_names
    for name in ("LICENSE", "README.md", "setup.py", "pyproject.toml", "Makefile"):
        assert name in names, name
    wanted = [
        p.relative_to(ROOT).as_posix()
        for top in ("docs", "examples", "tests")
        for p in (ROOT / top).rglob("*")
        if p.is_file()
        and p.suffix in (".md", ".py", ".yaml", ".jsonl", ".toml", ".png")
        and "__pycache__" not in p.parts
        and ".data" not in p.parts
    ]
    assert len(wanted) > 100
    missing = [name for name in wanted if name not in names]
    assert not missing, missing
    shipped_build = [n for n in names if n.endswith((".so", "_native_build.json"))]
    assert not shipped_build, shipped_build


def test_version_of_the_installed_wheel_says_why_nothing_is_compiled(
    dist: Dist, tmp_path: Path
) -> None:
    """The wheel unpacked alone on the path (its dependencies from this environment)."""
    site = tmp_path / "site"
    with zipfile.ZipFile(dist.wheel) as zf:
        zf.extractall(site)
    env = {**os.environ, "PYTHONPATH": str(site)}
    env.pop("BLOCKX_PURE_PYTHON", None)
    proc = subprocess.run(
        [sys.executable, "-m", "blockx", "--version"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "pure Python (BLOCKX_PURE_PYTHON was set when it was installed)" in proc.stdout, (
        proc.stdout
    )
