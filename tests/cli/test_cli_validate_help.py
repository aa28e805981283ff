"""``blockx validate``, ``--help`` texts, ``blockx config`` and the generated configuration docs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from cli_support import EXAMPLES, REPO, blockx, clean_env, write

from blockx.cli.settings import DOC_BEGIN, DOC_END, generated_part, io_knob_docs, reference_markdown
from blockx.worker.config import iter_knobs
from blockx.worker.io.config import ENV_VARS as IO_ENV_VARS

pytestmark = pytest.mark.timeout(60)


# --- validate --------------------------------------------------------------------------------


@pytest.mark.parametrize("example", ["quickstart", "streaming", "error_handling", "chain_reads"])
def test_every_example_validates(example: str) -> None:
    proc = blockx("validate", EXAMPLES / example / "task.yaml", cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert f"examples/{example}/task.yaml: ok — " in proc.stdout
    assert proc.stderr == ""


def test_validate_counts_a_streamed_calls_file() -> None:
    proc = blockx("validate", EXAMPLES / "streaming" / "task.yaml", cwd=REPO)
    assert "2 function(s) (collatz, digits), 3,000 call(s) streamed from" in proc.stdout
    quiet = blockx("validate", "-q", EXAMPLES / "streaming" / "task.yaml", cwd=REPO)
    assert quiet.returncode == 0 and quiet.stdout == ""


def test_validate_fails_on_a_syntax_error_with_file_and_line(tmp_path: Path) -> None:
    write(tmp_path / "functions" / "ok.py", "def _(x):\n    return x\n")
    write(tmp_path / "functions" / "bad.py", "def _(x):\n    y = [1, 2\n    return y\n")
    task = write(
        tmp_path / "task.yaml",
        (
            "functions:\n"
            "  ok: {path: functions/ok.py}\n"
            "  bad: {path: functions/bad.py}\n"
            "  inline:\n"
            "    source: |\n"
            "      def _(x):\n"
            "          return x +\n"
            "calls: [{function: ok, args: 1}]\n"
        ),
    )
    proc = blockx("validate", task, cwd=tmp_path)
    assert proc.returncode == 2
    err = proc.stderr
    assert (
        "blockx: error: functions/bad.py:2:9: SyntaxError: '[' was never closed (function 'bad')"
        in err
    )
    assert "y = [1, 2" in err
    # an inline `|` block: the line of the task file
    assert "blockx: error: task.yaml:7:" in err and "(function 'inline')" in err
    assert proc.stdout == ""


def test_validate_fails_without_an_entry_function(tmp_path: Path) -> None:
    write(tmp_path / "helpers.py", "X = 1\n\ndef _private():\n    return X\n")
    task = write(
        tmp_path / "task.yaml", "functions: {h: {path: helpers.py}}\ncalls: [{function: h}]\n"
    )
    proc = blockx("validate", task, cwd=tmp_path)
    assert proc.returncode == 2
    assert "helpers.py: <" not in proc.stderr
    assert "defines no entry function" in proc.stderr and "(function 'h')" in proc.stderr


def test_validate_reports_spec_errors_like_run(tmp_path: Path) -> None:
    task = write(
        tmp_path / "task.yaml",
        "functions: {f: {source: 'def _(): pass'}}\ncalls: [{function: g}]\n",
    )
    proc = blockx("validate", task, cwd=tmp_path)
    assert proc.returncode == 2
    assert (
        "task.yaml: calls[0].function: 'g' is not a function of this task (functions: f)"
        in proc.stderr
    )


def test_validate_warns_about_a_subcall_to_an_unknown_function(tmp_path: Path) -> None:
    write(tmp_path / "caller.py", "def _(x):\n    return function.call('pricer', x)\n")
    task = write(
        tmp_path / "task.yaml",
        "functions: {caller: {path: caller.py}}\ncalls: [{function: caller, args: 1}]\n",
    )
    proc = blockx("validate", task, cwd=tmp_path)
    assert proc.returncode == 0
    assert (
        "warning: caller.py:2: function.call('pricer') names no function of this task"
        in proc.stderr
    )


# --- help --------------------------------------------------------------------------------------


def test_main_help_lists_the_commands() -> None:
    proc = blockx("--help")
    assert proc.returncode == 0
    for needle in (
        "usage: blockx",
        "run ",
        "validate ",
        "config ",
        "examples:",
        "blockx run examples/quickstart/task.yaml",
    ):
        assert needle in proc.stdout
    version = blockx("--version").stdout
    assert version.startswith("blockx ")
    # ... and says whether the core runs compiled (blockx.native).
    assert "modules compiled (mypyc)" in version or "pure Python (" in version


def test_run_help_is_complete() -> None:
    out = blockx("run", "--help").stdout
    for needle in (
        "usage: blockx run",
        "TASK",
        "-o FILE, --output FILE",
        "--executors N",
        "-n N",
        "--config FILE",
        "--set KNOB=VALUE",
        "-q, --quiet",
        "-v, --verbose",
        "--progress",
        "--errors FILE",
        "--summary-json FILE",
        "JSON Lines",
        "calls_file",
        "exit status:",
        "  0    every call succeeded",
        "  1    the task failed",
        "  2    bad usage",
        "examples:",
    ):
        assert needle in out, needle


def test_validate_and_config_help() -> None:
    out = blockx("validate", "--help").stdout
    for needle in ("usage: blockx validate", "TASK", "entry function", "exits 2", "examples:"):
        assert needle in out, needle
    out = blockx("config", "--help").stdout
    for needle in ("usage: blockx config", "--task TASK", "--json", "--set KNOB=VALUE", "source"):
        assert needle in out, needle


# --- config --------------------------------------------------------------------------------------


def test_config_shows_values_and_their_sources(tmp_path: Path) -> None:
    conf = write(
        tmp_path / "worker.toml",
        ("[dispatcher]\ncall_deadline_ms = 7000\nmax_subcall_depth = 4\n[io.rpc]\ntimeout_s = 3\n"),
    )
    env = clean_env(EXECUTOR_COUNT="3", MAX_SUBCALL_DEPTH="5")
    proc = blockx("config", "--config", conf, "--set", "io.data_dir=/tmp/bx", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    rows = {r["knob"]: r for r in json.loads(proc.stdout)}
    assert rows["pool.executor_count"] == {
        "knob": "pool.executor_count",
        "value": "3",
        "source": "env EXECUTOR_COUNT",
        "env": "EXECUTOR_COUNT",
    }
    assert rows["dispatcher.call_deadline_ms"]["value"] == "7000"
    assert rows["dispatcher.call_deadline_ms"]["source"] == f"file {conf}"
    assert rows["dispatcher.max_subcall_depth"]["value"] == "5"  # the environment beats the file
    assert rows["io.rpc.timeout_s"]["source"] == f"file {conf}"
    assert rows["io.data_dir"] == {
        "knob": "io.data_dir",
        "value": "/tmp/bx",
        "source": "--set",
        "env": "BLOCKX_DATA_DIR",
    }
    assert rows["dispatcher.stall_timeout_ms"]["value"] == "12000"
    assert rows["dispatcher.stall_timeout_ms"]["source"] == "derived"
    assert rows["pool.spawn_mode"]["source"] == "default"


def test_the_cli_starts_one_executor_per_core_unless_told() -> None:
    # The worker's own default is the seed's 8; `blockx run` / `config` use the cores.
    rows = {r["knob"]: r for r in json.loads(blockx("config", "--json", env=clean_env()).stdout)}
    assert rows["pool.executor_count"]["value"] == str(os.cpu_count() or 1)
    assert rows["pool.executor_count"]["source"] == "default (one per core)"
    told = blockx("config", "--json", "--set", "pool.executor_count=8", env=clean_env()).stdout
    rows = {r["knob"]: r for r in json.loads(told)}
    assert rows["pool.executor_count"]["value"] == "8"
    assert rows["pool.executor_count"]["source"] == "--set"


def test_config_applies_a_tasks_io_section() -> None:
    proc = blockx("config", "--task", EXAMPLES / "quickstart" / "task.yaml", "-n", "2", cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("io.blockdb.sqlite_path"))
    assert "examples/quickstart/../.data/quickstart.sqlite3" in line
    assert line.rstrip().endswith("task " + str(EXAMPLES / "quickstart" / "task.yaml"))
    assert any(
        ln.startswith("pool.executor_count") and ln.rstrip().endswith("--executors")
        for ln in proc.stdout.splitlines()
    )


def test_config_reports_every_bad_value_with_its_source(tmp_path: Path) -> None:
    conf = write(tmp_path / "worker.toml", "[pool]\nexecutor_count = 0\n")
    proc = blockx("config", "--config", conf, env=clean_env(CALL_DEADLINE_MS="abc"))
    assert proc.returncode == 2
    assert f"{conf}: pool.executor_count=0: expected a positive integer" in proc.stderr
    assert "CALL_DEADLINE_MS='abc': expected a non-negative integer" in proc.stderr


# --- the configuration reference ------------------------------------------------------------------


def test_configuration_docs_list_every_knob_and_are_in_sync() -> None:
    path = REPO / "docs" / "configuration.md"
    assert generated_part(str(path)) == reference_markdown(), (
        "docs/configuration.md is out of date: run "
        "`.venv/bin/python -m blockx.cli.settings --update-docs docs/configuration.md`"
    )
    text = path.read_text()
    assert DOC_BEGIN in text and DOC_END in text
    for section, name, f in iter_knobs():
        assert f"`{section}.{name}`" in text
        assert f"`{f.metadata['env']}`" in text
    docs = io_knob_docs()
    for (section, name), variable in IO_ENV_VARS.items():
        knob = "io." + (f"{section}.{name}" if section else name)
        assert knob in docs and docs[knob][0] == variable and docs[knob][2], knob
        assert f"`{knob}`" in text and f"`{variable}`" in text


def test_help_lists_every_exit_status_the_command_returns() -> None:
    """The help's table is made from the constants the command returns, and lists each."""
    from blockx.cli.exit_codes import (
        EXIT_FAILED,
        EXIT_OK,
        EXIT_SIGPIPE,
        EXIT_STATUS_HELP,
        EXIT_USAGE,
        INTERRUPTED_STATUS,
    )

    out = blockx("run", "--help").stdout
    assert EXIT_STATUS_HELP.splitlines()[1] in out
    statuses = {EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_SIGPIPE, *INTERRUPTED_STATUS.values()}
    for status in statuses:
        assert f" {status} " in EXIT_STATUS_HELP, status
    assert statuses == {0, 1, 2, 130, 141, 143}
