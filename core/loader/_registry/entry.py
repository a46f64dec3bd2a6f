"""One registration: architecture name, the plugin that made it, the lazy class path.

The class path is the ``"package.module:Class"`` string a plugin passes to
``register``; it is checked when registered (so a typo names its plugin at
boot) but imported only when :meth:`RegisteredModel.load_class` is called.
"""

from __future__ import annotations

import importlib
import re
import sys
from typing import Any

import attrs

from ..errors import PluginError

__all__ = ["RegisteredModel", "check_class_path", "import_class"]

_DOTTED = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
_CLASS_PATH = re.compile(rf"^({_DOTTED}):({_DOTTED})$")


def check_class_path(class_path: object, *, architecture: str, plugin: str) -> str:
    """Return ``class_path`` if it has the ``"package.module:Class"`` shape, else raise naming the plugin."""
    if not isinstance(class_path, str) or not _CLASS_PATH.match(class_path):
        raise PluginError(
            f"plugin {plugin!r} registered architecture {architecture!r} with class path {class_path!r}; "
            "expected a string 'package.module:ClassName'"
        )
    return class_path


@attrs.frozen
class RegisteredModel:
    """An architecture as one plugin registered it; the class itself is not imported here.

    ``fallback`` marks the one class the registry hands architectures no plugin
    registers (and loads asked for with ``model_impl="transformers"``).
    """

    architecture: str
    plugin: str
    class_path: str
    fallback: bool = False

    @property
    def module_name(self) -> str:
        """``package.module`` of the class path."""
        return self.class_path.partition(":")[0]

    @property
    def class_name(self) -> str:
        """The (possibly dotted) attribute path of the class inside its module."""
        return self.class_path.partition(":")[2]

    @property
    def top_level_package(self) -> str:
        """The distribution's import package, whose sources key the probe cache."""
        return self.module_name.partition(".")[0]

    def is_imported(self) -> bool:
        """Whether the model module is already in ``sys.modules`` (so probing needs no child)."""
        return self.module_name in sys.modules

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self)

    def load_class(self) -> type:
        """Import the module and return the class; failures become :class:`PluginError`."""
        try:
            return import_class(self.class_path)
        except Exception as exc:
            raise PluginError(
                f"plugin {self.plugin!r}: cannot load {self.class_path} for architecture "
                f"{self.architecture!r}: {type(exc).__name__}: {exc}"
            ) from exc


def import_class(class_path: str) -> type:
    """Import ``"package.module:Class"``; raises what the import raised, or ``TypeError`` for a non-class."""
    module_name, _, class_name = class_path.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in class_name.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise AttributeError(f"module {module_name!r} has no attribute {class_name!r}") from None
    if not isinstance(obj, type):
        raise TypeError(f"{class_path} is a {type(obj).__name__}, not a class")
    return obj
