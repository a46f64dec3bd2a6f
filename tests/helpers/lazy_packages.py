"""What a lazily re-exporting package tells the type checker: its ``if TYPE_CHECKING:`` imports, read from source."""

from __future__ import annotations

import ast
from pathlib import Path
from types import ModuleType

__all__ = ["typed_homes"]


def typed_homes(package: ModuleType) -> dict[str, str]:
    """Name -> submodule, as the ``if TYPE_CHECKING:`` imports of ``package``'s ``__init__.py`` state it."""
    assert package.__file__ is not None
    tree = ast.parse(Path(package.__file__).read_text(encoding="utf-8"))
    homes: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for stmt in node.body:
                assert isinstance(stmt, ast.ImportFrom) and stmt.level == 1 and stmt.module, ast.unparse(stmt)
                homes.update({alias.name: stmt.module for alias in stmt.names})
    return homes
