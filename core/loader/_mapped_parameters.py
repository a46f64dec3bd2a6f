"""CPU parameters whose pages are the checkpoint file's own page cache, instead of a copy of it.

Why: copying a warm checkpoint is cheap (a memcpy from the page cache);
what a load into *fresh* memory pays is the first touch of every page. On a
VM that hands free memory back to its host (free page reporting) each fresh
page also faults in the host, so writing new memory is slow and varies
widely from one process to the next. Bytes stored in the file exactly as the parameter holds them
(same dtype, one contiguous run: see :meth:`~loader.weights.CheckpointTensor.file_span`)
need no new memory: mapping the file privately at the parameter's address
and populating the page tables costs the same every time with 4 KiB entries,
and far less (benchmarks/RESULTS.md) where the page cache holds the
file in 2 MiB folios (ext4 and xfs on recent kernels) and the address is
congruent to the file offset modulo 2 MiB, so that one entry maps a whole folio.

How: :func:`~loader._pipeline.materialize.materialize` gives every CPU tensor
of at least :func:`min_map_bytes` (1 MiB) its own region (2 MiB aligned, 2 MiB
of slack). The first checkpoint tensor mapped into it decides where in the
region the parameter starts: an address congruent to the tensor's file offset
modulo 2 MiB (``mmap`` needs it modulo the page size; the huge folios need
2 MiB). The parameter's storage moves there (``param.data = ...``, so every reference to
the parameter sees it); whole pages are mapped from the file over the region
with ``MAP_FIXED | MAP_PRIVATE``; the partial first and last pages are read.
The other parts of a fused parameter (k and v after q, up after gate) map too
when congruent — writers put tensors back to back, so when tensor sizes are
multiples of 4 KiB every tensor of a file is — and are read otherwise. A
parameter only moves while no page of its region is resident (``mincore``):
nothing has been written to it, so nothing is lost.

Semantics, as with ``transformers`` (which maps safetensors files for CPU
loads) and ``torch.load(mmap=True)``: unwritten pages stay shared with the
page cache, so memory is not doubled and the kernel may drop and re-read them
under pressure; writing to a parameter copies just the pages written. A
checkpoint file rewritten in place (same inode) or truncated while the model
lives changes or invalidates those pages: set ``LOADER_MAP_WEIGHTS=0`` to copy
every byte into anonymous memory instead.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import sys
import threading
from collections.abc import Iterator
from contextvars import ContextVar
from functools import partial
from typing import TYPE_CHECKING, Any

from ._file_reads import pread_exactly, truncated_error
from ._io_pool import run_in_pool
from ._settings import MAP_MIN_BYTES, MAP_WEIGHTS
from .errors import CheckpointFormatError, LoadError

if TYPE_CHECKING:
    import torch

    from .weights import CheckpointTensor, FileSpan

__all__ = [
    "MAP_WEIGHTS_ENV",
    "MIN_MAP_BYTES",
    "MIN_MAP_BYTES_ENV",
    "background_population",
    "fill_parameter",
    "is_file_backed",
    "map_into_parameter",
    "mapping_enabled",
    "min_map_bytes",
    "own_region",
    "region_budget",
    "writes_in_place",
]

MAP_WEIGHTS_ENV = MAP_WEIGHTS.name
MIN_MAP_BYTES_ENV = MAP_MIN_BYTES.name
MIN_MAP_BYTES = MAP_MIN_BYTES.default
"""Default for ``LOADER_MAP_MIN_BYTES``: smaller tensors are copied (a read costs less than the
system calls) and share one arena."""

_PAGE = mmap.PAGESIZE
_HUGE_PAGE = 2 << 20
_MADV_POPULATE_READ = 22  # Linux 5.14+; older kernels answer EINVAL and the pages fault in on first use
_MADV_NOHUGEPAGE = getattr(mmap, "MADV_NOHUGEPAGE", 15)
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)


class _Libc:
    """``mmap``, ``madvise`` and ``mincore`` from the C library, or ``None`` where they are missing."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self.mmap = libc.mmap
        self.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_long]
        self.mmap.restype = ctypes.c_void_p
        self.madvise = libc.madvise
        self.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        self.madvise.restype = ctypes.c_int
        self.mincore = libc.mincore
        self.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        self.mincore.restype = ctypes.c_int


