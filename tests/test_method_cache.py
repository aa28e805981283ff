"""blockx.method_cache: dataclass methods compiled once per installation.

Every scenario runs real interpreter processes with their own bytecode directory
(``PYTHONPYCACHEPREFIX``), so the file one process writes is the one the next reads.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parents[1] / "src"

#: Run in each process: the file's path, what it loaded and compiled, and how a few of
#: BlockX's own dataclasses behave (created after install, as blockx.cli creates them).
PROBE = r"""
import dataclasses, json, marshal, sys
from blockx import method_cache
method_cache.install()
loaded = set(method_cache._codes)
from blockx.worker.api import Call, TaskPolicy
from blockx.worker.config import load_config

# A user's dataclass (this script's module is __main__): compiled, never written.
@dataclasses.dataclass(frozen=True)
class Mine:
    zq_user_field: int
    b: "list[int]" = dataclasses.field(default_factory=list)

policy = TaskPolicy(call_budget_ms=5)
try:
    policy.call_budget_ms = 6
    frozen = None
except dataclasses.FrozenInstanceError as exc:
    frozen = str(exc)
config = load_config()
behaviour = {
    "repr": [repr(policy), repr(Call("f", [1])), repr(Mine(1)), repr(config.pool)],
    "eq": [policy == TaskPolicy(call_budget_ms=5), Call("f", 1) == Call("f", 2)],
    "hash": hash(Call("f", 1)) == hash(Call("f", 1)),
    "frozen": frozen,
    "annotations": {
        k: repr(v) for k, v in TaskPolicy.__init__.__annotations__.items()
    },
    "mine_annotations": {k: repr(v) for k, v in Mine.__init__.__annotations__.items()},
}
# Every code the process used, loaded from the file or compiled: the code compile()
# gives for its text, as dataclasses' own exec(text) compiles it.
codes = method_cache._codes
same = all(
    c == compile(t, "<string>", "exec", dont_inherit=True)
    for t, c in codes.items() if type(c) is not bytes
)
compiled_blockx = len(method_cache._compiled)
method_cache.save()
print(json.dumps({
    "path": method_cache.cache_path(),
    "loaded": len(loaded),
    "compiled_blockx": compiled_blockx,
    "behaviour": behaviour,
    "same_code": same,
    "mine_written": any("zq_user_field" in t for t in set(codes) - loaded),
}))
"""


def _probe(prefix: Path, **env: str) -> dict[str, Any]:
    environment = {
        key: value
        for key, value in os.environ.items()
        if key not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")
    }
    environment.update(PYTHONPATH=str(SRC), PYTHONPYCACHEPREFIX=str(prefix), **env)
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_the_second_process_loads_what_the_first_compiled_and_behaves_the_same(
    tmp_path: Path,
) -> None:
    first = _probe(tmp_path)
    path = Path(first["path"])
    assert path.is_relative_to(tmp_path) and path.name.endswith(".methods")
    assert first["loaded"] == 0 and first["compiled_blockx"] > 20  # nothing to load yet
    assert path.is_file()
    second = _probe(tmp_path)
    assert second["loaded"] == first["compiled_blockx"]
    assert second["compiled_blockx"] == 0  # every BlockX class's methods came from the file
    assert second["behaviour"] == first["behaviour"]
    assert first["same_code"] and second["same_code"]
    # `from __future__ import annotations` of this module did not leak into the methods:
    # the annotations are the classes' own (objects where the class gave objects).
    assert second["behaviour"]["mine_annotations"]["zq_user_field"] == "<class 'int'>"
    assert "frozen" in second["behaviour"] and second["behaviour"]["frozen"]


def test_a_users_dataclass_is_compiled_but_never_written(tmp_path: Path) -> None:
    first = _probe(tmp_path)
    assert first["mine_written"] is True  # compiled in the process ...
    import marshal

    _magic, entries = marshal.loads(Path(first["path"]).read_bytes())
    assert entries and not any("zq_user_field" in text for text in entries)  # ... not kept


def test_a_damaged_file_is_ignored_and_replaced(tmp_path: Path) -> None:
    first = _probe(tmp_path)
    path = Path(first["path"])
    path.write_bytes(b"\x00not marshal at all")
    second = _probe(tmp_path)
    assert second["loaded"] == 0 and second["behaviour"] == first["behaviour"]
    third = _probe(tmp_path)
    assert third["loaded"] > 0 and third["compiled_blockx"] == 0


def test_nothing_is_written_when_bytecode_is_not(tmp_path: Path) -> None:
    first = _probe(tmp_path, PYTHONDONTWRITEBYTECODE="1")
    assert not Path(first["path"]).exists()


def test_a_file_another_bytecode_wrote_is_ignored(tmp_path: Path) -> None:
    import marshal

    first = _probe(tmp_path)
    path = Path(first["path"])
    magic, entries = marshal.loads(path.read_bytes())
    assert entries  # the entries as the first process wrote them
    path.write_bytes(marshal.dumps((b"\x00\x00\r\n", entries)))  # another magic number
    second = _probe(tmp_path)
    assert second["loaded"] == 0 and second["behaviour"] == first["behaviour"]
    assert marshal.loads(path.read_bytes())[0] == magic  # replaced by this bytecode's
