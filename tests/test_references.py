"""Every file the code and the docs cite exists in the repository.

Theory of operation
-------------------
Docstrings, comments and docs point readers at other files: ``docs/protocol.md``
for a wire rule, ``bench/adapter_frames.py`` for a figure,
``tests/wire/test_messages.py`` for the test that holds a module to its
contract. A pointer at a file that is not in the repository (a document kept
outside it, a test since renamed) sends the reader nowhere, so this test scans
``src/``, ``tests/``, ``bench/``, ``docs/`` and ``README.md`` for two forms and
checks each against the working tree:

* a path under one of the repository's top-level folders
  (``src/blockx/wire/keys.py``, ``tests/wire/test_messages.py``, ``bench/x.py``,
  ``docs/protocol.md``, ``examples/...``): it must exist relative to the root;
* a Markdown file name, bare or with a folder (``protocol.md``,
  ``../PERFORMANCE.md``): it must exist relative to the citing file's folder,
  the repository root or ``docs/`` (how the docs and the code name them).

A match never starts inside a longer path (``blockx/tests/x.py``, a URL), and a
template such as ``bench/<name>.py`` is not a path. :data:`NOT_FILE_REFERENCES`
lists the few matches that name no file, each with its reason.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("src", "tests", "bench", "docs")
SUFFIXES = {".py", ".pyi", ".md"}

#: A path under a top-level folder of the repository, not inside a longer path.
_ROOTED = re.compile(r"(?<![\w./-])(?:src|tests|bench|docs|examples)/[\w.-]+(?:/[\w.-]+)*")
#: A Markdown file name, bare or with folders, not inside a longer path.
_MARKDOWN = re.compile(r"(?<![\w./-])(?:\.{1,2}/)*(?:[\w-]+/)*[\w-]+\.md\b")

#: Matches that name no file of the repository, and why. Each must still occur
#: somewhere (a test below), so the list cannot outlive its reasons.
NOT_FILE_REFERENCES: dict[str, str] = {
    "examples/NAME": "a placeholder for an example's folder name (tests/cli/cli_support.py)",
    "examples/broken/functions/bad.py": "sample `blockx validate` output for a made-up task",
    "examples/.data/quickstart.sqlite3": "written by running the quickstart; git-ignored",
    "examples/quickstart/../.data/quickstart.sqlite3": "the same file, as a test computes it",
    "src/blockx/_native_build.json": "written by the compiled build (setup.py); git-ignored",
}


def _scanned_files() -> list[Path]:
    files = [ROOT / "README.md"]
    for top in SCANNED:
        files.extend(
            path
            for path in sorted((ROOT / top).rglob("*"))
            if path.is_file() and path.suffix in SUFFIXES and "__pycache__" not in path.parts
        )
    return files


def _exists_rooted(name: str) -> bool:
    return (ROOT / name.rstrip(".")).exists()


def _exists_markdown(name: str, citing: Path) -> bool:
    return any((base / name).exists() for base in (citing.parent, ROOT, ROOT / "docs"))


def _references() -> list[tuple[Path, int, str, bool]]:
    """``(citing file, line, name, exists)`` for every reference the scan finds."""
    found = []
    for path in _scanned_files():
        if path == Path(__file__).resolve():
            continue  # this file shows the forms, missing names and its allow-list included
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for match in _ROOTED.finditer(line):
                name = match.group(0).rstrip(".")
                found.append((path, number, name, _exists_rooted(name)))
            for match in _MARKDOWN.finditer(line):
                name = match.group(0)
                found.append((path, number, name, _exists_markdown(name, path)))
    return found


def missing_references() -> list[str]:
    """``path:line: name`` for every cited file that does not exist."""
    return [
        f"{path.relative_to(ROOT)}:{number}: {name}"
        for path, number, name, exists in _references()
        if not exists and name not in NOT_FILE_REFERENCES
    ]


def test_the_scan_sees_the_files_it_must() -> None:
    scanned = {path.relative_to(ROOT).as_posix() for path in _scanned_files()}
    assert {"README.md", "docs/protocol.md", "src/blockx/wire/keys.py"} <= scanned
    assert any(name.startswith("bench/") for name in scanned)
    assert any(name.startswith("tests/") for name in scanned)


def test_the_patterns_find_both_forms_and_skip_what_is_no_path() -> None:
    line = (
        "see docs/protocol.md, ``tests/wire/test_messages.py``, PROTOCOL.md, "
        "(../PERFORMANCE.md) and [ops](operations.md#performance); "
        "not blockx/tests/x.py, https://example.org/docs/y.md or bench/<name>.py"
    )
    rooted = [m.group(0) for m in _ROOTED.finditer(line)]
    markdown = [m.group(0) for m in _MARKDOWN.finditer(line)]
    assert rooted == ["docs/protocol.md", "tests/wire/test_messages.py"]
    assert markdown == ["docs/protocol.md", "PROTOCOL.md", "../PERFORMANCE.md", "operations.md"]
    citing = ROOT / "docs" / "protocol.md"
    assert _exists_markdown("operations.md", citing)
    assert not _exists_markdown("PROTOCOL.md", citing)
    assert not _exists_markdown("../PERFORMANCE.md", citing)


def test_every_cited_file_exists() -> None:
    missing = missing_references()
    assert not missing, "cited files that are not in the repository:\n" + "\n".join(missing)


def test_every_allow_listed_name_still_occurs() -> None:
    names = {name for _path, _number, name, _exists in _references()}
    assert set(NOT_FILE_REFERENCES) <= names, set(NOT_FILE_REFERENCES) - names
