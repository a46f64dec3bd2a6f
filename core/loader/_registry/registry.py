"""Architecture name -> lazily imported model class, and what each class can do.

Plugins register through ``loader_register_architectures(register)`` with
``register("Arch", "package.module:Class")``. :class:`ModelRegistry` collects
those, imports a class only when a load needs it (:meth:`ModelRegistry.resolve`), and answers
:meth:`ModelRegistry.model_info` from memory, the disk cache, or one probe
child for everything still unknown, never by importing a model module here.

One registration may be a *fallback* (``register(..., fallback=True)``, the
transformers plugin's): :meth:`ModelRegistry.choose` hands it the
architectures no plugin registers, or every architecture when the load asks
for ``model_impl="transformers"`` (vLLM's ``--model-impl``); native classes
always win otherwise.

A name registered twice (two plugins both claiming ``LlamaForCausalLM``) is a
conflict of that architecture only: loading it, or asking what it can do,
raises a :class:`PluginError` naming both plugins, while every other
architecture stays loadable (refusing the whole registry would let one stray
plugin break every load). ``LOADER_OVERRIDE_ARCHITECTURES=Arch,...`` (or
``*``) lets the later registration win, with a warning, as vLLM lets an
out-of-tree model replace a built-in one.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import attrs

from .._hooks import register_architectures
from .._options import check_model_impl
from .._plugins import current_plugin_host
from .._settings import OVERRIDE_ARCHITECTURES
from ..errors import PluginError, UnknownArchitectureError
from .entry import RegisteredModel, check_class_path

if TYPE_CHECKING:
    from .._plugins import PluginHost
    from .cache import ProbeCache
    from .capabilities import ModelInfo
    from .probe import ProbeOutcome

__all__ = ["OVERRIDE_ENV", "ModelChoice", "ModelRegistry", "get_registry", "model_info", "override_setting"]

OVERRIDE_ENV = OVERRIDE_ARCHITECTURES.name
log = logging.getLogger(__name__)


def override_setting(environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """Architectures whose later registration replaces an earlier one: ``LOADER_OVERRIDE_ARCHITECTURES``.

    Comma-separated names, or ``*`` for every architecture; unset or empty overrides nothing.
    """
    return OVERRIDE_ARCHITECTURES.read(environ)


@attrs.frozen
class ModelChoice:
    """The registration that serves a checkpoint, chosen without importing anything.

    ``architecture`` is the config's architecture being served;
    ``fallback_reason`` says why the fallback serves it (``None`` for a native class).
    """

    architecture: str
    entry: RegisteredModel
    fallback_reason: str | None = None

    @property
    def model_impl(self) -> str:
        """``"transformers"`` when the fallback serves the checkpoint, else ``"native"``."""
        return "transformers" if self.entry.fallback else "native"


@attrs.define
class ModelRegistry:
    """Registered architectures of one plugin host, their classes once loaded, their probed info."""

    _cache: ProbeCache | None = attrs.field(default=None, alias="cache")
    overrides: frozenset[str] = attrs.field(factory=override_setting)
    _conflicts: dict[str, tuple[RegisteredModel, ...]] = attrs.field(factory=dict, init=False)
    _entries: dict[str, RegisteredModel] = attrs.field(factory=dict, init=False)
    _fallback: RegisteredModel | None = attrs.field(default=None, init=False)
    _fallback_distribution: str | None = attrs.field(default=None, init=False)
    _classes: dict[str, type] = attrs.field(factory=dict, init=False)
    _infos: dict[str, ModelInfo] = attrs.field(factory=dict, init=False)
    _lock: threading.RLock = attrs.field(factory=threading.RLock, init=False, repr=False)

    @property
    def cache(self) -> ProbeCache:
        """The disk cache of probed info, made on first use: a load never reads probed info, so it never
        imports the cache or ``platformdirs``."""
        from .cache import ProbeCache

        with self._lock:
            if self._cache is None:
                self._cache = ProbeCache()
            return self._cache

    @classmethod
    def from_host(cls, host: PluginHost | None = None, *, cache: ProbeCache | None = None) -> ModelRegistry:
        """Ask every plugin of ``host`` (default: the process-wide host) to register its architectures."""
        host = host if host is not None else current_plugin_host()
        registry = cls() if cache is None else cls(cache=cache, overrides=override_setting())
        register_architectures(registry.callback_for, host)
        if registry._fallback is not None:  # its probed info is cached under its requirements' versions too
            record = host.records.get(registry._fallback.plugin)
            registry._fallback_distribution = record.distribution if record is not None else None
        return registry

    # --- registration -----------------------------------------------------------------

    def callback_for(self, plugin: str) -> Callable[..., None]:
        """The ``register`` callback handed to ``plugin``'s hook implementation."""

        def register(architecture: str, class_path: str, *, fallback: bool = False) -> None:
            self.register(architecture, class_path, plugin=plugin, fallback=fallback)

        return register

    def register(self, architecture: str, class_path: str, *, plugin: str,
                 fallback: bool = False) -> RegisteredModel:
        """Add one architecture; a second fallback is a :class:`PluginError`.

        A name already taken becomes a conflict of that architecture (see
        :meth:`conflict_error`), unless the override setting names it: then
        the registration already made wins, with a warning. Registrations
        arrive in pluggy's order (the plugin registered last is asked first,
        as for every hook), so the winner is the plugin installed or
        registered later, or the one marked ``tryfirst``.
        """
        if not isinstance(architecture, str) or not architecture.strip():
            raise PluginError(
                f"plugin {plugin!r} registered architecture {architecture!r}; expected a non-empty name "
                "such as 'LlamaForCausalLM'"
            )
        check_class_path(class_path, architecture=architecture, plugin=plugin)
        if not isinstance(fallback, bool):
            raise PluginError(f"plugin {plugin!r} registered {architecture!r} with fallback={fallback!r}; "
                              "expected True or False")
        entry = RegisteredModel(architecture=architecture, plugin=plugin, class_path=class_path, fallback=fallback)
        with self._lock:
            taken = self._entries.get(architecture)
            if taken is not None and (architecture in self.overrides or "*" in self.overrides):
                # pluggy asks the plugin registered last first, so the one already here is the later plugin
                log.warning(
                    "architecture %r: plugin %r (%s) overrides plugin %r (%s) because %s names it",
                    architecture, taken.plugin, taken.class_path, plugin, class_path, OVERRIDE_ENV,
                )
                return taken
            if taken is not None:
                self._conflicts[architecture] = (*self._conflicts.get(architecture, (taken,)), entry)
                return entry
            if fallback and self._fallback is not None:
                raise PluginError(
                    f"two fallbacks are registered: {self._fallback.architecture!r} by plugin "
                    f"{self._fallback.plugin!r} and {architecture!r} by plugin {plugin!r}; install one"
                )
            self._entries[architecture] = entry
            if fallback:
                self._fallback = entry
        return entry

    # --- lookup -----------------------------------------------------------------------

    def architectures(self) -> list[str]:
        """Registered architecture names, sorted (those in conflict too)."""
        return sorted(self._entries)

    def entries(self) -> list[RegisteredModel]:
        """Registrations, sorted by architecture (an architecture in conflict: its first registration)."""
        return [self._entries[name] for name in self.architectures()]

    def conflicts(self) -> dict[str, PluginError]:
        """Each architecture registered more than once (and not overridden), with the error it loads with."""
        return {name: self.conflict_error(name) for name in sorted(self._conflicts)}

    def conflicting_plugins(self, architecture: str) -> tuple[str, ...]:
        """The plugins that registered ``architecture`` (empty unless it is in conflict)."""
        return tuple(entry.plugin for entry in self._conflicts.get(architecture, ()))

    def conflict_error(self, architecture: str) -> PluginError:
        """Why ``architecture`` cannot be used: every plugin that registered it, and the way out."""
        claims = " and ".join(f"plugin {e.plugin!r} ({e.class_path})" for e in self._conflicts[architecture])
        return PluginError(
            f"architecture {architecture!r} is registered by {claims}; disable one "
            f"(LOADER_DISABLE_PLUGINS) or set {OVERRIDE_ENV}={architecture} to let the later one win"
        )

    def entry(self, architecture: str) -> RegisteredModel:
        """The registration of ``architecture``; :class:`UnknownArchitectureError` if there is none.

        An architecture in conflict raises its :meth:`conflict_error`.
        """
        if architecture in self._conflicts:
            raise self.conflict_error(architecture)
        try:
            return self._entries[architecture]
        except KeyError:
            raise UnknownArchitectureError(
                f"architecture {architecture!r} is not registered by any installed plugin; "
                f"known: {self._known()}"
            ) from None

    @property
    def fallback(self) -> RegisteredModel | None:
        """The fallback registration, if a plugin made one."""
        return self._fallback

    def _known(self) -> str:
        native = [name for name in self.architectures() if not self._entries[name].fallback]
        return ", ".join(native) or "none (is a model plugin installed?)"

    def load_class(self, architecture: str) -> type:
        """Import and return the class (once); import failures are :class:`PluginError`."""
        entry = self.entry(architecture)
        with self._lock:
            cls = self._classes.get(architecture)
            if cls is None:
                cls = self._classes[architecture] = entry.load_class()
        return cls

    def choose(self, architectures: Sequence[str], model_impl: str = "auto", *, origin: str = "config.json",
               host: PluginHost | None = None) -> ModelChoice:
        """Which registration serves a config's ``architectures``; nothing is imported.

        ``model_impl`` is ``"auto"`` (the first natively registered
        architecture, else the fallback), ``"native"`` (never the fallback) or
        ``"transformers"`` (always the fallback). ``origin`` says where the
        names came from in messages (a GGUF file's metadata, not
        ``config.json``); ``host`` lets a miss name the plugin distribution to
        install, or say that it is installed but disabled.
        """
        model_impl = check_model_impl(model_impl)
        if isinstance(architectures, str):
            architectures = [architectures]
        if not architectures:
            raise UnknownArchitectureError(
                f"{origin} lists no architectures; expected one of: {self._known()}"
            )
        fallback = self._fallback
        if model_impl == "transformers":
            if fallback is None:
                raise UnknownArchitectureError(
                    f"model_impl='transformers' asked for {architectures[0]!r}, but no installed plugin registers "
                    "a fallback; loader-plugin-transformers provides it: pip install loader-plugin-transformers"
                )
            return ModelChoice(architectures[0], fallback, "model_impl='transformers' was asked for")
        native = [name for name in architectures if name in self._entries and not self._entries[name].fallback]
        if native:
            return ModelChoice(native[0], self._entries[native[0]])
        if fallback is not None and model_impl == "auto":
            return ModelChoice(architectures[0], fallback,
                               f"no installed plugin registers {', '.join(architectures)} natively")
        ruled_out = " (model_impl='native' rules out the fallback)" if fallback is not None else ""
        from .._known_plugins import missing_plugin_hint  # a miss only: a load that finds its class never reads it

        hint = "" if ruled_out else missing_plugin_hint("architecture", architectures[0], host)
        raise UnknownArchitectureError(
            f"{origin} architectures {list(architectures)!r}: none is registered by an installed plugin"
            f"{ruled_out}; known: {self._known()}{hint}"
        )

    def resolve(self, architectures: Sequence[str], model_impl: str = "auto", *, origin: str = "config.json",
                host: PluginHost | None = None) -> tuple[str, type]:
        """The architecture :meth:`choose` picks, with the class that serves it imported."""
        choice = self.choose(architectures, model_impl, origin=origin, host=host)
        return choice.architecture, self.load_class(choice.entry.architecture)

    # --- capabilities -----------------------------------------------------------------

    def model_info(self, architecture: str) -> ModelInfo:
        """What ``architecture``'s class can do, without importing it in this process."""
        return self.model_infos([architecture])[architecture]

    def model_infos(self, architectures: Iterable[str] | None = None) -> dict[str, ModelInfo]:
        """Info of each architecture (default: all), probing every missing one in one child.

        Raises the first :class:`PluginError` if any could not be probed (the
        others are still cached); :meth:`model_infos_or_errors` returns them all.
        """
        infos: dict[str, ModelInfo] = {}
        for name, outcome in self.model_infos_or_errors(architectures).items():
            if isinstance(outcome, PluginError):
                raise outcome
            infos[name] = outcome
        return infos

    def model_infos_or_errors(self, architectures: Iterable[str] | None = None) -> dict[str, ProbeOutcome]:
        """Like :meth:`model_infos`, but a failed probe is returned as its error (for listings).

        The probe, cache and fingerprint modules are imported here, not with the registry: a load
        chooses and imports its class without them (each module imported stays resident).
        """
        from .capabilities import ModelInfo
        from .fingerprint import source_fingerprint
        from .probe import probe_in_child, wants_in_process_probe

        names = self.architectures() if architectures is None else list(architectures)
        outcomes: dict[str, ProbeOutcome] = {n: self.conflict_error(n) for n in names if n in self._conflicts}
        entries = [self.entry(name) for name in names if name not in outcomes]
        pending: list[RegisteredModel] = []
        in_process = wants_in_process_probe()
        with self._lock:
            for entry in entries:
                known = self._infos.get(entry.architecture)
                if known is not None:
                    outcomes[entry.architecture] = known
                elif in_process or entry.architecture in self._classes or entry.is_imported():
                    outcomes[entry.architecture] = self._probe_here(entry)
                else:
                    pending.append(entry)
            fingerprints: dict[str, str | None] = {}

            def fingerprint_of(package: str) -> str | None:  # each package's files walked once per call
                if package not in fingerprints:
                    fingerprints[package] = source_fingerprint(package)
                return fingerprints[package]

            to_probe = self._read_cache(pending, outcomes, fingerprint_of)
            if to_probe:
                packages: dict[str, list[str]] = {}
                probed = probe_in_child([entry for entry, _ in to_probe], packages)
                for entry, key in to_probe:
                    outcome = probed[entry.architecture]
                    outcomes[entry.architecture] = outcome
                    if isinstance(outcome, ModelInfo):
                        self._infos[entry.architecture] = outcome
                        if key is not None:
                            self.cache.store(entry, key, outcome, packages.get(entry.architecture, ()),
                                             fingerprint_of)
        return {name: outcomes[name] for name in names}

    def _probe_here(self, entry: RegisteredModel) -> ProbeOutcome:
        from .probe import probe_in_process

        try:
            info = probe_in_process(entry)
        except PluginError as exc:
            return exc
        self._infos[entry.architecture] = info
        return info

    def _read_cache(self, entries: list[RegisteredModel], outcomes: dict[str, ProbeOutcome],
                    fingerprint_of: Callable[[str], str | None]) -> list[tuple[RegisteredModel, str | None]]:
        """Fill ``outcomes`` from disk; return the entries still to probe with their cache keys."""
        from .fingerprint import cache_key, requirements_fingerprint

        missing: list[tuple[RegisteredModel, str | None]] = []
        for entry in entries:
            fingerprint = fingerprint_of(entry.top_level_package)
            if entry.fallback and fingerprint is not None:
                # What a fallback covers follows the library it wraps: key on its version too (no key: no cache).
                wrapped = self._fallback_distribution
                versions = requirements_fingerprint(wrapped) if wrapped else None
                fingerprint = None if versions is None else fingerprint + versions
            key = None if fingerprint is None else cache_key(entry, fingerprint)
            cached = None if key is None else self.cache.load(entry, key, fingerprint_of)
            if cached is None:
                missing.append((entry, key))
            else:
                self._infos[entry.architecture] = outcomes[entry.architecture] = cached
        return missing


_registries: dict[int, tuple[weakref.ref[PluginHost], ModelRegistry]] = {}
_registries_lock = threading.Lock()


def get_registry(host: PluginHost | None = None) -> ModelRegistry:
    """The registry of ``host`` (default: the load session's host), built once per host object."""
    if host is None:
        host = current_plugin_host()
    key = id(host)
    with _registries_lock:
        found = _registries.get(key)
        if found is not None and found[0]() is host:
            return found[1]
    registry = ModelRegistry.from_host(host)
    with _registries_lock:
        found = _registries.get(key)
        if found is not None and found[0]() is host:
            return found[1]

        def forget(_ref: weakref.ref[PluginHost]) -> None:
            _registries.pop(key, None)

        _registries[key] = (weakref.ref(host, forget), registry)
    return registry


def model_info(architecture: str) -> ModelInfo:
    """What ``architecture``'s class can do, from the process-wide registry."""
    return get_registry().model_info(architecture)
