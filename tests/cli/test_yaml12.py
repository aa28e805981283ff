"""Task files are YAML 1.2 core schema (issue #22, item 7): no 1.1 surprises.

``NO``/``yes``/``on`` stay strings, ``010`` is 10, ``1:30`` a string, ``0o17`` and
``0x1f`` ints; line numbers and duplicate-key errors are as before."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from blockx.cli.taskfile import SpecError, load_task_file
from blockx.cli.taskfile_checks import parse_document
from blockx.cli.yaml12 import load


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("NO", "NO"),
        ("no", "no"),
        ("yes", "yes"),
        ("Yes", "Yes"),
        ("on", "on"),
        ("off", "off"),
        ("y", "y"),
        ("010", 10),
        ("-010", -10),
        ("+5", 5),
        ("1:30", "1:30"),
        ("0o17", 15),
        ("0x1f", 31),
        ("0b101", "0b101"),
        ("1_000", "1_000"),
        ("2024-06-01", "2024-06-01"),
        ("true", True),
        ("True", True),
        ("TRUE", True),
        ("false", False),
        ("FALSE", False),
        ("null", None),
        ("Null", None),
        ("~", None),
        ("", None),
        ("1.10", 1.1),
        ("1e3", 1000.0),
        ("-.inf", -math.inf),
        (".Inf", math.inf),
        ('"010"', "010"),
        ("!!str 10", "10"),
        ("!!int '010'", 10),
    ],
)
def test_core_schema_scalars(text: str, expected: object) -> None:
    value = load(f"v: {text}\n")["v"]
    assert value == expected and type(value) is type(expected), (text, value)


def test_nan_and_boolean_keys() -> None:
    data = load("a: .nan\non: 1\nNO: 2\n")
    assert math.isnan(data["a"])
    assert data["on"] == 1 and data["NO"] == 2  # 1.1 made both keys booleans


def _task(tmp_path: Path, text: str) -> Path:
    (tmp_path / "f.py").write_text("def f(x=None):\n    return {'x': x}\n")
    path = tmp_path / "task.yaml"
    path.write_text("functions: {f: {path: f.py}}\n" + text)
    return path


def test_a_task_file_keeps_no_as_a_string(tmp_path: Path) -> None:
    task = load_task_file(
        _task(
            tmp_path,
            "instance: NO\ncalls:\n  - {function: f, args: {country: NO, id: 010, t: 1:30}}\n",
        )
    )
    assert task.instance == "NO"
    assert task.calls == [("f", {"country": "NO", "id": 10, "t": "1:30"})]


def test_line_numbers_and_duplicate_keys_as_before(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as caught:
        load_task_file(_task(tmp_path, "calls: []\npolicy:\n  max_attempts: yes\n"))
    [problem] = caught.value.problems
    assert problem.endswith(
        "task.yaml: policy.max_attempts: expected a positive integer, got 'yes' (line 4)"
    ), problem
    with pytest.raises(SpecError) as caught:
        parse_document("a: 1\nb: 2\na: 3\n", "t.yaml", False)
    assert caught.value.problems == [
        "t.yaml: line 3: duplicate key 'a' (first at line 1; the last one would win)"
    ]
    with pytest.raises(SpecError) as caught:
        parse_document("a: [1,\n", "t.yaml", False)
    assert "line " in caught.value.problems[0] and "not valid YAML" in caught.value.problems[0]


def test_audit_yes_is_refused_not_taken_for_true(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as caught:
        load_task_file(_task(tmp_path, "calls: []\naudit: yes\n"))
    assert any("audit: expected true or false, got 'yes'" in p for p in caught.value.problems)


def test_pyyaml_itself_is_left_as_it_was() -> None:
    """The 1.2 resolvers live on a loader class of their own: other users of PyYAML in the
    same process (a library, a test) still get its 1.1 rules."""
    import yaml

    load("v: 010\n")
    assert yaml.safe_load("a: 010\nb: NO\n") == {"a": 8, "b": False}


LAZY_IMPORT_CHECK = r"""
import re, sys
real_compile = re.compile
from blockx.cli import yaml12
import yaml
assert re.compile is real_compile, "re.compile was not put back"
lazy = yaml.reader.Reader.NON_PRINTABLE
assert type(lazy).__name__ == "_LazyPattern", type(lazy)
assert type(yaml12._NULL) is re.Pattern  # ours: compiled as usual
# PyYAML's own loaders still work on the lazy patterns (compiled at first use).
assert yaml.safe_load("a: yes\nb: 2001-12-14\n") == {"a": True, "b": __import__("datetime").date(2001, 12, 14)}
try:
    yaml.load("a: \x07", Loader=yaml.SafeLoader)  # the Python reader's non-printable check
except yaml.reader.ReaderError as exc:
    assert "special characters are not allowed" in str(exc)
else:
    raise AssertionError("a non-printable character was accepted")
assert yaml12.load("x: yes\ny: 010\n") == {"x": "yes", "y": 10}
print("ok")
"""


def test_pyyaml_is_imported_with_its_patterns_compiled_at_first_use() -> None:
    """yaml12 imports PyYAML with its ~9 module-level patterns left uncompiled until
    used (~8 ms of every blockx run); in a fresh process, as blockx run imports it."""
    done = subprocess.run(
        [sys.executable, "-c", LAZY_IMPORT_CHECK], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
