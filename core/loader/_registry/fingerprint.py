"""Cache keys for probed model info: what, if it changed, would change the answer.

A probe result depends on the model class's source (its whole top-level
package, since a model module imports its siblings), on the packages of every
other class in its MRO (a base class from another plugin: :func:`mro_packages`,
recorded by the probe and checked when the cache is read), on the code that reads
the class (``loader._interfaces`` and the probe itself) and on the versions of
Python, torch and loader-core. Sources are fingerprinted by ``(path, size,
mtime_ns, inode, ctime_ns)`` of every ``.py`` file, found with
``importlib.util.find_spec`` on the top-level package, which locates the files
without importing anything: a file rewritten in place with its size and mtime
put back still has a new ctime (the kernel sets it; no caller can), and a file
replaced by a copy has a new inode. Contents are not read (a digest of every
source would cost each ``loader models`` a read of every plugin). Torch's
version is read from its distribution metadata, never by importing torch.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

from .entry import RegisteredModel

__all__ = ["cache_key", "environment_fingerprint", "mro_packages", "package_source_files", "probe_sources",
           "requirements_fingerprint", "source_fingerprint"]

_SKIP_DIRS = {"__pycache__", ".git", ".mypy_cache", ".pytest_cache", ".ruff_cache"}


def _python_files(root: str) -> Iterator[str]:
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
        for name in sorted(files):
            if name.endswith(".py"):
                yield os.path.join(folder, name)


def package_source_files(top_level: str) -> list[str] | None:
    """Every ``.py`` file of a top-level package (or the one file of a module), or ``None`` if not found.

    ``find_spec`` on a top-level name only searches ``sys.path``; it imports nothing.
    """
    try:
        spec = importlib.util.find_spec(top_level)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations is not None:
        files: list[str] = []
        for location in spec.submodule_search_locations:
            files.extend(_python_files(location))
        return files
    if spec.origin and os.path.isfile(spec.origin):
        return [spec.origin]
    return None


def _stat_digest(paths: Iterable[str]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            continue
        digest.update(f"{os.path.abspath(path)}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}\0{st.st_ctime_ns}\n"
                      .encode())
    return digest.hexdigest()


def source_fingerprint(top_level: str) -> str | None:
    """Digest of the package's sources, or ``None`` when the package cannot be located (no caching)."""
    files = package_source_files(top_level)
    return None if files is None else _stat_digest(files)


def _distribution_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def requirements_fingerprint(distribution: str) -> str | None:
    """Digest of the installed versions of what ``distribution`` requires, or ``None`` if it is not installed.

    A fallback's answer (which architectures it covers) follows the library it
    wraps, whose sources are not the plugin's: its version keys the cache too.
    Read from distribution metadata; nothing is imported.
    """
    try:
        requirements = importlib.metadata.requires(distribution) or []
    except importlib.metadata.PackageNotFoundError:
        return None
    names = sorted({re.split(r"[\s;<>=!~\[(]", r, maxsplit=1)[0] for r in requirements if "extra ==" not in r})
    listed = "\n".join(f"{name}=={_distribution_version(name)}" for name in names)
    return hashlib.sha256(listed.encode()).hexdigest()


_VERSION_KEYED = frozenset({"builtins", "torch"})
"""Packages the environment fingerprint already keys by version (walking torch's many files would be slow)."""


def mro_packages(cls: type) -> list[str]:
    """Top-level packages of every class in ``cls``'s MRO whose sources can change its info.

    The standard library and version-keyed packages (torch) are left out.
    """
    names = {klass.__module__.partition(".")[0] for klass in cls.__mro__}
    return sorted(n for n in names if n not in _VERSION_KEYED and n not in sys.stdlib_module_names)


def probe_sources() -> list[Path]:
    """The core's files that compute a model's info: a change to any of them changes every answer."""
    here = Path(__file__).resolve().parent
    return [here / "capabilities.py", here / "__main__.py", here.parent / "_interfaces.py"]


@functools.cache
def environment_fingerprint() -> str:
    """Python, torch and loader-core versions plus the sources that compute the info (once per process)."""
    parts = {
        "python": sys.version,
        "executable": sys.executable,
        "torch": _distribution_version("torch"),
        "loader-core": _distribution_version("loader-core"),
        "probe-sources": _stat_digest(str(p) for p in probe_sources()),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def cache_key(entry: RegisteredModel, sources: str) -> str:
    """The key one architecture's probe result is stored under."""
    parts = [entry.architecture, entry.class_path, sources, environment_fingerprint()]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()
