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
The other parts of a fused parameter (k and v after q, up after gate, every
expert's gate, up and down in a 3-D expert parameter) map too when congruent —
writers put tensors back to back, so when tensor sizes are multiples of 4 KiB
every tensor of a file is — and are read otherwise, or when the process's
budget of memory maps (:mod:`loader._map_budget`) cannot pay for them. A
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
import mmap
import os
import weakref
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from ._file_reads import pread_exactly, truncated_error
from ._huge_pages import advise_fresh_huge_pages
from ._libc import libc
from ._map_budget import MAPS_PER_REGION, MapsSpent, part_maps
from ._page_population import populate_soon
from ._settings import MAP_MIN_BYTES, MAP_WEIGHTS
from .errors import CheckpointFormatError, LoadError

if TYPE_CHECKING:
    import torch

    from .weights import CheckpointTensor, FileSpan

__all__ = [
    "MAP_WEIGHTS_ENV",
    "MIN_MAP_BYTES",
    "MIN_MAP_BYTES_ENV",
    "fill_parameter",
    "is_file_backed",
    "map_into_parameter",
    "mapping_enabled",
    "min_map_bytes",
    "own_region",
    "write_pending",
    "writes_in_place",
]

MAP_WEIGHTS_ENV = MAP_WEIGHTS.name
MIN_MAP_BYTES_ENV = MAP_MIN_BYTES.name
MIN_MAP_BYTES = MAP_MIN_BYTES.default
"""Default for ``LOADER_MAP_MIN_BYTES``: smaller tensors are copied (a read costs less than the
system calls) and share one arena."""

_PAGE = mmap.PAGESIZE
_HUGE_PAGE = 2 << 20
_MADV_NOHUGEPAGE = getattr(mmap, "MADV_NOHUGEPAGE", 15)
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)


def mapping_enabled() -> bool:
    """Whether CPU loads may map checkpoint files (``LOADER_MAP_WEIGHTS``, on by default, Linux only)."""
    return MAP_WEIGHTS.read() and libc is not None and not _in_place.get()


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


_MAPS_OF_A_REGION = 3
"""Maps a fresh region is: the slack before its huge-page span, the span, the tail."""

_MIN_PART_BYTES = 64 << 10
"""Inside a region, parts of at least this many bytes (or :func:`min_map_bytes`, if lower) map: the threshold
that decides which tensors get a region does not apply to their parts (an expert's part is often smaller), since
:data:`~loader._map_budget.part_maps` bounds their maps; below this a read costs less than the system calls."""

Locate = Callable[["torch.Tensor"], "torch.Tensor"]
"""Where in a parameter's data a checkpoint tensor lands: a contiguous view of the data it is given."""


class _Region:
    """A tensor's own memory: ``memory`` spans the tensor plus 2 MiB, so its start can still move."""

    __slots__ = ("cuts", "mapped", "memory", "pending", "placed", "spent")

    def __init__(self, memory: torch.Tensor) -> None:
        self.memory = memory
        self.placed = False  # where the tensor starts is decided (it moved, or could not)
        self.mapped = False  # some checkpoint bytes are file pages
        self.cuts: set[int] = set()  # addresses where mapped parts split the region into more maps
        self.spent = MapsSpent()  # what its parts took from the process's budget beyond MAPS_PER_REGION
        self.pending: list[tuple[Locate, torch.Tensor]] = []  # small parts read before the region is placed

    def pay(self, cuts: set[int]) -> bool:
        """Account for a part splitting the region at ``cuts``; ``False`` when the process's budget cannot pay.

        Each new cut adds at most one map (none where the kernel merges neighbours, which is not counted on);
        what the region then holds beyond :data:`~loader._map_budget.MAPS_PER_REGION` is paid from the budget.
        """
        new = cuts - self.cuts
        over = _MAPS_OF_A_REGION + len(self.cuts) + len(new) - MAPS_PER_REGION
        charged = min(len(new), max(0, over))
        if charged and not self.spent.spend(part_maps, charged):
            return False
        self.cuts |= new
        return True


