"""Boot the plugin manager: specs, entry points, allow/deny lists.

One sequence builds a :class:`PluginHost`: a ``pluggy.PluginManager`` for
project ``"loader"`` with the hook specs, the core's own implementations, then
every entry point of group ``loader.plugins``. Each entry point is loaded in
its own ``try`` so one broken plugin is recorded (name, distribution,
version, error) and the others still work. ``LOADER_PLUGINS`` (comma-separated
allow-list) and ``LOADER_DISABLE_PLUGINS`` (deny-list) choose which load.

Every plugin is registered through :meth:`PluginHost.register`, which hands
pluggy a guarded view of it (:mod:`loader._plugin_guard`): pluggy calls the
hooks, and a plugin's bug is still reported under the plugin's name.
"""

from __future__ import annotations

import importlib.metadata
import os
import threading
from collections.abc import Iterator, Mapping
from collections.abc import Set as AbstractSet
from contextlib import contextmanager
from typing import Literal

import attrs
import pluggy

from . import hookspecs
from ._plugin_guard import GuardedPlugin
from ._session import active_session, current_session, load_session
from ._settings import DISABLE_PLUGINS, PLUGINS
from .errors import SettingError

__all__ = [
    "ENTRY_POINT_GROUP",
    "PluginHost",
    "PluginRecord",
    "create_plugin_host",
    "get_plugin_host",
    "use_plugin_host",
]

ENTRY_POINT_GROUP = "loader.plugins"
CORE_PLUGINS = (
    ("core.sources", "loader._sources.builtin"),
    ("core.hf_files", "loader._hf_files"),
    ("core.postprocess", "loader._pipeline.postprocess"),
    ("core.dummy", "loader._formats.dummy"),
    ("core.sharded_state", "loader._formats.sharded_state"),
    ("core.hub_headers", "loader._formats.hub_headers"),
)

Status = Literal["loaded", "failed", "blocked"]


@attrs.frozen
class PluginRecord:
    """One plugin as ``loader plugins`` reports it."""

    name: str
    distribution: str | None
    version: str | None
    status: Status
    hooks: tuple[str, ...] = ()
    error: str | None = None

    def to_json(self) -> dict[str, object]:
        return attrs.asdict(self)


@attrs.define
class PluginHost:
    """A plugin manager plus our own table of what was loaded, failed or blocked."""

    pm: pluggy.PluginManager
    records: dict[str, PluginRecord] = attrs.field(factory=dict)

    def register(self, plugin: object, name: str, *, distribution: str | None = None,
                 version: str | None = None) -> None:
        """Register a plugin (an entry point's module, or an in-process one in tests) under ``name``.

        pluggy gets a :class:`~loader._plugin_guard.GuardedPlugin`: the plugin's
        hook implementations wrapped so that a failure names the plugin. pluggy
        refuses the same object twice only by identity, which the view hides,
        so that check is made here.
        """
        if any(isinstance(view, GuardedPlugin) and view.plugin is plugin for view in self.pm.get_plugins()):
            raise ValueError(f"plugin {plugin!r} is already registered under another name than {name!r}")
        view = GuardedPlugin(plugin, name, self.pm)
        self.pm.register(view, name=name)
        self.records[name] = PluginRecord(
            name=name, distribution=distribution, version=version, status="loaded",
            hooks=_hooks_of(self.pm, view),
        )

    def get_plugin(self, name: str) -> object | None:
        """The plugin object registered under ``name`` (not pluggy's guarded view of it), or ``None``."""
        view = self.pm.get_plugin(name)
        return view.plugin if isinstance(view, GuardedPlugin) else view

    def unregister(self, name: str) -> None:
        self.pm.unregister(name=name)
        self.records.pop(name, None)

    def plugin_records(self) -> list[PluginRecord]:
        return sorted(self.records.values(), key=lambda r: r.name)