def _load_libc() -> _Libc | None:
    if not sys.platform.startswith("linux") or ctypes.sizeof(ctypes.c_void_p) != 8:
        return None
    try:
        return _Libc()
    except (OSError, AttributeError):
        return None


_libc = _load_libc()


def mapping_enabled() -> bool:
    """Whether CPU loads may map checkpoint files (``LOADER_MAP_WEIGHTS``, on by default, Linux only)."""
    return MAP_WEIGHTS.read() and _libc is not None and not _in_place.get()


_in_place: ContextVar[bool] = ContextVar("loader_writes_in_place", default=False)


@contextlib.contextmanager
def writes_in_place() -> Iterator[None]:
    """Map nothing in the block: every fill copies into the parameter's storage, which stays where it is.

    A weight update keeps every parameter's storage (references, optimizers and CUDA graphs hold it);
    writing into a parameter that is mapped copies the pages written, and never reaches the file.
    """
    token = _in_place.set(True)
    try:
        yield
    finally:
        _in_place.reset(token)


def min_map_bytes() -> int:
    """Tensors at least this large get a region of their own and may be mapped (``LOADER_MAP_MIN_BYTES``)."""
    return MAP_MIN_BYTES.read()


_MAPS_PER_REGION = 8
"""Memory maps a region can end up split into: the region, a few mapped parts, the small pages between."""


