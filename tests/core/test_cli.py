"""The `loader` command: JSON output, and one-line errors with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "loader._cli.main", *args], capture_output=True, text=True,
                          env=full_env, timeout=120)


def test_plugins_json_lists_core_plugins() -> None:
    result = run_cli("plugins", "--json")
    assert result.returncode == 0, result.stderr
    records = {r["name"]: r for r in json.loads(result.stdout)}
    assert records["core.sources"]["status"] == "loaded"
    assert records["core.sources"]["hooks"] == ["loader_resolve_source"]


def test_plugins_table_is_printed() -> None:
    result = run_cli("plugins")
    assert result.returncode == 0
    assert result.stdout.splitlines()[0].split() == ["name", "distribution", "version", "status", "hooks"]


def test_allow_list_blocks_plugins_in_the_table() -> None:
    result = run_cli("plugins", "--json", env={"LOADER_PLUGINS": ""})
    records = json.loads(result.stdout)
    assert all(r["status"] == "blocked" for r in records if not r["name"].startswith("core."))


@pytest.mark.parametrize("command", ["inspect", "load"])
def test_missing_source_is_one_line_exit_2(command: str, tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    result = run_cli(command, str(missing))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("error: ")
    assert str(missing) in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_option_is_one_line_exit_2() -> None:
    result = run_cli("load", "x", "--dtype")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("error: argument --dtype: expected one argument")


def test_unsupported_dtype_is_one_line(tmp_path: Path) -> None:
    result = run_cli("load", str(tmp_path), "--dtype", "int3")
    assert result.returncode == 2
    assert result.stderr == "error: dtype 'int3' is not supported; use one of float32, float16, bfloat16\n"


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    result = run_cli("--debug", "inspect", str(tmp_path / "nope"))
    assert result.returncode != 0
    assert "Traceback" in result.stderr
