"""Compile a small C source on first use and cache the library per machine (shared by the compiled helpers).

The library is built with the system C compiler (``$CC``, else ``cc``: one
program name) into ``$LOADER_CACHE_DIR/native`` (else the user cache folder
for ``loader``), named by the source's stem and a hash of the source,
compiler, flags and machine. It is written to a temporary name and moved into
place, so processes compiling at once all end with a whole file; a cached file
that no longer loads, or answers another ABI version than the source's (a
damaged file, another build under this name), is built again once, and the
caller is told why (:attr:`NativeLibrary.rebuilt`). A process killed while
building leaves only its ``.build-*`` scratch folder, which nothing reads.
Callers keep a pure-Python or torch path that computes the same result for
when no compiler is found, or the cache folder cannot be written
(:class:`CacheNotWritten`).
"""

from __future__ import annotations

import _ctypes
import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import attrs

from ._cache_root import cache_root, warn_cache_not_written

__all__ = ["FLAGS", "CacheNotWritten", "NativeLibrary", "build_library", "cache_folder", "compiler",
           "library_or_none", "library_path", "load_library"]

FLAGS = ("-O3", "-std=c99", "-shared", "-fPIC")
_COMPILE_TIMEOUT_S = 120


class CacheNotWritten(OSError):
    """The cache folder (or the build's scratch folder in it) could not be written: no compiler is to blame."""


@attrs.frozen
class NativeLibrary:
    """A library loaded from the cache."""

    library: ctypes.CDLL
    path: Path
    rebuilt: str | None = None
    """Why the cached file was built again (``None``: used as found, or built because there was none)."""


def compiler() -> str | None:
    """The C compiler on ``PATH`` (``$CC``, else ``cc``), or ``None``."""
    name = os.environ.get("CC") or "cc"
    return shutil.which(name)


def cache_folder() -> Path:
    """``<cache root>/native``: where the compiled libraries are kept."""
    return cache_root() / "native"


def library_path(compiler: str, source_name: str, source: bytes) -> Path:
    """Where the library built from ``source`` (a file named ``source_name``) by ``compiler`` is cached."""
    key = hashlib.sha256()
    for piece in (source, compiler.encode(), " ".join(FLAGS).encode(), platform.machine().encode(),
                  platform.system().encode()):
        key.update(piece)
        key.update(b"\0")
    return cache_folder() / f"{Path(source_name).stem}-{key.hexdigest()[:20]}.so"


def build_library(compiler: str, source: bytes, target: Path, defines: tuple[str, ...] = (),
                  source_name: str = "source.c") -> None:
    """Compile ``source`` into ``target`` through a temporary file in the same folder, then move it into place.

    ``defines`` (``-D`` names) are for the tests: ``LOADER_REPACK_SCALAR`` builds the portable loops a
    compiler without SSE2 gets, so both are checked against torch on any x86 machine.

    :raises CacheNotWritten: when the folder, the scratch files or the move fail; ``OSError`` when the
        compiler fails.
    """
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        scratch = tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-")
    except OSError as error:
        raise CacheNotWritten(error.errno, error.strerror, error.filename) from error
    with scratch as folder:
        c_file = Path(folder) / source_name
        built = Path(folder) / target.name
        try:
            c_file.write_bytes(source)
        except OSError as error:
            raise CacheNotWritten(error.errno, error.strerror, error.filename) from error
        command = [compiler, *FLAGS, *(f"-D{name}" for name in defines), "-o", str(built), str(c_file)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=_COMPILE_TIMEOUT_S, check=False)
        if done.returncode != 0 or not built.is_file():
            raise OSError(f"{compiler} exited with {done.returncode}: {done.stderr.strip()[-500:]}")
        try:
            os.replace(built, target)
        except OSError as error:
            raise CacheNotWritten(error.errno, error.strerror, error.filename) from error


def load_library(compiler: str, source_file: Path, abi: tuple[str, int]) -> NativeLibrary:
    """The cached library built from ``source_file``, compiled first when missing, damaged or of another ABI.

    :param abi: the library's version function (no arguments, returns ``int``) and the version the caller needs.
    :raises OSError: or :class:`subprocess.SubprocessError` when it can be neither built nor loaded.
    """
    source = source_file.read_bytes()
    path = library_path(compiler, source_file.name, source)
    if not path.is_file():
        build_library(compiler, source, path, source_name=source_file.name)
        return NativeLibrary(_opened(path, abi), path)
    try:
        return NativeLibrary(_opened(path, abi), path)
    except OSError as error:  # replaced, never written in place: readers that loaded the old file keep it
        build_library(compiler, source, path, source_name=source_file.name)
        return NativeLibrary(_opened(path, abi), path, rebuilt=f"the cached library did not load ({error})")


def library_or_none(source_file: Path, abi: tuple[str, int], log: logging.Logger, fallback: str) -> ctypes.CDLL | None:
    """:func:`load_library` for a helper whose caller has a Python path that computes the same: ``None`` without a
    compiler or when the library can be neither built nor loaded (a cache folder that cannot be written is warned
    about once; any other failure is logged at debug level, after ``fallback``, what runs instead)."""
    found = compiler()
    if found is None:
        return None
    try:
        return load_library(found, source_file, abi).library
    except (OSError, subprocess.SubprocessError) as error:
        if isinstance(error, CacheNotWritten):
            warn_cache_not_written(cache_folder(), error)
        log.debug("%s: %s", fallback, error)
        return None


def _opened(path: Path, abi: tuple[str, int]) -> ctypes.CDLL:
    """``path`` loaded, after checking its ABI version; one of another version is closed again, so that the
    file built in its place under the same name is loaded anew."""
    library = ctypes.CDLL(str(path))
    symbol, wanted = abi
    version = getattr(library, symbol, None)
    found = None if version is None else version()
    if found != wanted:
        _ctypes.dlclose(library._handle)
        raise OSError(f"{path.name} has ABI {found}, not {wanted}")
    return library
