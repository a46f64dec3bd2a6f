"""``loader.lazy.lazy_exports``: a package's names imported on first read, from one table, then cached."""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PACKAGE = {
    "__init__.py": """
        from loader.lazy import lazy_exports

        __all__ = ["Heavy", "helper", "json_dumps"]
        eager = 1
        __getattr__, __dir__ = lazy_exports(__name__, globals(), {
            "Heavy": ".heavy",
            "helper": ".heavy",
            "dumps": "json",
        })
        """,
    "heavy.py": """
        IMPORTS = []
        IMPORTS.append(1)

        class Heavy:
            pass

        def helper():
            return "help"
        """,
}


@pytest.fixture
def lazy_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    root = tmp_path / "lazy_fixture_pkg"
    root.mkdir()
    for name, source in PACKAGE.items():
        (root / name).write_text(textwrap.dedent(source), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield importlib.import_module("lazy_fixture_pkg")
    for name in [n for n in sys.modules if n.startswith("lazy_fixture_pkg")]:
        del sys.modules[name]


def test_nothing_is_imported_until_a_name_is_read(lazy_package) -> None:
    assert "lazy_fixture_pkg.heavy" not in sys.modules
    assert lazy_package.helper() == "help"
    heavy = sys.modules["lazy_fixture_pkg.heavy"]
    assert lazy_package.Heavy is heavy.Heavy
    assert heavy.IMPORTS == [1], "imported once for both names"


def test_a_read_value_is_kept_in_the_package(lazy_package) -> None:
    value = lazy_package.Heavy
    assert vars(lazy_package)["Heavy"] is value, "later reads are plain attribute lookups"


def test_an_absolute_module_name_resolves_too(lazy_package) -> None:
    import json

    assert lazy_package.dumps is json.dumps


def test_an_unknown_name_is_an_attribute_error_naming_the_package(lazy_package) -> None:
    with pytest.raises(AttributeError, match=r"^module 'lazy_fixture_pkg' has no attribute 'missing'$"):
        _ = lazy_package.missing
    assert not hasattr(lazy_package, "missing")


def test_dir_lists_the_lazy_names_before_they_are_read(lazy_package) -> None:
    names = dir(lazy_package)
    assert {"Heavy", "helper", "dumps", "eager"} <= set(names)
    assert names == sorted(names)


@pytest.mark.needs_plugins
def test_the_packages_that_use_it_stay_light() -> None:
    """``import loader`` and the lazy plugin packages pull in neither torch nor their lazy submodules."""
    packages = ["loader", "loader.layers", "loader_plugin_bnb", "loader_plugin_marlin", "loader_plugin_runai",
                "loader_plugin_llama"]
    code = ("import importlib, sys\n"
            f"for name in {packages!r}: importlib.import_module(name)\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.endswith(('.config', '.linear', '.model'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_loader_version_is_read_on_first_use() -> None:
    code = ("import sys, loader\n"
            "before = 'loader._version' in sys.modules\n"
            "version = loader.__version__\n"
            "print(before, 'loader._version' in sys.modules, version is None or isinstance(version, str))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "True", "True"]
