"""Ask ggml's own ``gguf_init_from_file`` for its verdict on GGUF files: the reference, run for real.

    python -m tests.helpers.ggml_verdict LIBGGML_BASE PATH:WITH_DATA [PATH:WITH_DATA ...]

prints one ``PATH OK`` or ``PATH NULL`` line per file (a context, or null), as
``tests/test-gguf.cpp`` asks: ``WITH_DATA`` 1 passes a ``ggml_context`` pointer, so the data
section is read too (the ``DATA_*`` kinds), 0 reads the header only. ``LIBGGML_BASE`` is a
``libggml-base.so`` built from ggml's sources (``cmake -B build -DGGML_CPU=OFF
-DBUILD_SHARED_LIBS=ON && make -C build ggml-base``). It runs in a child process because an
older ggml aborts on some of these files instead of returning null.
"""

from __future__ import annotations

import ctypes
import sys

__all__ = ["main"]


class _InitParams(ctypes.Structure):
    """``struct gguf_init_params``: ``bool no_alloc; struct ggml_context ** ctx;``."""

    _fields_ = [("no_alloc", ctypes.c_bool), ("ctx", ctypes.POINTER(ctypes.c_void_p))]


def main(argv: list[str]) -> int:
    """Print ggml's verdict on each ``PATH:WITH_DATA`` of ``argv[1:]``, loading ``argv[0]``."""
    lib = ctypes.CDLL(argv[0])
    lib.gguf_init_from_file.restype = ctypes.c_void_p
    lib.gguf_init_from_file.argtypes = [ctypes.c_char_p, _InitParams]
    for arg in argv[1:]:
        path, with_data = arg.rsplit(":", 1)
        context = ctypes.c_void_p()
        params = _InitParams(False, ctypes.pointer(context) if with_data == "1" else None)
        found = lib.gguf_init_from_file(path.encode(), params)
        print(path, "OK" if found else "NULL", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
