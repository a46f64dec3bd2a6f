"""The docs cover the plugin surface: every hook, public API name, CLI command and flag (scripts/docgen/coverage.py)
and ``LOADER_*`` environment variable (scripts/docgen/settings_reference.py).

The committed docs are checked against the real hookspecs, ``__all__`` lists
and parser; then each kind of gap is made on purpose — a synthetic hook, API
name, CLI flag and command — to show the check would catch it, with the line
a maintainer would read.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import types
from pathlib import Path

import pytest

from loader import hookspecs
from loader._public_api import PUBLIC_MODULES, public_names
from loader.settings import FLAG, Setting
from scripts.docgen.cli_reference import render_cli
from scripts.docgen.coverage import (
    documented_members,
    missing_api,
    missing_cli,
    missing_from_docs,
    missing_from_site,
    missing_hooks,
)
from scripts.docgen.hook_reference import hook_specs, render_hooks
from scripts.docgen.settings_reference import (
    missing_settings,
    source_files,
    undeclared_variables,
    with_settings_table,
)
from scripts.gen_docs import declared_settings, docs_parser

REPO = Path(__file__).resolve().parents[2]


def _page(name: str) -> str:
    return (REPO / "docs" / name).read_text(encoding="utf-8")


def _public() -> dict[str, frozenset[str]]:
    return {m: public_names(m) for m in PUBLIC_MODULES}


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[command]


def _hookspecs_with_extra_hook() -> types.ModuleType:
    """The real hookspecs module's namespace plus one synthetic hook, declared the way the real ones are."""
    patched = types.ModuleType("hookspecs_with_extra_hook")
    patched.__dict__.update(vars(hookspecs))

    def loader_frobnicate_weights(weights: object) -> None:
        """A hook nobody documented."""

    patched.loader_frobnicate_weights = hookspecs.hookspec(loader_frobnicate_weights)
    return patched


def test_the_committed_docs_cover_everything() -> None:
    assert missing_from_docs(REPO, hookspecs, docs_parser(), _public()) == []


def test_the_generated_pages_are_current() -> None:
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "gen_docs.py"), "--check"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_check_sees_every_hook_every_public_module_and_every_command() -> None:
    """Guards against a check that passes because it looks at nothing."""
    assert len(hook_specs(hookspecs)) >= 8
    assert all(documented_members((REPO / "docs" / "reference" / f"{m}.md").read_text(), m) for m in PUBLIC_MODULES)
    names = [a.option_strings for a in _subparser(docs_parser(), "load")._actions]
    assert ["--load-format", "--format"] in names and ["--tensor-parallel-size", "-tp"] in names


def test_a_synthetic_hook_missing_from_the_docs_fails() -> None:
    patched = _hookspecs_with_extra_hook()
    assert missing_hooks(_page("hooks.md"), patched) == [
        "docs/hooks.md: hook loader_frobnicate_weights is not documented (run python scripts/gen_docs.py)"]
    # and regenerating the page documents it
    assert missing_hooks(render_hooks(patched), patched) == []


def test_a_synthetic_public_api_name_missing_from_the_docs_fails() -> None:
    public = _public()
    public["loader.weights"] = public["loader.weights"] | {"frobnicate_tensor"}
    assert missing_api(REPO, public) == [
        "docs/reference/loader.weights.md: public name loader.weights.frobnicate_tensor is not documented "
        "(add it to members:)"]


def test_a_documented_name_that_is_not_public_fails() -> None:
    public = _public()
    public["loader.io"] = public["loader.io"] - {"pread_exactly"}
    assert missing_api(REPO, public) == [
        "docs/reference/loader.io.md: loader.io.pread_exactly is listed but is not in loader.io.__all__"]


def test_a_public_module_without_a_reference_page_fails(tmp_path: Path) -> None:
    assert missing_api(tmp_path, {"loader.frobnicate": {"x"}}) == [
        "docs/reference/loader.frobnicate.md: public module loader.frobnicate has no '::: loader.frobnicate' block"]


def test_a_synthetic_cli_flag_missing_from_the_docs_fails() -> None:
    parser = docs_parser()
    _subparser(parser, "load").add_argument("--frobnicate-weights", "-F", action="store_true", help="synthetic")
    assert missing_cli(_page("cli.md"), parser) == [
        "docs/cli.md: flag --frobnicate-weights of 'loader load' is not documented",
        "docs/cli.md: flag -F of 'loader load' is not documented",
    ]


def test_a_synthetic_global_flag_and_command_missing_from_the_docs_fail() -> None:
    parser = docs_parser()
    parser.add_argument("--frobnicate", action="store_true", help="synthetic")
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    sub.add_parser("frobnicate", help="synthetic")
    assert missing_cli(_page("cli.md"), parser) == [
        "docs/cli.md: flag --frobnicate of 'loader' is not documented",
        "docs/cli.md: command 'loader frobnicate' has no section",
    ]


