"""No import cycle between the core's packages, lazy (function-level) imports included.

Each subpackage of ``loader`` (``pipeline``, ``sharded``, ``layers``, ...) and
each top-level module is one node; every ``import`` anywhere in a file is an
edge. A strongly connected set of nodes holding two packages is a cycle
between packages (``save-sharded`` once made ``sharded`` and ``pipeline``
import each other). Cycles among top-level modules alone (the plugin host and
the session) are not packages and are allowed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import loader
from tests.helpers.import_graph import strongly_connected

ROOT = Path(loader.__file__).parent


def _node(module: str) -> str:
    """``loader._pipeline.load`` -> ``loader._pipeline``; ``loader._hooks`` -> ``loader._hooks``."""
    parts = module.split(".")
    return ".".join(parts[:2])


def _imports(path: Path) -> set[str]:
    relative = path.relative_to(ROOT.parent).with_suffix("")
    module = ".".join(relative.parts).removesuffix(".__init__")
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)  # ``from .. import hooks``
    return {name for name in found if name == "loader" or name.startswith("loader.")}


def _graph() -> dict[str, set[str]]:
    modules = {".".join(p.relative_to(ROOT.parent).with_suffix("").parts).removesuffix(".__init__")
               for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.py"):
        relative = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts).removesuffix(".__init__")
        source = _node(relative)
        for target in _imports(path):
            if target in modules and _node(target) not in (source, "loader"):
                graph.setdefault(source, set()).add(_node(target))
    return graph


def _packages(component: set[str]) -> set[str]:
    return {node for node in component if node.count(".") == 1 and (ROOT / node.split(".")[1]).is_dir()}


def test_no_import_cycle_between_core_packages() -> None:
    cycles = [sorted(c) for c in strongly_connected(_graph()) if len(_packages(c)) > 1]
    assert cycles == []


def test_the_check_sees_a_cycle() -> None:
    """The check itself: two packages importing each other through a module form one component."""
    graph = {"loader._sharded": {"loader._pipeline"}, "loader._pipeline": {"loader._hooks"},
             "loader._hooks": {"loader._sharded"}}
    assert [sorted(c) for c in strongly_connected(graph) if len(_packages(c)) > 1] == [
        ["loader._hooks", "loader._pipeline", "loader._sharded"]]


def test_sharded_and_pipeline_do_not_import_each_other() -> None:
    graph = _graph()
    assert not ("loader._pipeline" in graph.get("loader._sharded", set())
                and "loader._sharded" in graph.get("loader._pipeline", set()))
    assert "loader._sharded" not in graph.get("loader._pipeline", set())
