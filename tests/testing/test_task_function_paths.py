"""``Task(functions={"f": "functions/f.py"})``: a path is read at construction; source stays."""

from __future__ import annotations

import pathlib

import pytest

from blockx.serve.documents import task_from_spec
from blockx.worker.api import Call, Task, TaskSpecError
from blockx.worker.app import run_task_sync
from blockx.worker.config import load_config

SOURCE = "def _(p):\n    return {'y': p['x'] + 1}\n"


def test_a_path_is_replaced_by_the_files_source(tmp_path, monkeypatch):
    (tmp_path / "functions").mkdir()
    (tmp_path / "functions" / "f.py").write_text(SOURCE)
    monkeypatch.chdir(tmp_path)

    by_str = Task(functions={"f": "functions/f.py", "g": SOURCE}, calls=[])
    by_path = Task(functions={"f": pathlib.Path("functions/f.py")}, calls=[])
    absolute = Task(functions={"f": str(tmp_path / "functions" / "f.py")}, calls=[])

    assert by_str.functions == {"f": SOURCE, "g": SOURCE}
    assert by_path.functions == {"f": SOURCE}
    assert absolute.functions == {"f": SOURCE}


def test_source_without_paths_is_left_as_given():
    functions = {"f": SOURCE, "one_liner": "def _(p): return p"}
    assert Task(functions=functions, calls=[]).functions is functions


def test_a_missing_file_is_a_clear_task_spec_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        TaskSpecError, match=r"function 'f': no such function file: functions/f\.py"
    ):
        Task(functions={"f": "functions/f.py"}, calls=[])


def test_a_servers_task_never_reads_a_clients_string_as_a_path(tmp_path):
    secret = tmp_path / "settings.py"
    secret.write_text("def _():\n    return 'server secret'\n")
    spec = f'{{"functions": {{"f": "{secret}"}}, "task_id": "t"}}'.encode()
    task = task_from_spec(spec, [])
    assert task.functions == {"f": str(secret)}  # source text (that does not compile)
    assert Task(functions={"f": str(secret)}, calls=[], function_paths=False).functions == {
        "f": str(secret)
    }


@pytest.mark.slow
def test_a_task_of_path_functions_runs(tmp_path):
    (tmp_path / "add_one.py").write_text(SOURCE)
    task = Task(
        functions={"add_one": str(tmp_path / "add_one.py")},
        calls=[Call("add_one", {"x": i}) for i in range(3)],
    )
    config = load_config(env={}).replace(**{"pool.executor_count": 1})
    result = run_task_sync(task, config)
    assert result.outputs == [{"y": 1}, {"y": 2}, {"y": 3}]
