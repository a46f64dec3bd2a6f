"""The probe child: ``python -m loader._registry probe ARCH=package.module:Class ...``.

Imports each class, reads its :class:`~loader._registry.ModelInfo`
and prints one JSON object on stdout::

    {"infos": {"Arch": {...}}, "errors": {"OtherArch": "ImportError: ..."},
     "packages": {"Arch": ["loader", "loader_plugin_llama"]}}

``packages`` lists the top-level packages of every class in each class's MRO,
so the parent's cache entry is invalidated when a base class's package changes.

A class that fails to import is reported under ``errors`` and the others are
still answered. Whatever the model modules print while importing (Python or C
level) is sent to stderr, so stdout carries only the JSON. The parent starts
this with CUDA hidden; nothing here initialises a device.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from .capabilities import inspect_model_class
from .entry import import_class
from .fingerprint import mro_packages

__all__ = ["main", "probe_classes"]

USAGE = "usage: python -m loader._registry probe ARCH=package.module:Class [...]"


def probe_classes(specs: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """Import and inspect each ``(architecture, class_path)``; one failure does not stop the others."""
    infos: dict[str, Any] = {}
    errors: dict[str, str] = {}
    packages: dict[str, list[str]] = {}
    for architecture, class_path in specs:
        try:
            cls = import_class(class_path)
            infos[architecture] = inspect_model_class(architecture, cls).to_json()
            packages[architecture] = mro_packages(cls)
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - reported to the parent by name
            errors[architecture] = f"{type(exc).__name__}: {exc}"
    return {"infos": infos, "errors": errors, "packages": packages}


def _parse(args: Sequence[str]) -> list[tuple[str, str]] | None:
    if not args or args[0] != "probe" or len(args) < 2:
        return None
    specs = []
    for arg in args[1:]:
        architecture, sep, class_path = arg.partition("=")
        if not sep or not architecture or ":" not in class_path:
            return None
        specs.append((architecture, class_path))
    return specs


def main(argv: Sequence[str] | None = None) -> int:
    specs = _parse(sys.argv[1:] if argv is None else argv)
    if specs is None:
        print(USAGE, file=sys.stderr)
        return 2
    sys.stdout.flush()
    result_fd = os.dup(1)
    os.dup2(2, 1)  # stray prints of model modules, Python or C, go to stderr
    try:
        result = probe_classes(specs)
    finally:
        sys.stdout.flush()
        os.dup2(result_fd, 1)
        os.close(result_fd)
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    sys.stdout.flush()
    os.dup2(2, 1)  # and so do prints of their atexit handlers
    return 0


if __name__ == "__main__":
    sys.exit(main())