def _hooks_of(pm: pluggy.PluginManager, plugin: object) -> tuple[str, ...]:
    callers = pm.get_hookcallers(plugin) or []
    return tuple(sorted(c.name for c in callers))


def create_plugin_host(*, load_entry_points: bool = True,
                       environ: Mapping[str, str] | None = None) -> PluginHost:
    """Build a fresh host: specs, core implementations, then installed plugins."""
    env = os.environ if environ is None else environ
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    host = PluginHost(pm=pm)
    version = _core_version()
    for name, module_name in CORE_PLUGINS:
        module = importlib.import_module(module_name)
        host.register(module, name, distribution="loader-core", version=version)

    if load_entry_points:
        _load_entry_points(host, allow=PLUGINS.read(env), deny=DISABLE_PLUGINS.read(env))
    pm.check_pending()
    return host


def _core_version() -> str | None:
    try:
        return importlib.metadata.version("loader-core")
    except importlib.metadata.PackageNotFoundError:
        return None


def _check_allow_list(allow: AbstractSet[str] | None, installed: set[str]) -> None:
    """A name in ``LOADER_PLUGINS`` that no installed plugin has is a typo or a missing install: say so.

    Left alone, it blocks every plugin but the ones spelled right, and the load then fails far away
    ("no weight files any installed format plugin recognises").
    """
    unknown = sorted((allow or set()) - installed - {name for name, _ in CORE_PLUGINS})
    if unknown:
        raise SettingError(
            PLUGINS.name, ",".join(sorted(allow or ())), "names of installed plugins",
            f"LOADER_PLUGINS names {', '.join(repr(n) for n in unknown)}, which no installed plugin is called; "
            f"installed: {', '.join(sorted(installed)) or 'none'} (set LOADER_PLUGINS to an empty string to "
            "load none)"
        )


def _load_entry_points(host: PluginHost, *, allow: AbstractSet[str] | None, deny: AbstractSet[str]) -> None:
    eps = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    _check_allow_list(allow, {ep.name for ep in eps})
    seen: set[str] = set()
    for ep in sorted(eps, key=lambda e: e.name):
        if ep.name in seen:
            continue
        seen.add(ep.name)
        dist = ep.dist.name if ep.dist is not None else None
        version = ep.dist.version if ep.dist is not None else None
        if ep.name in deny:
            host.records[ep.name] = PluginRecord(ep.name, dist, version, "blocked",
                                                 error=f"LOADER_DISABLE_PLUGINS names {ep.name!r}")
            continue
        if allow is not None and ep.name not in allow:
            host.records[ep.name] = PluginRecord(ep.name, dist, version, "blocked",
                                                 error=f"LOADER_PLUGINS does not name {ep.name!r}")
            continue
        try:
            host.register(ep.load(), ep.name, distribution=dist, version=version)
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not break the others
            host.records[ep.name] = PluginRecord(
                ep.name, dist, version, "failed", error=f"{type(exc).__name__}: {exc}"
            )


_host: PluginHost | None = None
_host_lock = threading.Lock()


def get_plugin_host() -> PluginHost:
    """The process-wide host, built on first use: the host of every load that names none.

    A load's own host is its session's (:func:`current_plugin_host`).
    """
    global _host
    with _host_lock:
        if _host is None:
            _host = create_plugin_host()
        return _host


def current_plugin_host() -> PluginHost:
    """The plugin host of the load in progress (its session's), else the process-wide one.

    Builds no default session, so it imports no torch: ``loader plugins`` and
    ``loader models`` stay light.
    """
    session = active_session()
    if session is not None and session.host is not None:
        return session.host
    return get_plugin_host()


@contextmanager
def use_plugin_host(host: PluginHost) -> Iterator[PluginHost]:
    """Make ``host`` the load session's host for the block (this thread only; tests use fresh ones).

    Nothing process-wide changes: another thread keeps its own session's host.
    """
    with load_session(attrs.evolve(current_session(), host=host)):
        yield host
