"""The `loader` command: JSON output, and one-line errors with exit code 2."""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from loader._cli.main import build_parser


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "loader._cli.main", *args], capture_output=True, text=True,
                          env=full_env, timeout=120)


NEEDS_LLAMA = pytest.mark.skipif(
    any(importlib.util.find_spec(name) is None for name in ("loader_plugin_llama", "loader_plugin_safetensors")),
    reason="loads a Llama safetensors checkpoint: needs the llama and safetensors plugins (tox -e core has neither)",
)


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
    assert result.stderr == ("error: argument --dtype: invalid choice: 'int3' (choose from 'auto', 'bfloat16', "
                             "'float16', 'float32') (see 'loader load --help')\n")


def _options(parser: argparse.ArgumentParser, path: str = "loader") -> list[tuple[str, argparse.Action]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.extend(_options(sub, f"{path} {name}"))
        elif not isinstance(action, argparse._HelpAction):
            found.append((f"{path} {action.dest}", action))
    return found


def test_every_option_has_help_and_dtype_has_choices() -> None:
    options = _options(build_parser(plugin_commands=False))  # the core's commands (plugins add their own)
    assert [name for name, action in options if not action.help] == []
    assert {name: action.choices for name, action in options if action.dest == "dtype"} == {
        f"loader {cmd} dtype": ("auto", "bfloat16", "float16", "float32")
        for cmd in ("load", "generate", "save-sharded")
    }


@pytest.mark.parametrize("flag", ["--format", "--load-format"])
def test_load_format_keeps_format_as_an_alias(flag: str) -> None:
    for command in (["load", "x"], ["inspect", "x"], ["generate", "x", "--prompt", "p"], ["save-sharded", "x", "o",
                                                                                           "--tp", "1"]):
        assert build_parser().parse_args([*command, flag, "gguf"]).load_format == "gguf"


@pytest.mark.needs_plugins
@NEEDS_LLAMA
def test_load_defaults_to_the_checkpoints_dtype(tmp_path: Path) -> None:
    from tests.helpers.hf_checkpoints import save_checkpoint

    save_checkpoint("llama", tmp_path / "half", dtype=torch.float16)
    result = run_cli("load", str(tmp_path / "half"), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["dtype"] == "float16"


def test_json_errors_are_json_on_stdout_with_the_exit_code(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    result = run_cli("load", str(missing), "--json")
    assert result.returncode == 2
    assert result.stderr == ""
    assert json.loads(result.stdout) == {"error": f"{missing}: no such file or directory",
                                         "type": "SourceNotFoundError", "exit_code": 2}
    result = run_cli("load", str(missing), "--json", "--dtype", "int3")
    assert result.returncode == 2 and result.stderr == ""
    assert json.loads(result.stdout)["type"] == "UsageError"


def test_help_names_the_uri_schemes_installed_plugins_provide(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    from loader._cli.parser import source_help

    result = run_cli("load", "--help")
    assert result.returncode == 0 and "--load-format" in result.stdout
    installed = {ep.name for ep in importlib.metadata.entry_points(group="loader.plugins")}
    assert ("s3://" in result.stdout) == ("runai" in installed)
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [])
    assert "://" not in source_help()  # no plugin provides a scheme: none is offered


@pytest.mark.needs_plugins
@NEEDS_LLAMA
@pytest.mark.torchrun
def test_tensor_parallel_size_launches_the_workers(tmp_path: Path) -> None:
    from tests.helpers.hf_checkpoints import save_checkpoint

    save_checkpoint("llama", tmp_path / "tiny")
    result = run_cli("load", str(tmp_path / "tiny"), "--tensor-parallel-size", "2", "--dtype", "float32", "--json",
                     env={"OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)  # one object: rank 0 reports, the other rank's stdout is dropped
    assert (report["tp_rank"], report["tp_size"]) == (0, 2)
    assert report["bytes_read"] < 0.75 * report["checkpoint_bytes"]


@pytest.mark.torchrun
def test_tensor_parallel_workers_errors_are_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    result = run_cli("load", str(missing), "--tensor-parallel-size", "2")
    assert result.returncode == 2
    assert result.stderr == f"error: {missing}: no such file or directory\n"


def test_tensor_parallel_size_must_match_torchrun(tmp_path: Path) -> None:
    result = run_cli("load", str(tmp_path), "-tp", "2", env={"WORLD_SIZE": "4"})
    assert result.returncode == 2
    assert result.stderr == ("error: --tensor-parallel-size 2 under torchrun with WORLD_SIZE=4: run the command "
                             "without torchrun to let loader launch the workers, or make the two agree\n")


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    result = run_cli("--debug", "inspect", str(tmp_path / "nope"))
    assert result.returncode != 0
    assert "Traceback" in result.stderr