def region_budget() -> int:
    """How many tensors may get a region of their own without running into ``vm.max_map_count``.

    Every mapped part and every page advised apart splits the region's memory
    map; a checkpoint with tens of thousands of large tensors (a mixture of
    experts) would otherwise exhaust the kernel's per-process limit (65530 by
    default), and every ``mmap`` after that fails. Half of what is left is used.
    """
    try:
        with open("/proc/sys/vm/max_map_count", encoding="ascii") as fh:
            limit = int(fh.read().strip())
        with open("/proc/self/maps", "rb") as fh:
            used = sum(1 for _ in fh)
    except (OSError, ValueError):
        return 1 << 30
    return max(0, (limit - used) // 2 // _MAPS_PER_REGION)


class _Region:
    """A tensor's own memory: ``memory`` spans the tensor plus 2 MiB, so its start can still move."""

    __slots__ = ("mapped", "memory", "placed")

    def __init__(self, memory: torch.Tensor) -> None:
        self.memory = memory
        self.placed = False  # where the tensor starts is decided (it moved, or could not)
        self.mapped = False  # some checkpoint bytes are file pages


def own_region(dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """An uninitialised CPU tensor in memory of its own, ready for :func:`map_into_parameter`.

    The region is private anonymous memory starting on a 2 MiB boundary (a huge
    page that backs a neighbour never covers it) with the whole huge pages
    inside the tensor advised for transparent huge pages, so a tensor that is
    copied rather than mapped still writes fresh memory quickly.
    """
    import torch

    nbytes = max(1, torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size())
    usable = nbytes + _HUGE_PAGE
    flags = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    buffer = mmap.mmap(-1, usable + _HUGE_PAGE, flags=flags)
    whole = torch.frombuffer(buffer, dtype=torch.uint8)  # keeps ``buffer`` alive
    skip = -whole.data_ptr() % _HUGE_PAGE
    advised = nbytes // _HUGE_PAGE * _HUGE_PAGE
    if advised and hasattr(mmap, "MADV_HUGEPAGE"):
        with contextlib.suppress(OSError, ValueError):
            buffer.madvise(mmap.MADV_HUGEPAGE, skip, advised)
    memory = whole[skip:skip + usable]
    tensor = memory[:nbytes].view(dtype).view(shape)
    tensor._loader_region = _Region(memory)  # type: ignore[attr-defined]
    return tensor


def is_file_backed(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` was given its own region and had checkpoint bytes mapped into it."""
    region = getattr(tensor, "_loader_region", None)
    return isinstance(region, _Region) and region.mapped


def fill_parameter(param: torch.Tensor, loaded: CheckpointTensor, dim: int | None = None, offset: int = 0) -> None:
    """Write ``loaded`` into ``param`` (or into ``param.narrow(dim, offset, loaded.shape[dim])``).

    Maps the file when :func:`map_into_parameter` can, else ``loaded.read_into``.
    Weight loaders call this instead of ``read_into(param.data...)`` so that
    the parameter may move: read ``param.data`` again afterwards.
    """
    if map_into_parameter(param, loaded, dim, offset):
        return
    loaded.read_into(param.data if dim is None else param.data.narrow(dim, offset, loaded.shape[dim]))


def map_into_parameter(param: torch.Tensor, loaded: CheckpointTensor, dim: int | None = None,
                       offset: int = 0) -> bool:
    """Make ``param``'s pages for ``loaded`` the file's pages; ``False`` (nothing done) when it cannot.

    It cannot unless mapping is enabled, ``param`` has a region of its own
    (:func:`own_region`), ``loaded`` has a :class:`~loader.weights.FileSpan`
    of at least :func:`min_map_bytes` in ``param``'s dtype, the destination is
    contiguous, and the destination's address can be made congruent to the
    file offset.
    """
    region = getattr(param, "_loader_region", None)
    if not isinstance(region, _Region) or not mapping_enabled():
        return False
    data = param.data
    if data.device.type != "cpu" or data.dtype != loaded.dtype or not data.is_contiguous():
        return False
    span = loaded.file_span()
    if span is None or span.nbytes < min_map_bytes() or span.offset % data.element_size():
        return False
    destination = data if dim is None else data.narrow(dim, offset, loaded.shape[dim])
    if (not destination.is_contiguous() or tuple(destination.shape) != tuple(loaded.shape)
            or destination.numel() * destination.element_size() != span.nbytes):
        return False
    if not region.placed:
        region.placed = True
        if _untouched(region.memory):
            inside = destination.data_ptr() - data.data_ptr()
            phase = (span.offset - inside) % _HUGE_PAGE
            nbytes = data.numel() * data.element_size()
            param.data = region.memory[phase:phase + nbytes].view(data.dtype).view(data.shape)
            data = param.data
            destination = data if dim is None else data.narrow(dim, offset, loaded.shape[dim])
    if (destination.data_ptr() - span.offset) % _PAGE:
        return False
    start, end = destination.data_ptr(), destination.data_ptr() + span.nbytes
    data_end = data.data_ptr() + data.numel() * data.element_size()
    # Around the parameter lies slack of its own region: a partial first or last page can be mapped
    # whole. Between two parts of a fused parameter it holds bytes of the other part: it is read.
    mapped = _map_span(start, span, loaded, whole_first_page=start == data.data_ptr(),
                       whole_last_page=end == data_end)
    region.mapped = region.mapped or mapped
    return mapped


def _untouched(memory: torch.Tensor) -> bool:
    """True when no page of ``memory`` (page-aligned at its start) is resident: nothing was written there."""
    assert _libc is not None
    start = memory.data_ptr()
    length = memory.numel()
    if start % _PAGE:
        return False
    pages = -(-length // _PAGE)
    vector = (ctypes.c_ubyte * pages)()
    if _libc.mincore(start, length, vector) != 0:
        return False
    return bytes(vector).count(0) == pages  # bit 0 of each byte: resident


def _map_span(address: int, span: FileSpan, loaded: CheckpointTensor, *, whole_first_page: bool,
              whole_last_page: bool) -> bool:
    """Map the pages of ``span`` at ``address`` (congruent to its offset); read partial pages shared with others."""
    assert _libc is not None
    end = address + span.nbytes
    map_start = address // _PAGE * _PAGE if whole_first_page else -(-address // _PAGE) * _PAGE
    map_end = -(-end // _PAGE) * _PAGE if whole_last_page else end // _PAGE * _PAGE
    if map_end <= map_start:
        return False
    try:
        fd = os.open(span.path, _OPEN_FLAGS)
    except OSError as exc:
        raise CheckpointFormatError(f"{span.path}: cannot open: {exc.strerror or exc}") from exc
    try:
        size = os.fstat(fd).st_size
        if size < span.offset + span.nbytes:  # checked right before mapping: reading past the end is SIGBUS
            raise truncated_error(span.path, f"tensor {loaded.name!r}", size, span.offset + span.nbytes)
        if not _map_fixed(map_start, map_end - map_start, fd, span.offset + (map_start - address)):
            return False
        _populate_soon(map_start, map_end - map_start, loaded)
        _pread_exact(fd, address, map_start - address, span.offset, loaded)
        _pread_exact(fd, map_end, end - map_end, span.offset + (map_end - address), loaded)
    finally:
        os.close(fd)
    if span.stats is not None:
        span.stats.add(span.nbytes, tensors=1, mapped=min(map_end, end) - max(map_start, address))
    return True


def _map_fixed(address: int, length: int, fd: int, file_offset: int) -> bool:
    """Map ``length`` bytes of ``fd`` over our own region at ``address``; ``False`` if the kernel refuses."""
    assert _libc is not None
    prot = mmap.PROT_READ | mmap.PROT_WRITE
    fixed = getattr(mmap, "MAP_FIXED", 0x10)
    got = _libc.mmap(address, length, prot, mmap.MAP_PRIVATE | fixed, fd, file_offset)
    if got == address:
        return True
    # A failed MAP_FIXED may already have unmapped the range: put anonymous memory back, then copy instead.
    anonymous = mmap.MAP_PRIVATE | getattr(mmap, "MAP_ANONYMOUS", 0x20) | fixed
    if _libc.mmap(address, length, prot, anonymous, -1, 0) != address:
        code = ctypes.get_errno()
        raise LoadError(f"could not restore parameter memory after a failed mapping: {os.strerror(code)}")
    return False


def _populate(address: int, length: int, loaded: CheckpointTensor) -> None:
    """Fault the mapped pages in now (shared with the page cache), so the load ends with them resident."""
    assert _libc is not None
    if _libc.madvise(address, length, _MADV_POPULATE_READ) == 0:
        return
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EPERM):
        return  # an older kernel: pages fault in on first use instead
    if code == errno.EFAULT:  # the kernel's answer where touching the page would have been a SIGBUS
        raise CheckpointFormatError(f"{loaded.describe()}: the file's pages are gone: the file was truncated "
                                    "while it was being loaded")
    raise CheckpointFormatError(f"{loaded.describe()}: cannot read the file's pages: {os.strerror(code)}")


def _pread_exact(fd: int, address: int, length: int, offset: int, loaded: CheckpointTensor) -> None:
    """Read a partial page. The region around it is advised for huge pages, and a 2 MiB page faulted in for
    a few bytes is zeroed whole, then split when the next part maps over it (far slower than a small
    page: benchmarks/RESULTS.md), so the page is first taken out of that advice."""
    if length <= 0:
        return
    assert _libc is not None
    page = address // _PAGE * _PAGE
    _libc.madvise(page, -(-(address + length) // _PAGE) * _PAGE - page, _MADV_NOHUGEPAGE)
    target: Any = (ctypes.c_ubyte * length).from_address(address)
    pread_exactly(fd, memoryview(target).cast("B"), offset, loaded.file, f"tensor {loaded.name!r}")


# --- populating page tables after the mapping -------------------------------------------------
#
# Mapping makes a parameter's contents right at once; populating only makes
# the pages present, so that the first forward pass does not fault them in.
# It costs about what copying would, runs in the
# kernel without the GIL and splits across threads, but it holds the address
# space lock that ``mmap`` needs: run while parameters are still being mapped,
# it slows every ``mmap`` call down as much as it saves. So inside a load the
# ranges are collected and populated together on a thread pool when the
# weights are all in place (:func:`background_population`).

_POPULATE_CHUNK = 32 << 20
_scope = threading.local()


@contextlib.contextmanager
def background_population() -> Iterator[None]:
    """Defer populating mapped pages to the end of the block, then do it on a thread pool and wait.

    A failure to read the file's pages (an I/O error) is raised there. Outside
    such a block, pages are populated before :func:`fill_parameter` returns.
    """
    outer = getattr(_scope, "pending", None)
    pending: list[tuple[int, int, CheckpointTensor]] = []
    _scope.pending = pending
    try:
        yield
    finally:
        _scope.pending = outer
    _populate_all(pending)


def _populate_all(ranges: list[tuple[int, int, CheckpointTensor]]) -> None:
    """Populate ``ranges`` in pieces of :data:`_POPULATE_CHUNK` on the shared I/O pool."""
    run_in_pool([partial(_populate, start, min(_POPULATE_CHUNK, address + length - start), loaded)
                 for address, length, loaded in ranges
                 for start in range(address, address + length, _POPULATE_CHUNK)])


def _populate_soon(address: int, length: int, loaded: CheckpointTensor) -> None:
    pending: list[tuple[int, int, CheckpointTensor]] | None = getattr(_scope, "pending", None)
    if pending is None:
        _populate(address, length, loaded)
    else:
        pending.append((address, length, loaded))
