"""Plugins keep to the declared API (``loader._public_api``), and the docs list it.

Every in-tree plugin's source (the plugin template too), the out-of-tree
fixture plugin, the example plugins of ``docs/examples`` and the Python blocks
of ``docs/*.md`` and the plugins' READMEs are scanned: an import of (or an attribute reaching)
any ``loader`` module or name outside the public modules' ``__all__`` fails,
naming the file, the line and the internal name.
"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from loader._public_api import PUBLIC_MODULES, PrivateImport, plugin_public_names, private_imports, public_names

REPO = Path(__file__).resolve().parents[2]
PLUGIN_SOURCES = sorted(
    [*REPO.glob("plugins/*/src/**/*.py"), *REPO.glob("tests/fixtures/loader-plugin-*/src/**/*.py"),
     *REPO.glob("docs/examples/*/src/**/*.py")]
)
DOCS = [*sorted(REPO.glob("docs/*.md")), REPO / "README.md", *sorted(REPO.glob("plugins/*/README.md")),
        *sorted(REPO.glob("docs/examples/*/README.md"))]
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.M | re.S)


def _doc_blocks(path: Path) -> list[tuple[int, str]]:
    """Each Python block (its first line's offset, its code); a bare signature (docs/hooks.md) gets a body."""
    text = path.read_text(encoding="utf-8")
    blocks = []
    for m in PYTHON_BLOCK.finditer(text):
        code = m.group(1)
        if code.lstrip().startswith("def ") and code.rstrip().endswith(("None", ")", "]")):
            code = code.rstrip() + ": ...\n"
        blocks.append((text.count("\n", 0, m.start(1)), code))
    return blocks


def test_the_scan_covers_every_plugin_and_the_fixture() -> None:
    packages = {p.parts[p.parts.index("src") + 1] for p in PLUGIN_SOURCES}
    assert {"loader_plugin_safetensors", "loader_plugin_gguf", "loader_plugin_bnb", "loader_plugin_llama",
            "loader_plugin_mistral", "loader_plugin_qwen", "loader_plugin_runai", "loader_plugin_toymodel",
            "loader_plugin_template", "loader_plugin_scaled_llama"} <= packages


@pytest.mark.needs_plugins
@pytest.mark.parametrize("path", PLUGIN_SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_plugins_import_only_the_public_api(path: Path) -> None:
    found = private_imports(path.read_text(encoding="utf-8"), str(path.relative_to(REPO)))
    assert not found, "\n".join(map(str, found))


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_doc_examples_import_only_the_public_api(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for source in sorted(REPO.glob("plugins/*/src")):  # a plugin's public names, installed here or not (tox -e core)
        monkeypatch.syspath_prepend(str(source))
    plugin_public_names.cache_clear()  # it may have cached "not installed" for a plugin found only now
    found: list[PrivateImport] = []
    try:
        for first_line, block in _doc_blocks(path):
            for hit in private_imports(block, str(path.relative_to(REPO))):
                found.append(PrivateImport(hit.file, first_line + hit.line, hit.name))
    finally:
        plugin_public_names.cache_clear()
    assert not found, "\n".join(map(str, found))


def test_a_plugin_importing_an_internal_is_reported(tmp_path: Path) -> None:
    plugin = tmp_path / "loader_plugin_sneaky" / "plugin.py"
    plugin.parent.mkdir()
    plugin.write_text(textwrap.dedent("""\
        import loader
        from loader.hookspecs import hookimpl
        from loader._pipeline.prepare import filter_weight_files
        from loader.weights import CheckpointTensor, _not_there
        from loader.layers.linear import RowParallelLinear
        import loader._registry as registry

        def late():
            return loader._hooks.iter_weights, loader.checkpoint.Source
        """))
    found = private_imports(plugin.read_text(), str(plugin))
    assert [str(p) for p in found] == [
        f"{plugin}:3: imports loader._pipeline.prepare, which is not in loader's public API",
        f"{plugin}:4: imports loader.weights._not_there, which is not in loader's public API",
        f"{plugin}:5: imports loader.layers.linear, which is not in loader's public API",
        f"{plugin}:6: imports loader._registry, which is not in loader's public API",
        f"{plugin}:9: imports loader._hooks, which is not in loader's public API",
    ]


def test_every_declared_name_exists() -> None:
    for module in PUBLIC_MODULES:
        mod = importlib.import_module(module)
        missing = [name for name in public_names(module) if not hasattr(mod, name)]
        assert not missing, f"{module} declares {missing} in __all__ but does not define them"


def test_internal_modules_are_underscored() -> None:
    """Every top-level module or package of the core is public or starts with an underscore."""
    root = Path(importlib.import_module("loader").__file__ or "").parent
    top = {p.stem for p in root.glob("*.py") if p.stem != "__init__"} | {
        p.parent.name for p in root.glob("*/__init__.py")}
    public = {m.removeprefix("loader.") for m in PUBLIC_MODULES if m != "loader"}
    assert {name for name in top if not name.startswith("_")} == public


@pytest.mark.parametrize("doc", ["plugin-authoring.md", "architecture.md"])
def test_docs_list_the_public_modules(doc: str) -> None:
    text = (REPO / "docs" / doc).read_text(encoding="utf-8")
    missing = [m for m in PUBLIC_MODULES if f"`{m}`" not in text]
    assert not missing, f"docs/{doc} does not list {missing}"


def test_plugin_authoring_lists_every_public_name() -> None:
    text = (REPO / "docs" / "plugin-authoring.md").read_text(encoding="utf-8")
    missing = [f"{m}.{n}" for m in PUBLIC_MODULES for n in sorted(public_names(m))
               if not re.search(rf"`{re.escape(n)}`", text)]
    assert not missing, f"docs/plugin-authoring.md does not list {missing}"


def test_public_modules_import_no_torch() -> None:
    code = (f"import importlib, sys; [importlib.import_module(m) for m in {list(PUBLIC_MODULES)!r}]; "
            "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


# -- one plugin building on another ---------------------------------------------------------------------------


def _plugin_package(root: Path, name: str, files: dict[str, str]) -> Path:
    package = root / name
    package.mkdir(parents=True)
    for file, source in files.items():
        (package / file).write_text(textwrap.dedent(source), encoding="utf-8")
    return package


@pytest.mark.needs_plugins
def test_a_plugin_importing_another_plugins_internals_is_reported(tmp_path: Path) -> None:
    plugin = _plugin_package(tmp_path, "loader_plugin_sneaky", {"__init__.py": "", "model.py": """\
        import loader_plugin_llama
        from loader_plugin_llama import ConfigFields, LlamaForCausalLM
        from loader_plugin_llama.config import LlamaConfig
        from loader_plugin_llama import rope_settings
        import loader_plugin_llama.decoder
        from loader_plugin_llama import _not_declared
        from loader_plugin_sneaky.helpers import own_helper
        from .helpers import other_helper

        def late():
            return loader_plugin_llama.model.LlamaForCausalLM, loader_plugin_llama.LlamaConfig
        """}) / "model.py"
    found = private_imports(plugin.read_text(), str(plugin))
    assert [str(p) for p in found] == [
        f"{plugin}:3: imports loader_plugin_llama.config, which is not in loader_plugin_llama's public API",
        f"{plugin}:4: imports loader_plugin_llama.rope_settings, which is not in loader_plugin_llama's public API",
        f"{plugin}:5: imports loader_plugin_llama.decoder, which is not in loader_plugin_llama's public API",
        f"{plugin}:6: imports loader_plugin_llama._not_declared, which is not in loader_plugin_llama's public API",
        f"{plugin}:11: imports loader_plugin_llama.model, which is not in loader_plugin_llama's public API",
    ]


def test_a_plugin_may_import_its_own_modules() -> None:
    source = "from loader_plugin_llama.config import LlamaConfig\nimport loader_plugin_llama.decoder\n"
    assert private_imports(source, "plugins/llama/src/loader_plugin_llama/model.py") == []
    assert private_imports(source, "anywhere.py", package="loader_plugin_llama") == []
    assert [p.name for p in private_imports(source, "docs/example.md")] == [
        "loader_plugin_llama.config", "loader_plugin_llama.decoder"]


def test_a_plugins_surface_is_read_from_its_init_without_importing_it(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    _plugin_package(tmp_path, "loader_plugin_surface_fixture", {"__init__.py": """\
        __all__ = ["Declared", "helper"]
        raise RuntimeError("importing the package would fail")
        """})
    _plugin_package(tmp_path, "loader_plugin_no_surface_fixture", {"__init__.py": "__all__ = sorted(['Computed'])\n"})
    monkeypatch.syspath_prepend(str(tmp_path))
    assert plugin_public_names("loader_plugin_surface_fixture") == {"Declared", "helper"}
    assert plugin_public_names("loader_plugin_no_surface_fixture") == frozenset(), "only a literal list declares"
    assert plugin_public_names("loader_plugin_not_installed_fixture") == frozenset()
    found = private_imports("from loader_plugin_surface_fixture import Declared, Hidden\n", "user.py")
    assert [str(p) for p in found] == [
        "user.py:1: imports loader_plugin_surface_fixture.Hidden, which is not in "
        "loader_plugin_surface_fixture's public API"]
    assert "loader_plugin_surface_fixture" not in sys.modules


DECLARING_PLUGINS = sorted(p for p in {p.parts[p.parts.index("src") + 1] for p in PLUGIN_SOURCES}
                           if plugin_public_names(p))


@pytest.mark.needs_plugins
@pytest.mark.parametrize("package", DECLARING_PLUGINS)
def test_every_name_a_plugin_declares_exists(package: str) -> None:
    declared = plugin_public_names(package)
    module = importlib.import_module(package)
    assert sorted(declared) == sorted(module.__all__)
    missing = [name for name in declared if not hasattr(module, name)]
    assert not missing, f"{package} declares {missing} in __all__ but does not define them"


@pytest.mark.needs_plugins
def test_the_plugins_that_build_on_llama_use_its_declared_surface() -> None:
    """Mistral, Qwen and the docs' example import Llama's names from the package, and every one is declared."""
    assert "loader_plugin_llama" in DECLARING_PLUGINS
    users = [p for p in PLUGIN_SOURCES if "loader_plugin_llama" not in p.parts and
             "loader_plugin_llama" in p.read_text(encoding="utf-8")]
    assert {p.parts[p.parts.index("src") + 1] for p in users} >= {
        "loader_plugin_mistral", "loader_plugin_qwen", "loader_plugin_scaled_llama"}
    for path in users:
        assert private_imports(path.read_text(encoding="utf-8"), str(path.relative_to(REPO))) == []
