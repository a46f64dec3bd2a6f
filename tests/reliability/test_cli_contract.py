"""The one-line-error contract beyond ``loader load SOURCE`` (issue 16, item 11).

Commands other than ``load``, environment variables, prompts and chat
templates, unreadable folders: bad input gives the API a
:class:`~loader.errors.LoadError` naming the file, field or variable, and the
CLI exit code 2 with one ``error:`` line and no traceback. Checkpoint-shaped
cases live in :mod:`.test_corpus_contract`.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

import loader
from loader._cli.main import main
from loader.errors import ConfigError, LoadError, SourceNotFoundError, UnsupportedError
from tests.helpers.malformed import TINY_LLAMA, write_config, write_llama_checkpoint
from tests.helpers.tokenizers_files import write_tokenizer
from tests.reliability.test_corpus_cli import _assert_one_line_error


def _cli_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run ``loader ARGV`` in-process: exit code 2, nothing on stdout, one ``error:`` line; return the message."""
    try:
        code = main(list(argv))
    except SystemExit as exit:  # argparse refuses a bad option this way
        code = exit.code
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert out == ""
    return _assert_one_line_error(err)


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama with a tokenizer, written once for the module."""
    folder = tmp_path_factory.mktemp("llama")
    write_llama_checkpoint(folder, shards=1)
    write_tokenizer(folder)
    return folder


@pytest.fixture(scope="module")
def sharded(llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from loader._sharded.save import save_sharded

    out = tmp_path_factory.mktemp("sharded") / "tp1"
    save_sharded(str(llama), out, tp_size=1, dtype="float32")
    return out


def test_inspect_reads_a_sharded_state_folder(sharded: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(sharded), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["format"] == "sharded_state"
    assert info["architecture"] == "LlamaForCausalLM"
    assert info["tensors"] > 0


@contextmanager
def strict_stdio() -> Iterator[tuple[io.TextIOWrapper, io.TextIOWrapper]]:
    """stdout and stderr as a real process has them with a UTF-8 locale, where encoding errors are not tolerated.

    Set inside the test, not in a fixture: pytest's capture puts its own streams back between phases.
    """
    saved = sys.stdout, sys.stderr
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict")
    err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict")
    sys.stdout, sys.stderr = out, err
    try:
        yield out, err
    finally:
        sys.stdout, sys.stderr = saved


def _written(stream: io.TextIOWrapper) -> str:
    stream.flush()
    return stream.buffer.getvalue().decode("utf-8")  # type: ignore[attr-defined, no-any-return]


def test_lone_surrogate_in_an_architecture_name_is_printed_escaped(tmp_path: Path) -> None:
    model = tmp_path / "model"
    write_llama_checkpoint(model, shards=1)
    write_config(model, {**TINY_LLAMA, "architectures": ["Llama\udc80"]})
    with strict_stdio() as (stdout, stderr):
        # --model-impl native: the transformers fallback, when installed, would otherwise take the name
        assert main(["inspect", str(model), "--model-impl", "native"]) == 0
        assert main(["load", str(model), "--model-impl", "native"]) == 2
    out, err = _written(stdout), _written(stderr)
    assert "none installed for Llama\\udc80" in out
    assert _assert_one_line_error(err).startswith("config.json architectures ['Llama\\udc80']")


def test_lone_surrogate_in_a_path_keeps_the_error_on_one_line(tmp_path: Path) -> None:
    model = Path(os.fsdecode(bytes(tmp_path) + b"/m\xff"))  # a file name that is not UTF-8
    write_llama_checkpoint(model, shards=1)
    (model / "config.json").unlink()
    with strict_stdio() as (_, stderr):
        assert main(["load", str(model)]) == 2
    message = _assert_one_line_error(_written(stderr))
    assert "m\\udcff: no config.json" in message


@pytest.mark.parametrize("name", ["x" * 300, "sock"])
def test_a_path_that_cannot_be_opened_is_named(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A name too long for the file system, or a socket: once a PluginError blaming ``core.sources``."""
    path = tmp_path / name
    if name == "sock":
        import socket

        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(str(path))
    with pytest.raises(SourceNotFoundError, match=name[:20]):
        loader.load_model(str(path))
    assert str(path) in _cli_error(capsys, "load", str(path))


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-1"])
def test_save_sharded_refuses_a_part_size_that_is_not_a_positive_number(
        value: str, llama: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    message = _cli_error(capsys, "save-sharded", str(llama), str(tmp_path / "out"), "--tp", "1",
                         "--max-part-gb", value)
    assert "--max-part-gb" in message and repr(value) in message
    assert not (tmp_path / "out").exists()


def test_save_sharded_api_refuses_a_part_size_below_one_byte(llama: Path, tmp_path: Path) -> None:
    from loader._sharded.save import save_sharded

    with pytest.raises(UnsupportedError, match="max_part_bytes must be a positive integer, found 0"):
        save_sharded(str(llama), tmp_path / "out", tp_size=1, max_part_bytes=0)


def test_save_sharded_to_an_unwritable_output_is_one_line(
        llama: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from loader._sharded.save import save_sharded

    (tmp_path / "a-file").write_text("")
    out = tmp_path / "a-file" / "out"
    message = _cli_error(capsys, "save-sharded", str(llama), str(out), "--tp", "1")
    assert message.startswith(f"{out}: cannot create the output folder")
    with pytest.raises(LoadError, match="cannot create the output folder"):
        save_sharded(str(llama), out, tp_size=1)


@pytest.mark.parametrize(("env", "fragment"), [
    ({"WORLD_SIZE": "abc"}, "WORLD_SIZE='abc'"),
    ({"WORLD_SIZE": "2"}, "RANK is not set"),
    ({"WORLD_SIZE": "2", "RANK": "two"}, "RANK='two'"),
    ({"WORLD_SIZE": "2", "RANK": "2"}, "RANK=2"),
    ({"WORLD_SIZE": "2", "RANK": "0"}, "MASTER_ADDR"),
])
def test_torchrun_variables_are_checked_by_name(
        env: dict[str, str], fragment: str, llama: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as info:
        loader.load_model(str(llama))
    assert fragment in str(info.value)
    assert fragment in _cli_error(capsys, "load", str(llama))


def test_device_meta_is_refused_rather_than_reported_loaded(
        llama: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(UnsupportedError, match="'meta'"):
        loader.load_model(str(llama), device="meta")
    assert "'meta'" in _cli_error(capsys, "load", str(llama), "--device", "meta")


def test_an_allow_list_naming_a_missing_plugin_says_so(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from loader import _plugins as plugins
    from loader._plugins import create_plugin_host

    with pytest.raises(ConfigError, match="LOADER_PLUGINS names 'safetensorz'") as info:
        create_plugin_host(environ={"LOADER_PLUGINS": "safetensorz, llama"})
    assert "safetensors" in str(info.value), "the message lists the installed plugins"
    monkeypatch.setattr(plugins, "_host", None)
    monkeypatch.setenv("LOADER_PLUGINS", "safetensorz")
    assert "'safetensorz'" in _cli_error(capsys, "plugins")


def test_generate_refuses_an_empty_prompt(llama: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from loader._generation import generate_greedy, tokenizer_for

    model = loader.load_model(str(llama), dtype="float32")
    with pytest.raises(UnsupportedError, match="--prompt '' encodes to no tokens"):
        generate_greedy(model, tokenizer_for(str(llama)), "")
    assert "encodes to no tokens" in _cli_error(capsys, "generate", str(llama), "--prompt", "")


RECURSIVE = "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"
RUNAWAY = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
TOO_LONG_LOOP = "{% for i in range(100000) %}{{ 'y' * 64 }}{% endfor %}"
TOO_LONG_REPEAT = "{{ 'x' * 10 ** 9 }}"


# Only the runaway case is timed (0.5 s, so the test stays short); the others get a limit they never meet, so a
# busy machine cannot turn "output too long" into "ran too long" (it did once, at load average 14).
@pytest.mark.parametrize(("template", "fragment", "time_limit_s"), [
    (RECURSIVE, "calls nested deeper than 100", 60.0),
    (RUNAWAY, "ran longer than 0.5 s", 0.5),
    (TOO_LONG_LOOP, "output longer than 1000000 characters", 60.0),
    (TOO_LONG_REPEAT, "output longer than 1000000 characters", 60.0),
])
def test_chat_template_limits(template: str, fragment: str, time_limit_s: float,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    from loader import _chat_template as chat_template

    monkeypatch.setattr(chat_template, "TIME_LIMIT_S", time_limit_s)
    tracer = sys.gettrace()
    with pytest.raises(LoadError, match="chat template") as info:
        chat_template.render_chat(template, [{"role": "user", "content": "hi"}])
    assert fragment in str(info.value)
    assert sys.gettrace() is tracer, "the time limit's tracer is removed again"


def test_generate_with_a_recursive_chat_template_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "model"
    write_llama_checkpoint(model, shards=1)
    write_tokenizer(model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": RECURSIVE}))
    message = _cli_error(capsys, "generate", str(model), "--prompt", "w5", "--chat")
    assert "chat template" in message and "deeper than" in message


# Unreadable folders. Tests run as root, which ignores permission bits, so the loads run in a forked child that
# drops to 'nobody' with os.setuid: the real list/stat/open calls then fail as they would for any user. Forked,
# not a fresh interpreter: the modules a load imports are already in memory (the interpreter's own files may
# live where 'nobody' cannot read them) and torch need not be imported again.
def _load_as_nobody(folders: list[str]) -> list[dict[str, object]]:
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        try:
            os.close(read_end)
            if os.geteuid() == 0:
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
            results = []
            for folder in folders:
                try:
                    loader.load_model(folder, dtype="float32")
                    api = ["loaded", ""]
                except Exception as exc:
                    api = [type(exc).__name__ if isinstance(exc, LoadError) else f"bare {type(exc).__name__}",
                           str(exc)]
                err = io.StringIO()
                with redirect_stderr(err), redirect_stdout(io.StringIO()):
                    try:
                        code: object = main(["load", folder])
                    except BaseException as exc:
                        code = repr(exc)
                results.append({"folder": folder, "api": api, "code": code, "stderr": err.getvalue()})
            os.write(write_end, json.dumps(results).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    return json.loads(data)  # type: ignore[no-any-return]


def test_folders_without_read_or_search_permission(capsys: pytest.CaptureFixture[str]) -> None:
    root = Path(tempfile.mkdtemp(prefix="loader-perm-", dir="/tmp"))  # tmp_path's parents are root-only
    cases = {"unlistable": 0o311, "unsearchable": 0o644, "parent-unsearchable/model": 0o600}
    try:
        root.chmod(0o755)
        for name in ("readable", *cases):
            write_llama_checkpoint(root / name, shards=1)
        assert main(["load", str(root / "readable")]) == 0  # every module a load imports, imported as root
        capsys.readouterr()
        for name, mode in cases.items():
            (root / name.split("/")[0]).chmod(mode)
        results = _load_as_nobody([str(root / n) for n in cases])
        assert len(results) == len(cases)
        for result, step in zip(results, ["cannot be listed", "cannot be searched", "parent folder cannot be"],
                                strict=True):
            kind, message = result["api"]  # type: ignore[misc]
            assert kind == "SourceNotFoundError", result
            assert message.startswith(f"{result['folder']}: permission denied ("), result
            assert step in message, result
            assert result["code"] == 2, result
            assert _assert_one_line_error(result["stderr"]) == message  # type: ignore[arg-type]
    finally:
        for name in cases:
            (root / name.split("/")[0]).chmod(0o755)
        shutil.rmtree(root)