def test_a_flag_documented_only_under_another_command_still_fails() -> None:
    """`--prompt` is documented for generate; adding it to load must not pass on generate's section."""
    parser = docs_parser()
    _subparser(parser, "load").add_argument("--prompt")
    assert missing_cli(_page("cli.md"), parser) == ["docs/cli.md: flag --prompt of 'loader load' is not documented"]


def test_a_command_the_cli_template_does_not_place_is_refused() -> None:
    parser = docs_parser()
    next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).add_parser("frobnicate")
    template = (REPO / "docs" / "_templates" / "cli.md").read_text(encoding="utf-8")
    with pytest.raises(ValueError, match=r"command 'frobnicate' has no \{\{ options: frobnicate \}\} line"):
        render_cli(parser, template)


def test_the_cli_page_lists_each_flag_with_its_choices_and_default() -> None:
    load = _page("cli.md").split("## `loader load`")[1].split("\n## ")[0]
    assert "| `--dtype DTYPE` | `auto` | `auto`, `bfloat16`, `float16`, `float32` |" in load
    assert "| `--load-format FORMAT`, `--format` | `auto` |" in load


def test_a_public_name_the_built_site_did_not_render_fails(tmp_path: Path) -> None:
    """``make docs`` runs this over the real site after ``mkdocs build``; here over a two-page stand-in."""
    (tmp_path / "reference" / "loader.io").mkdir(parents=True)
    (tmp_path / "reference" / "loader.io" / "index.html").write_text('<h2 id="loader.io.io_pool">io_pool</h2>')
    (tmp_path / "reference" / "loader").mkdir()
    (tmp_path / "reference" / "loader" / "index.html").write_text('<h2 id="loader.hookimpl">hookimpl</h2>')
    public = {"loader": frozenset({"hookimpl", "errors"}), "loader.errors": frozenset(),
              "loader.io": frozenset({"io_pool", "io_threads"})}
    assert missing_from_site(tmp_path, public) == [
        f"{tmp_path}/reference/loader.io/index.html: public name loader.io.io_threads was not rendered"]


# --- environment variables: the user guide's table is rendered from the declared settings ---------------------


def _user_guide() -> str:
    return _page("user-guide.md")


def test_the_user_guide_documents_every_declared_variable_and_no_internal_one() -> None:
    users, internal, _ = declared_settings()
    assert {"LOADER_READ_THREADS", "LOADER_GGUF_PACKED_CACHE"} <= {s.name for s in users}  # core's and a plugin's
    assert missing_settings(_user_guide(), users, internal) == []
    assert "LOADER_TP_LAUNCHED" not in _user_guide()


def test_a_declared_variable_missing_from_the_table_fails_and_regenerating_adds_it() -> None:
    users, internal, _ = declared_settings()
    extra = Setting("LOADER_FROBNICATE", FLAG, default=False, doc="`1`: frobnicate the weights")
    assert missing_settings(_user_guide(), [*users, extra], internal) == [
        "docs/user-guide.md: environment variable LOADER_FROBNICATE is not documented (run python scripts/gen_docs.py)"]
    regenerated = with_settings_table(_user_guide(), [*users, extra])
    assert missing_settings(regenerated, [*users, extra], internal) == []
    assert ("| `LOADER_FROBNICATE` | a yes/no value (1, true, yes, on / 0, false, no, off) | 0 | "
            "`1`: frobnicate the weights |") in regenerated


def test_an_internal_variable_in_the_users_table_fails() -> None:
    users, internal, _ = declared_settings()
    shown = with_settings_table(_user_guide(), [*users, *internal])
    assert missing_settings(shown, users, internal) == [
        "docs/user-guide.md: LOADER_TP_LAUNCHED is internal (loader sets it for itself) but is in the users' table"]


def test_a_variable_the_code_reads_without_declaring_it_fails(tmp_path: Path) -> None:
    (tmp_path / "core" / "loader").mkdir(parents=True)
    (tmp_path / "core" / "loader" / "knob.py").write_text('import os\n\nX = os.environ.get("LOADER_SECRET_KNOB")\n')
    (tmp_path / "plugins" / "toy" / "src" / "toy").mkdir(parents=True)
    (tmp_path / "plugins" / "toy" / "src" / "toy" / "plugin.py").write_text('"""``LOADER_TOY_MODE=fast``."""\n')
    assert undeclared_variables(tmp_path, ["LOADER_TOY_MODE"], {}) == [
        "core/loader/knob.py:3: LOADER_SECRET_KNOB is not declared as a setting (loader._settings, or the plugin's "
        "own settings module listed in scripts/gen_docs.py)"]


def test_every_variable_the_code_mentions_is_declared() -> None:
    users, internal, not_variables = declared_settings()
    assert undeclared_variables(REPO, [s.name for s in users + internal], not_variables) == []
    assert len(source_files(REPO)) > 100  # it looked at the core and the plugins