def own_region(dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """An uninitialised CPU tensor in memory of its own, ready for :func:`map_into_parameter`.

    The region is private anonymous memory starting on a 2 MiB boundary (a huge
    page that backs a neighbour never covers it) with the whole huge pages
    inside the tensor advised for transparent huge pages where that makes
    fresh memory faster to write (:mod:`loader._huge_pages`), for a tensor that
    is copied rather than mapped.
    """
    import torch

    nbytes = max(1, torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size())
    usable = nbytes + _HUGE_PAGE
    flags = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    buffer = mmap.mmap(-1, usable + _HUGE_PAGE, flags=flags)
    whole = torch.frombuffer(buffer, dtype=torch.uint8)  # keeps ``buffer`` alive
    skip = -whole.data_ptr() % _HUGE_PAGE
    advised = nbytes // _HUGE_PAGE * _HUGE_PAGE
    if advised and hasattr(mmap, "MADV_HUGEPAGE") and advise_fresh_huge_pages():
        with contextlib.suppress(OSError, ValueError):
            buffer.madvise(mmap.MADV_HUGEPAGE, skip, advised)
    memory = whole[skip:skip + usable]
    tensor = memory[:nbytes].view(dtype).view(shape)
    region = _Region(memory)
    weakref.finalize(buffer, region.spent.give_back)  # the region's maps end with its memory
    tensor._loader_region = region  # type: ignore[attr-defined]
    return tensor


def is_file_backed(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` was given its own region and had checkpoint bytes mapped into it."""
    region = getattr(tensor, "_loader_region", None)
    return isinstance(region, _Region) and region.mapped


def fill_parameter(param: torch.Tensor, loaded: CheckpointTensor, dim: int | None = None, offset: int = 0, *,
                   locate: Locate | None = None, may_place: bool = True) -> None:
    """Write ``loaded`` into ``param`` (or into ``param.narrow(dim, offset, loaded.shape[dim])``, or into
    ``locate(param.data)``: any contiguous view, such as an expert's rows of a 3-D parameter).

    Maps the file when :func:`map_into_parameter` can, else ``loaded.read_into``.
    Weight loaders call this instead of ``read_into(param.data...)`` so that
    the parameter may move: read ``param.data`` again afterwards. ``locate``
    is called on the parameter's data as it is then, for the same reason.
    ``may_place=False`` (a fused layer's smaller parts) keeps the part from
    deciding where the parameter's region is placed: it is read aside until a
    part that may has placed it (:func:`_defer`).
    """
    where = _locator(loaded, dim, offset, locate)
    if map_into_parameter(param, loaded, locate=where, may_place=may_place):
        return
    if not may_place and _defer(param, loaded, where):
        return
    loaded.read_into(where(param.data))


def _defer(param: torch.Tensor, loaded: CheckpointTensor, where: Locate) -> bool:
    """Keep a part that may not place ``param``'s region aside until a part that may has placed it.

    A fused parameter's parts lie in the file at unrelated page phases (Qwen3's 128-byte ``q_norm`` sits
    between ``k_proj`` and ``q_proj``), and only parts congruent with where the region is placed can be mapped:
    placing it for a small first part (``k``) would copy the large ones (``q``, ``v``). Its bytes are read now
    and written once the region is placed (or at :func:`write_pending`). A part with no
    :class:`~loader.weights.FileSpan` is written at once: its format cannot map (a streamed tensor, a strided
    shard), nor then can the fused parameter's other parts, so keeping it aside would only add a copy.
    """
    region = getattr(param, "_loader_region", None)
    if not isinstance(region, _Region) or region.placed or not mapping_enabled() or loaded.file_span() is None:
        return False
    region.pending.append((where, loaded.read(param.dtype)))
    return True


def write_pending(module: torch.nn.Module) -> None:
    """Write every part :func:`fill_parameter` kept aside into its parameter (the pipeline calls this once
    ``load_weights`` is done: a part that may place a region may never have come, or been mapped)."""
    for param in module.parameters():
        region = getattr(param, "_loader_region", None)
        if isinstance(region, _Region) and region.pending:
            region.placed = True
            _write_pending(region, param)


def _write_pending(region: _Region, param: torch.Tensor) -> None:
    for where, values in region.pending:
        where(param.data).copy_(values)
    region.pending.clear()


def _locator(loaded: CheckpointTensor, dim: int | None, offset: int, locate: Locate | None) -> Locate:
    """``locate``, or the narrowing ``dim``/``offset`` describe, as one callable."""
    if locate is not None:
        if dim is not None:
            raise ValueError("fill_parameter takes dim and offset, or locate, not both")
        return locate
    if dim is None:
        return lambda data: data
    length = loaded.shape[dim]
    return lambda data: data.narrow(dim, offset, length)


def map_into_parameter(param: torch.Tensor, loaded: CheckpointTensor, dim: int | None = None,
                       offset: int = 0, *, locate: Locate | None = None, may_place: bool = True) -> bool:
    """Make ``param``'s pages for ``loaded`` the file's pages; ``False`` (nothing done) when it cannot.

    It cannot unless mapping is enabled, ``param`` has a region of its own
    (:func:`own_region`), ``loaded`` has a :class:`~loader.weights.FileSpan`
    in ``param``'s dtype of at least :data:`_MIN_PART_BYTES` (or
    :func:`min_map_bytes`, if lower), the destination (as in
    :func:`fill_parameter`) is contiguous and inside ``param``, its address
    can be made congruent to the file offset, and the process's budget of
    memory maps (:mod:`loader._map_budget`) pays for a part beyond the
    region's allowance.
    """
    region = getattr(param, "_loader_region", None)
    if not isinstance(region, _Region) or not mapping_enabled():
        return False
    where = _locator(loaded, dim, offset, locate)
    data = param.data
    if data.device.type != "cpu" or data.dtype != loaded.dtype or not data.is_contiguous():
        return False
    span = loaded.file_span()
    if span is None or span.nbytes < min(_MIN_PART_BYTES, min_map_bytes()) or span.offset % data.element_size():
        return False
    destination = where(data)
    if not _lands_inside(destination, data, loaded, span.nbytes):
        return False
    if not region.placed:
        if not may_place:
            return False
        region.placed = True
        if _untouched(region.memory):
            inside = destination.data_ptr() - data.data_ptr()
            phase = (span.offset - inside) % _HUGE_PAGE
            nbytes = data.numel() * data.element_size()
            param.data = region.memory[phase:phase + nbytes].view(data.dtype).view(data.shape)
            data = param.data
            destination = where(data)
        _write_pending(region, param)
    if (destination.data_ptr() - span.offset) % _PAGE:
        return False
    start, end = destination.data_ptr(), destination.data_ptr() + span.nbytes
    data_end = data.data_ptr() + data.numel() * data.element_size()
    # Around the parameter lies slack of its own region: a partial first or last page can be mapped
    # whole. Between two parts of a fused parameter it holds bytes of the other part: it is read.
    mapped = _map_span(start, span, loaded, region, whole_first_page=start == data.data_ptr(),
                       whole_last_page=end == data_end)
    region.mapped = region.mapped or mapped
    return mapped


def _lands_inside(destination: torch.Tensor, data: torch.Tensor, loaded: CheckpointTensor, nbytes: int) -> bool:
    """Whether ``destination`` is one contiguous run of ``nbytes`` within ``data``, shaped as ``loaded``."""
    start = destination.data_ptr()
    return (destination.is_contiguous() and tuple(destination.shape) == tuple(loaded.shape)
            and destination.dtype == data.dtype and destination.numel() * destination.element_size() == nbytes
            and data.data_ptr() <= start and start + nbytes <= data.data_ptr() + data.numel() * data.element_size())


def _untouched(memory: torch.Tensor) -> bool:
    """True when no page of ``memory`` (page-aligned at its start) is resident: nothing was written there."""
    assert libc is not None
    start = memory.data_ptr()
    length = memory.numel()
    if start % _PAGE:
        return False
    pages = -(-length // _PAGE)
    vector = (ctypes.c_ubyte * pages)()
    if libc.mincore(start, length, vector) != 0:
        return False
    return bytes(vector).count(0) == pages  # bit 0 of each byte: resident


def _map_span(address: int, span: FileSpan, loaded: CheckpointTensor, region: _Region, *, whole_first_page: bool,
              whole_last_page: bool) -> bool:
    """Map the pages of ``span`` at ``address`` (congruent to its offset); read partial pages shared with others.

    The region pays for the maps it may add before anything is mapped; a refused mapping leaves anonymous
    memory in their place (:func:`_map_fixed`), so what was paid stays spent.
    """
    assert libc is not None
    end = address + span.nbytes
    map_start = address // _PAGE * _PAGE if whole_first_page else -(-address // _PAGE) * _PAGE
    map_end = -(-end // _PAGE) * _PAGE if whole_last_page else end // _PAGE * _PAGE
    if map_end <= map_start or not region.pay(_cuts(address, end, map_start, map_end)):
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
        populate_soon(map_start, map_end - map_start, loaded)
        _pread_exact(fd, address, map_start - address, span.offset, loaded)
        _pread_exact(fd, map_end, end - map_end, span.offset + (map_end - address), loaded)
    finally:
        os.close(fd)
    if span.stats is not None:
        span.stats.add(span.nbytes, tensors=1, mapped=min(map_end, end) - max(map_start, address))
    return True


def _cuts(address: int, end: int, map_start: int, map_end: int) -> set[int]:
    """Where mapping ``[map_start, map_end)`` for the part ``[address, end)`` splits memory into maps: both ends
    of the mapping, and the outer edge of a partial page at either end, advised apart (:func:`_pread_exact`)."""
    cuts = {map_start, map_end}
    if map_start > address:
        cuts.add(map_start - _PAGE)
    if map_end < end:
        cuts.add(map_end + _PAGE)
    return cuts


def _map_fixed(address: int, length: int, fd: int, file_offset: int) -> bool:
    """Map ``length`` bytes of ``fd`` over our own region at ``address``; ``False`` if the kernel refuses."""
    assert libc is not None
    prot = mmap.PROT_READ | mmap.PROT_WRITE
    fixed = getattr(mmap, "MAP_FIXED", 0x10)
    got = libc.mmap(address, length, prot, mmap.MAP_PRIVATE | fixed, fd, file_offset)
    if got == address:
        return True
    # A failed MAP_FIXED may already have unmapped the range: put anonymous memory back, then copy instead.
    anonymous = mmap.MAP_PRIVATE | getattr(mmap, "MAP_ANONYMOUS", 0x20) | fixed
    if libc.mmap(address, length, prot, anonymous, -1, 0) != address:
        code = ctypes.get_errno()
        raise LoadError(f"could not restore parameter memory after a failed mapping: {os.strerror(code)}")
    return False


def _pread_exact(fd: int, address: int, length: int, offset: int, loaded: CheckpointTensor) -> None:
    """Read a partial page. The region around it is advised for huge pages, and a 2 MiB page faulted in for
    a few bytes is zeroed whole, then split when the next part maps over it (far slower than a small
    page: benchmarks/RESULTS.md), so the page is first taken out of that advice."""
    if length <= 0:
        return
    assert libc is not None
    page = address // _PAGE * _PAGE
    libc.madvise(page, -(-(address + length) // _PAGE) * _PAGE - page, _MADV_NOHUGEPAGE)
    target: Any = (ctypes.c_ubyte * length).from_address(address)
    pread_exactly(fd, memoryview(target).cast("B"), offset, loaded.file, f"tensor {loaded.name!r}")
