"""Compiled byte shuffles for packing 4-bit and 8-bit weights into torch's int4 CPU layout, built once per machine.

Why: packing a GGUF file's Q4_0/Q4_1 blocks and Q8_0 planes is a byte
transpose plus nibble arithmetic; torch runs the transpose as a strided
element-by-element copy and the arithmetic as several passes over memory,
which was a large part of a packed GGUF load. The C in ``native_packing.c``
(beside this module: plain C99, no Python or torch headers, SSE2 where the
compiler targets it) transposes 16 x 16 byte tiles in registers and combines
the nibbles while they are in cache (``benchmarks/RESULTS.md`` has the
numbers).

How: the first load that packs compiles the source with the system C compiler
(``$CC``, else ``cc``: one program name) into
``$LOADER_CACHE_DIR/native`` (else the user cache folder for ``loader``),
named by a hash of the source, compiler, flags and machine, and loads it with
:mod:`ctypes`; later processes load the cached file (:mod:`loader._native_build`:
written to a temporary name and moved into place, so processes compiling at
once all end with a whole file; a cached file that no longer loads, or is of
another ABI version, is built again once, and :attr:`NativeRepack.note` says why).

Fallback: every function here has a torch implementation that writes the same
bytes (:mod:`loader.kernels.int8_cpu`, and the GGUF plugin's half-split
packer for the Q4_0/Q4_1 helpers; the tests compare them byte for byte).
:func:`native_repack` returns ``None`` —
and those run — when ``LOADER_NATIVE_REPACK=0``, when no compiler is found or
it fails, or when the library cannot be loaded; :func:`native_repack_unavailable_reason` says
which, and a failure is logged once as a warning (a cache folder that cannot be
written, through :func:`loader._cache_root.warn_cache_not_written`, the one warning
every cache gives).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import subprocess
import threading
from pathlib import Path

import torch

from .._cache_root import warn_cache_not_written
from .._native_build import CacheNotWritten, build_library, cache_folder, load_library
from .._native_build import compiler as find_compiler
from .._settings import NATIVE_REPACK

__all__ = ["ENV_SWITCH", "SOURCE", "NativeRepack", "build_library", "native_repack",
           "native_repack_unavailable_reason"]

ENV_SWITCH = NATIVE_REPACK.name
"""Set to ``0`` to pack with torch only (the compiled helpers are neither built nor loaded)."""

SOURCE = Path(__file__).with_name("native_packing.c")
_ABI = 4
_BLOCK_NS = (32, 64)
log = logging.getLogger(__name__)

_u8 = ctypes.c_void_p
_i64 = ctypes.c_int64


class NativeRepack:
    """The compiled helpers, each taking torch tensors and checking what the C cannot (dtype, device, sizes)."""

    def __init__(self, library: ctypes.CDLL, path: Path, note: str | None = None) -> None:
        self.path = path
        self.note = note
        """Why the cached library was built again in this process (``None``: it was used as found, or new)."""
        self.simd = bool(library.loader_repack_simd())
        self._half_split = library.loader_int4pack_half_split
        self._half_split.argtypes = [_u8, _u8, _i64, _i64, _i64, _i64, _i64, _u8]
        self._half_split.restype = None
        self._planes = library.loader_int8_planes
        self._planes.argtypes = [_u8, _i64, _i64, _i64, _i64, _i64, _u8]
        self._planes.restype = None
        self._q4_scales = library.loader_q4_scales_bf16
        self._q4_scales.argtypes = [_u8, _u8, _i64, _i64, _i64, _i64, ctypes.c_int, _u8, _i64, _i64]
        self._q4_scales.restype = None
        self._words = library.loader_int4pack_words
        self._words.argtypes = [_u8, _i64, _i64, ctypes.c_int, _u8, _i64, _i64, _i64, _u8]
        self._words.restype = None
        self._q4_k = library.loader_int4pack_q4_k
        self._q4_k.argtypes = [_u8, _u8, _i64, _i64, _i64, _i64, _i64, _u8]
        self._q4_k.restype = None
        self._q4_k_scales = library.loader_q4_k_scales
        self._q4_k_scales.argtypes = [_u8, _u8, _i64, _i64, _i64, _i64, ctypes.c_int, _u8, _i64, _i64]
        self._q4_k_scales.restype = None

    def int4pack_half_split(self, qs: torch.Tensor, block_n: int, out: torch.Tensor,
                            rows: torch.Tensor | None = None) -> None:
        """Half-split codes ``[N, G, 16]`` (``N`` a multiple of ``block_n``) into torch's layout in ``out``
        (``N * G * 16`` bytes) — the GGUF plugin's Q4_0/Q4_1 packer. With ``rows`` (int64 row
        indices into ``qs``) the weight's rows are ``qs[rows]``, read in place instead of copied out first."""
        stored, groups = _rows_of(qs, 16)
        order = _row_order(rows, stored)
        n = stored if rows is None else int(rows.numel())
        _check_layout(n, block_n, out, n * groups * 16)
        self._half_split(qs.data_ptr(), order, qs.stride(0), qs.stride(1), n // block_n, groups, block_n,
                         out.data_ptr())

    def int8_planes(self, codes: torch.Tensor, block_n: int, out: torch.Tensor) -> None:
        """Int8 codes ``[N, G, 32]`` (their bytes; ``N`` a multiple of ``block_n``) as the high plane's bytes,
        then the low plane's, in ``out`` (``2 * N * G * 16`` bytes) — :func:`loader.kernels.pack_int8_grouped`."""
        n, groups = _rows_of(codes, 32)
        _check_layout(n, block_n, out, 2 * n * groups * 16)
        self._planes(codes.data_ptr(), codes.stride(0), codes.stride(1), n // block_n, groups, block_n,
                     out.data_ptr())

    def q4_scales_bf16(self, blocks: torch.Tensor, has_min: bool, out: torch.Tensor, row_offset: int,
                       rows: torch.Tensor | None = None) -> None:
        """Rows ``row_offset:`` of bfloat16 scales and zeros ``out`` ``[G, rows, 2]`` from 4-bit blocks
        ``[N, G, size]`` (uint8) led by float16 ``d`` (and ``m`` when ``has_min``): ``s = d``, ``z = m + 8 d``
        in float32 rounded once (``z = 0`` without a minimum). With ``rows`` (int64 row indices into
        ``blocks``) the rows written are ``blocks[rows]``'s."""
        if blocks.dtype != torch.uint8 or blocks.dim() != 3 or blocks.device.type != "cpu":
            raise ValueError(f"4-bit blocks must be uint8 [rows, groups, size] on the CPU, not {blocks.dtype} "
                             f"{tuple(blocks.shape)} on {blocks.device}")
        stored, groups, size = (int(s) for s in blocks.shape)
        order = _row_order(rows, stored)
        n = stored if rows is None else int(rows.numel())
        if size < (4 if has_min else 2) or blocks.stride(2) != 1:
            raise ValueError(f"blocks {tuple(blocks.shape)} (strides {blocks.stride()}) do not lead with "
                             f"contiguous float16 fields")
        if (out.dtype != torch.bfloat16 or not out.is_contiguous() or out.dim() != 3 or out.shape[0] != groups
                or out.shape[2] != 2 or not 0 <= row_offset <= out.shape[1] - n):
            raise ValueError(f"scales and zeros {out.dtype} {tuple(out.shape)} cannot take {n} rows of "
                             f"{groups} groups at row {row_offset}")
        self._q4_scales(blocks.data_ptr(), order, blocks.stride(0), blocks.stride(1), n, groups, int(has_min),
                        out.data_ptr(), int(out.shape[1]), row_offset)


    def int4pack_words(self, words: torch.Tensor, along: str, shifts: tuple[int, ...], block_n: int,
                       out: torch.Tensor) -> None:
        """4-bit codes packed eight to an int32 word into torch's layout in ``out`` (uint8 ``[N, K / 2]``),
        unpacked in registers. ``along`` says where the eight codes of a word lie: ``"input"`` for words
        ``[K / 8, N]`` (GPTQ's ``qweight``; pass compressed-tensors' ``[N, K / 8]`` as its ``.t()``),
        ``"output"`` for words ``[K, N / 8]`` (AWQ); ``shifts[i]`` is the bit at which the word's ``i``-th code
        (in order along that dimension) starts: ``(0, 4, ..., 28)``, or AWQ's interleave."""
        if words.dtype != torch.int32 or words.dim() != 2 or words.device.type != "cpu":
            raise ValueError(f"words must be int32 [rows, columns] on the CPU, not {words.dtype} "
                             f"{tuple(words.shape)} on {words.device}")
        if along not in ("input", "output") or len(shifts) != 8 or any(s not in range(0, 32, 4) for s in shifts):
            raise ValueError(f"codes lie along 'input' or 'output' at eight 4-bit shifts, not {along!r} {shifts}")
        rows, cols = (int(s) for s in words.shape)
        k, n = (rows * 8, cols) if along == "input" else (rows, cols * 8)
        if min(words.stride()) < 0 or n % 16 or k % 8:
            raise ValueError(f"words {tuple(words.shape)} (strides {words.stride()}) do not hold [{k}, {n}] codes "
                             "with N a multiple of 16")
        if block_n not in _BLOCK_NS:
            raise ValueError(f"the row block {block_n} is not one of {list(_BLOCK_NS)}")
        if out.dtype != torch.uint8 or not out.is_contiguous() or out.numel() != n * k // 2 or out.device.type != "cpu":
            raise ValueError(f"the output must be {n * k // 2} contiguous uint8 bytes on the CPU, not {out.dtype} "
                             f"{tuple(out.shape)}")
        table = (ctypes.c_uint8 * 8)(*shifts)
        self._words(words.data_ptr(), words.stride(0), words.stride(1), int(along == "output"), table, n, k,
                    block_n, out.data_ptr())


    def int4pack_q4_k(self, blocks: torch.Tensor, block_n: int, out: torch.Tensor,
                      rows: torch.Tensor | None = None) -> None:
        """Q4_K super-blocks ``[N, S, 144]`` (uint8; ``N`` a multiple of ``block_n``) into torch's layout in ``out``
        (``N * S * 128`` bytes); with ``rows`` (int64 row indices into ``blocks``) the weight's rows are
        ``blocks[rows]``, read in place. The GGUF plugin's Q4_K packer."""
        stored, superblocks = _q4_k_blocks(blocks)
        order = _row_order(rows, stored)
        n = stored if rows is None else int(rows.numel())
        _check_layout(n, block_n, out, n * superblocks * 128)
        self._q4_k(blocks.data_ptr() + 16, order, blocks.stride(0), blocks.stride(1), n // block_n, superblocks,
                   block_n, out.data_ptr())

    def q4_k_scales(self, blocks: torch.Tensor, out: torch.Tensor, row_offset: int,
                    rows: torch.Tensor | None = None) -> None:
        """Rows ``row_offset:`` of scales and zeros ``out`` ``[S * 8, rows, 2]`` (bfloat16 or float32) from Q4_K
        super-blocks ``[N, S, 144]``: ``s = d sc``, ``z = -dmin m + 8 s`` in float32, rounded once to ``out``'s
        dtype. With ``rows`` the rows written are ``blocks[rows]``'s."""
        stored, superblocks = _q4_k_blocks(blocks)
        order = _row_order(rows, stored)
        n = stored if rows is None else int(rows.numel())
        if (out.dtype not in (torch.bfloat16, torch.float32) or not out.is_contiguous() or out.dim() != 3
                or out.shape[0] != superblocks * 8 or out.shape[2] != 2 or not 0 <= row_offset <= out.shape[1] - n):
            raise ValueError(f"scales and zeros {out.dtype} {tuple(out.shape)} cannot take {n} rows of "
                             f"{superblocks * 8} groups at row {row_offset}")
        self._q4_k_scales(blocks.data_ptr(), order, blocks.stride(0), blocks.stride(1), n, superblocks,
                          int(out.dtype == torch.bfloat16), out.data_ptr(), int(out.shape[1]), row_offset)


