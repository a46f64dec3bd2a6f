"""Move a :class:`~.tensor.SafetensorsTensor`'s bytes into a destination tensor.

The paths, fastest first:

- **direct**: ``out`` is a contiguous CPU tensor of the file's dtype, so the
  bytes are read with ``preadv`` straight into ``out``'s memory; no other copy;
- **widening**: ``out`` is contiguous float32 and the file holds a contiguous
  run of bfloat16 or float16: compiled reads over the I/O pool convert each
  128 KiB piece while it is in the core's cache (:func:`loader.io.read_widening`),
  so the bytes are written once, at their final width;
- **through a bounce buffer**: any other dtype or a strided view (or no C
  compiler): chunks of about :data:`BOUNCE_CHUNK_BYTES` along the outermost dim
  are read with ``preadv`` into one reused buffer, and torch converts each into
  ``out``;
- **chunked to CUDA**: each chunk is read into one of two pinned buffers and
  copied host-to-device asynchronously; the next chunk is read while the copy
  runs, and a buffer is reused only after its copy's event has completed. A
  dtype conversion then happens on the GPU.

No path reads the file through a memory map. Another process may truncate or
rewrite a checkpoint while it loads; a read from a map past the new end of the
file is a ``SIGBUS`` that kills the process, while a positioned read (in Python
or in the compiled reads) returns short and becomes a :class:`~loader.errors.CheckpointFormatError` naming the
file and tensor. What the bounce costs against converting straight out of a
map is in benchmarks/RESULTS.md. Mapped *parameters*
(:func:`loader.weights.fill_parameter`) are the one place file pages outlive a read.

CPU destinations are first offered transparent huge pages
(:mod:`.memory_hints`). Every read adds its bytes to the tensor's
:class:`~loader.weights.ReadStats`, and a finished tensor one to ``tensors_read``.
"""

from __future__ import annotations

import sys
from functools import partial
from typing import TYPE_CHECKING

import torch

from loader.io import WIDENED_SOURCES, fused_reads_available, io_threads, read_widening, run_in_pool

from .memory_hints import advise_huge_pages
from .parallel_read import read_layout
from .staging import staging_buffer

if TYPE_CHECKING:
    from .tensor import SafetensorsTensor

__all__ = ["BOUNCE_CHUNK_BYTES", "STAGING_CHUNK_BYTES", "WIDEN_MIN_PIECE_BYTES", "read_tensor_into"]

STAGING_CHUNK_BYTES = 32 << 20
"""Source bytes per chunk when a read to CUDA goes through a pinned staging buffer."""

BOUNCE_CHUNK_BYTES = 16 << 20
"""Source bytes per chunk of a converting CPU read. Each chunk is one parallel region of torch's copy;
smaller chunks stay in the CPU cache, but on a busy machine waking torch's threads for each region costs
more than the cache saves: benchmarks/RESULTS.md."""

WIDEN_MIN_PIECE_BYTES = 1 << 20
"""Source bytes below which a widening read is not split further over the pool."""

_BOUNCE_SLOT = 2
"""This thread's staging slot for the bounce buffer (0 and 1 belong to the CUDA path)."""


def read_tensor_into(tensor: SafetensorsTensor, out: torch.Tensor) -> None:
    """Write ``tensor``'s values into ``out`` (same shape; any dtype; CPU, CUDA or other device)."""
    dest = out.detach()
    if tensor.numel() == 0:
        _count(tensor, 0, tensors=1)
        return
    if dest.device.type == "cpu":
        advise_huge_pages(dest)
        if dest.dtype == tensor.dtype and dest.is_contiguous():
            _read_direct(tensor, dest)
        elif _widens(tensor, dest):
            _read_widening(tensor, dest)
        else:
            _read_through_bounce(tensor, dest)
    elif dest.device.type == "cuda":
        _read_chunked_cuda(tensor, dest)
    else:
        staged = torch.empty(tensor.shape, dtype=tensor.dtype)
        _read_direct(tensor, staged)
        with torch.no_grad():
            dest.copy_(staged)
    _count(tensor, 0, tensors=1)


def _count(tensor: SafetensorsTensor, nbytes: int, tensors: int = 0) -> None:
    if tensor.stats is not None and (nbytes or tensors):
        tensor.stats.add(nbytes, tensors)


def _read_raw(tensor: SafetensorsTensor, target: torch.Tensor) -> None:
    """Read ``tensor``'s view into the contiguous CPU ``target`` (its bytes, whatever its dtype)."""
    layout = tensor.layout()
    raw = target.reshape(-1).view(torch.uint8).numpy()
    with tensor.descriptor.borrow() as fd:
        read_layout(fd, layout, raw, path=tensor.file, what=f"tensor {tensor.name!r}")


def _read_direct(tensor: SafetensorsTensor, dest: torch.Tensor) -> None:
    _read_raw(tensor, dest)
    _count(tensor, tensor.nbytes)


