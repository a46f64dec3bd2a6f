"""Compile a small C source on first use and cache the library per machine (shared by the compiled helpers).

The library is built with the system C compiler (``$CC``, else ``cc``: one
program name) into ``$LOADER_CACHE_DIR/native`` (else the user cache folder
for ``loader``), named by the source's stem and a hash of the source,
compiler, flags and machine. It is written to a temporary name and moved into
place, so processes compiling at once all end with a whole file; a cached file
that no longer loads is built again once. Callers keep a pure-Python or torch
path that computes the same result for when no compiler is found.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

from ._cache_root import cache_root

__all__ = ["FLAGS", "build_library", "compiler", "library_path", "load_library"]

FLAGS = ("-O3", "-std=c99", "-shared", "-fPIC")
_COMPILE_TIMEOUT_S = 120


def compiler() -> str | None:
    """The C compiler on ``PATH`` (``$CC``, else ``cc``), or ``None``."""
    name = os.environ.get("CC") or "cc"
    return shutil.which(name)


def library_path(compiler: str, source_name: str, source: bytes) -> Path:
    """Where the library built from ``source`` (a file named ``source_name``) by ``compiler`` is cached."""
    key = hashlib.sha256()
    for piece in (source, compiler.encode(), " ".join(FLAGS).encode(), platform.machine().encode(),
                  platform.system().encode()):
        key.update(piece)
        key.update(b"\0")
    return cache_root() / "native" / f"{Path(source_name).stem}-{key.hexdigest()[:20]}.so"


def build_library(compiler: str, source: bytes, target: Path, defines: tuple[str, ...] = (),
                  source_name: str = "source.c") -> None:
    """Compile ``source`` into ``target`` through a temporary file in the same folder, then move it into place.

    ``defines`` (``-D`` names) are for the tests: ``LOADER_REPACK_SCALAR`` builds the portable loops a
    compiler without SSE2 gets, so both are checked against torch on any x86 machine.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as scratch:
        c_file = Path(scratch) / source_name
        c_file.write_bytes(source)
        built = Path(scratch) / target.name
        command = [compiler, *FLAGS, *(f"-D{name}" for name in defines), "-o", str(built), str(c_file)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=_COMPILE_TIMEOUT_S, check=False)
        if done.returncode != 0 or not built.is_file():
            raise OSError(f"{compiler} exited with {done.returncode}: {done.stderr.strip()[-500:]}")
        os.replace(built, target)


def load_library(compiler: str, source_file: Path) -> ctypes.CDLL:
    """The cached library built from ``source_file``, compiled first when missing or damaged.

    :raises OSError: or :class:`subprocess.SubprocessError` when it can be neither built nor loaded.
    """
    source = source_file.read_bytes()
    path = library_path(compiler, source_file.name, source)
    if not path.is_file():
        build_library(compiler, source, path, source_name=source_file.name)
    try:
        return ctypes.CDLL(str(path))
    except OSError:  # a cached file damaged since it was written (it is replaced, never written in place)
        build_library(compiler, source, path, source_name=source_file.name)
        return ctypes.CDLL(str(path))