def _q4_k_blocks(blocks: torch.Tensor) -> tuple[int, int]:
    """Rows and super-blocks of Q4_K ``blocks``, after checking they are 144 contiguous bytes each."""
    if blocks.dtype != torch.uint8 or blocks.dim() != 3 or blocks.device.type != "cpu":
        raise ValueError(f"Q4_K blocks must be uint8 [rows, super-blocks, 144] on the CPU, not {blocks.dtype} "
                         f"{tuple(blocks.shape)} on {blocks.device}")
    if blocks.shape[2] != 144 or blocks.stride(2) != 1 or min(blocks.stride(0), blocks.stride(1)) < 0:
        raise ValueError(f"Q4_K blocks {tuple(blocks.shape)} (strides {blocks.stride()}) are not 144 contiguous "
                         "bytes each")
    return int(blocks.shape[0]), int(blocks.shape[1])


def _row_order(rows: torch.Tensor | None, stored: int) -> int | None:
    """The address of ``rows`` for the C (``None``: in order), after checking every index lies in ``stored``."""
    if rows is None:
        return None
    if rows.dtype != torch.int64 or rows.dim() != 1 or not rows.is_contiguous() or rows.device.type != "cpu":
        raise ValueError(f"a row order must be contiguous int64 [rows] on the CPU, not {rows.dtype} "
                         f"{tuple(rows.shape)} on {rows.device}")
    if rows.numel() and not (int(rows.min()) >= 0 and int(rows.max()) < stored):
        raise ValueError(f"a row order indexes rows {int(rows.min())}..{int(rows.max())} of {stored} stored rows")
    return int(rows.data_ptr())


