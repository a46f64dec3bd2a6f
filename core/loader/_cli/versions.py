"""``loader --version``: the core's version and every installed plugin's, and why a plugin is off.

The core and each plugin are separate distributions with versions of their own, so a bug report
needs all of them; argparse's ``action="version"`` prints one string and would leave the plugins
out. A plugin that is installed but not in use says why: disabled by ``LOADER_DISABLE_PLUGINS``
(or left out of ``LOADER_PLUGINS``), or failed to import (with the error), as ``loader plugins``
records it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from .._plugins import PluginHost, PluginRecord, _core_version, create_plugin_host
from ..errors import LoadError

__all__ = ["VersionAction", "version_lines"]

_STATUS_WORDS = {"blocked": "disabled", "failed": "failed to import"}


def version_lines(host: PluginHost, core_version: str | None) -> list[str]:
    """``loader-core X`` then one line per plugin entry point: distribution, version, and why it is off."""
    lines = [f"loader-core {core_version or 'unknown (not installed as a distribution)'}"]
    plugins = [r for r in host.plugin_records() if r.distribution != "loader-core"]
    return lines + [_plugin_line(record) for record in plugins]


def _plugin_line(record: PluginRecord) -> str:
    distribution = record.distribution or "(no distribution)"
    line = f"{distribution} {record.version or 'unknown'}"
    if distribution != f"loader-plugin-{record.name}":  # a third-party name: say which plugin it is
        line += f" (plugin {record.name!r})"
    if record.status in _STATUS_WORDS:
        line += f": {_STATUS_WORDS[record.status]} ({record.error})"
    return line


class VersionAction(argparse.Action):
    """``--version``: print :func:`version_lines` for the installed plugins and exit 0 (a bad setting: exit 2)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        kwargs.setdefault("help", "print the versions of loader-core and of every installed plugin (saying "
                                  "which are disabled or failed to import), then exit")
        super().__init__(option_strings, dest=dest, default=argparse.SUPPRESS, nargs=0, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        try:
            host = create_plugin_host()  # loads every entry point: an import failure shows as such
        except LoadError as exc:  # a bad LOADER_PLUGINS / LOADER_DISABLE_PLUGINS (SettingError)
            parser.exit(2, f"error: {' '.join(str(exc).split())}\n")
        sys.stdout.write("\n".join(version_lines(host, _core_version())) + "\n")
        parser.exit()