def _widens(tensor: SafetensorsTensor, dest: torch.Tensor) -> bool:
    return (dest.dtype == torch.float32 and str(tensor.dtype).removeprefix("torch.") in WIDENED_SOURCES
            and dest.is_contiguous() and sys.byteorder == "little" and tensor.layout().contiguous
            and fused_reads_available())


def _read_widening(tensor: SafetensorsTensor, dest: torch.Tensor) -> None:
    """The tensor split over the I/O pool (at most :data:`BOUNCE_CHUNK_BYTES` of source a piece, at least
    :data:`WIDEN_MIN_PIECE_BYTES`), each piece widened into place in C: the pool's threads fault in the fresh
    destination pages together, as torch's threads do in the bounce buffer's copy."""
    offset, count, address = tensor.layout().offset, tensor.numel(), dest.data_ptr()
    per_task = min(BOUNCE_CHUNK_BYTES, max(WIDEN_MIN_PIECE_BYTES, -(-tensor.nbytes // io_threads()))) // 2
    with tensor.descriptor.borrow() as fd:
        run_in_pool([partial(read_widening, fd, offset + first * 2, min(per_task, count - first), tensor.dtype,
                             address + first * 4, path=tensor.file, what=f"tensor {tensor.name!r}")
                     for first in range(0, count, per_task)])
    _count(tensor, tensor.nbytes)


def _chunks(tensor: SafetensorsTensor, chunk_bytes: int) -> tuple[int, list[tuple[int, int]]]:
    """The dim to split along (the outermost one longer than 1) and its ``(start, length)`` chunks."""
    shape = tensor.shape
    dim = next((d for d, size in enumerate(shape) if size != 1), 0)
    if not shape:
        return 0, [(0, 1)]
    inner = tensor.nbytes // shape[dim]
    step = max(1, chunk_bytes // max(inner, 1))
    return dim, [(start, min(step, shape[dim] - start)) for start in range(0, shape[dim], step)]


def _piece(tensor: SafetensorsTensor, dim: int, start: int, length: int) -> SafetensorsTensor:
    return tensor if not tensor.shape else tensor.narrow(dim, start, length)


def _dest_piece(dest: torch.Tensor, dim: int, start: int, length: int) -> torch.Tensor:
    return dest if dest.ndim == 0 else dest.narrow(dim, start, length)


def _read_through_bounce(tensor: SafetensorsTensor, dest: torch.Tensor) -> None:
    """Read each chunk into this thread's reused bounce buffer, then let torch convert it into ``dest``."""
    dim, chunks = _chunks(tensor, BOUNCE_CHUNK_BYTES)
    largest = max(_piece(tensor, dim, s, n).nbytes for s, n in chunks)
    buffer = staging_buffer(_BOUNCE_SLOT, largest)
    with torch.no_grad():
        for first, length in chunks:
            piece = _piece(tensor, dim, first, length)
            staged = buffer[: piece.nbytes].view(tensor.dtype).view(piece.shape)
            _read_raw(piece, staged)
            _dest_piece(dest, dim, first, length).copy_(staged)
            _count(tensor, piece.nbytes)


def _read_chunked_cuda(tensor: SafetensorsTensor, dest: torch.Tensor) -> None:
    dim, chunks = _chunks(tensor, STAGING_CHUNK_BYTES)
    largest = max(_piece(tensor, dim, s, n).nbytes for s, n in chunks)
    pinned = [staging_buffer(slot, largest, pinned=True) for slot in range(min(2, len(chunks)))]
    done: list[torch.cuda.Event | None] = [None] * len(pinned)
    stream = torch.cuda.current_stream(dest.device)
    try:
        with torch.no_grad():
            for index, (first, length) in enumerate(chunks):
                slot = index % len(pinned)
                event = done[slot]
                if event is not None:
                    event.synchronize()  # the copy that last read this pinned buffer has finished
                piece = _piece(tensor, dim, first, length)
                host = pinned[slot][: piece.nbytes].view(tensor.dtype).view(piece.shape)
                _read_raw(piece, host)
                _count(tensor, piece.nbytes)
                target = _dest_piece(dest, dim, first, length)
                if target.dtype == tensor.dtype and target.is_contiguous():
                    target.copy_(host, non_blocking=True)
                else:  # copy the file's dtype over, convert on the GPU (same stream, so ordered)
                    on_device = torch.empty(piece.shape, dtype=tensor.dtype, device=dest.device)
                    on_device.copy_(host, non_blocking=True)
                    target.copy_(on_device)
                copied = torch.cuda.Event()
                copied.record(stream)
                done[slot] = copied
    finally:
        # the pinned buffers are reused by the next read: let every copy out of them finish
        for event in done:
            if event is not None:
                event.synchronize()