def _rows_of(codes: torch.Tensor, width: int) -> tuple[int, int]:
    if codes.dtype != torch.uint8 or codes.dim() != 3 or codes.device.type != "cpu":
        raise ValueError(f"codes must be uint8 [rows, groups, {width}] on the CPU, not {codes.dtype} "
                         f"{tuple(codes.shape)} on {codes.device}")
    n, groups, got = (int(s) for s in codes.shape)
    if got != width or codes.stride(2) != 1 or min(codes.stride(0), codes.stride(1)) < 0:
        raise ValueError(f"codes {tuple(codes.shape)} (strides {codes.stride()}) are not groups of {width} "
                         f"contiguous bytes")
    return n, groups


def _check_layout(rows: int, block_n: int, out: torch.Tensor, size: int) -> None:
    if block_n not in _BLOCK_NS or rows % block_n:
        raise ValueError(f"{rows} rows are not whole blocks of {block_n} rows (one of {list(_BLOCK_NS)})")
    if out.dtype != torch.uint8 or not out.is_contiguous() or out.numel() != size or out.device.type != "cpu":
        raise ValueError(f"the output must be {size} contiguous uint8 bytes on the CPU, not {out.dtype} "
                         f"{tuple(out.shape)}")


_reason: str | None = None
_build_lock = threading.Lock()
"""Held while the helpers are found or built: layers post-processed on two threads ask at once."""
_rebuilt: dict[Path, str] = {}
"""The libraries this process built again, and why: a second thread that asked at once (and waited for the
lock) finds the new file whole, and its answer must carry the same note."""


