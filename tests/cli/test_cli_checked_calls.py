"""``blockx run`` reads a small calls file once: its check keeps the calls it decoded
(``TaskFile.scan_calls_file(keep=True)``, up to ``KEEP_CHECKED_BYTES``) and the run streams
those; a larger file, or a scan that does not keep (``blockx validate``, the remote client),
leaves the run to read the file again, as before."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import blockx.cli.taskfile as taskfile
from blockx.cli.taskfile import TaskFile, load_task_file


def _task(tmp_path: Path, lines: list[str]) -> TaskFile:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "calls.jsonl").write_text("".join(lines), encoding="utf-8")
    (tmp_path / "task.yaml").write_text(
        json.dumps(
            {
                "functions": {
                    "f": {"source": "def _(x):\n    return x\n"},
                    "g": {"source": "def _(x):\n    return x\n"},
                },
                "calls_file": "calls.jsonl",
            }
        ),
        encoding="utf-8",
    )
    return load_task_file(str(tmp_path / "task.yaml"))


def _lines(count: int) -> list[str]:
    return [
        json.dumps({"function": "fg"[i % 2], "args": {"x": i, "s": "é" * (i % 3)}}) + "\n"
        for i in range(count)
    ]


def _streamed(spec: TaskFile) -> list[tuple[str, Any]]:
    return [call for batch in spec.iter_call_batches() for call in batch.pairs]


def test_a_run_streams_the_calls_its_check_decoded_without_reading_the_file_again(
    tmp_path: Path,
) -> None:
    reference = _streamed(_task(tmp_path / "ref", _lines(3000)))
    spec = _task(tmp_path / "run", _lines(3000))
    assert spec.scan_calls_file(keep=True) == 3000
    assert spec.checked.chunks is not None and len(spec.checked.chunks) > 1  # several chunks
    (tmp_path / "run" / "calls.jsonl").unlink()  # a second read would fail
    assert _streamed(spec) == reference
    assert spec.checked.chunks is None  # taken: let go as the run streamed it


def test_the_calls_iter_calls_file_streams_are_the_kept_ones_too(tmp_path: Path) -> None:
    spec = _task(tmp_path, _lines(50))
    spec.scan_calls_file(keep=True)
    (tmp_path / "calls.jsonl").write_text("not json\n", encoding="utf-8")
    calls = [(call.function_id, call.args) for call in spec.iter_calls_file()]
    assert calls == [(fid, args) for fid, args in _reference_calls(_lines(50))]


def _reference_calls(lines: list[str]) -> list[tuple[str, Any]]:
    return [(v["function"], v["args"]) for v in map(json.loads, lines) if v]


def test_lines_checked_one_by_one_are_kept_as_well(tmp_path: Path) -> None:
    # A blank line sends its chunk down the line-by-line path; its calls are kept the same.
    lines = _lines(20)
    lines[7] = "\n"
    spec = _task(tmp_path, lines)
    assert spec.scan_calls_file(keep=True) == 19
    (tmp_path / "calls.jsonl").unlink()
    assert _streamed(spec) == _reference_calls([line for line in lines if line.strip()])


def test_a_file_larger_than_the_bound_is_read_again_by_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(taskfile, "KEEP_CHECKED_BYTES", 1000)
    spec = _task(tmp_path, _lines(200))
    assert spec.scan_calls_file(keep=True) == 200
    assert spec.checked.chunks is None
    changed = _lines(5)
    (tmp_path / "calls.jsonl").write_text("".join(changed), encoding="utf-8")
    assert _streamed(spec) == _reference_calls(changed)  # read afresh


def test_a_scan_that_does_not_keep_leaves_the_run_to_read_the_file(tmp_path: Path) -> None:
    spec = _task(tmp_path, _lines(10))
    assert spec.scan_calls_file() == 10  # blockx validate, the remote client
    assert spec.checked.chunks is None
    changed = _lines(3)
    (tmp_path / "calls.jsonl").write_text("".join(changed), encoding="utf-8")
    assert _streamed(spec) == _reference_calls(changed)


def test_kept_calls_are_streamed_once_then_the_file_is_read(tmp_path: Path) -> None:
    spec = _task(tmp_path, _lines(10))
    spec.scan_calls_file(keep=True)
    first = _streamed(spec)
    assert first == _reference_calls(_lines(10))
    changed = _lines(4)
    (tmp_path / "calls.jsonl").write_text("".join(changed), encoding="utf-8")
    assert _streamed(spec) == _reference_calls(changed)


def test_a_bad_line_keeps_nothing(tmp_path: Path) -> None:
    lines = _lines(10)
    lines[4] = '{"function": "nope"}\n'
    spec = _task(tmp_path, lines)
    with pytest.raises(taskfile.SpecError, match="line 5"):
        spec.scan_calls_file(keep=True)
    assert spec.checked.chunks is None