def native_repack_unavailable_reason() -> str | None:
    """Why :func:`native_repack` is ``None`` in this process (``None`` when it is not, or was not asked yet)."""
    return _reason


@functools.cache
def native_repack() -> NativeRepack | None:
    """The compiled helpers, built and cached on first use; ``None`` (torch packs) when they cannot be had."""
    with _build_lock:  # a second thread waits, then loads the file the first built
        return _find_or_build()


def _find_or_build() -> NativeRepack | None:
    global _reason
    _reason = None
    if not NATIVE_REPACK.read():
        _reason = f"{ENV_SWITCH}=0"
        return None
    compiler = find_compiler()
    if compiler is None:
        _reason = f"no C compiler ({os.environ.get('CC') or 'cc'}) on PATH"
        log.warning("packing with torch only (slower loads): %s", _reason)
        return None
    try:
        found = load_library(compiler, SOURCE, ("loader_repack_abi", _ABI))
    except (OSError, subprocess.SubprocessError) as error:
        _reason = f"the native repack helpers could not be built or loaded: {error}"
        if isinstance(error, CacheNotWritten):
            warn_cache_not_written(cache_folder(), error)
        else:
            log.warning("packing with torch only (slower loads): %s", _reason)
        return None
    if found.rebuilt is not None:
        _rebuilt[found.path] = f"rebuilt {found.path.name}: {found.rebuilt}"
    return NativeRepack(found.library, found.path, _rebuilt.get(found.path))
