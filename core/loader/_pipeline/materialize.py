"""Build a model on the ``meta`` device, then give it real storage on the target device.

Building on ``meta`` costs nothing; materializing allocates every parameter
once. On the CPU, tensors of at least
:func:`~loader._mapped_parameters.min_map_bytes` (1 MiB) get memory of their own, into
which the checkpoint's file pages can be mapped (:mod:`loader._mapped_parameters`);
the rest (and all of them with ``LOADER_MAP_WEIGHTS=0``) are carved from an
arena: one per layer whose quantize method post-processes its tensors
(which it usually replaces: GPTQ's small ``scales``, ``qzeros`` and
``g_idx``), one for the rest. Pages written into an arena stay resident
while any tensor in it lives, so sharing one with the norms kept every
dropped checkpoint tensor's bytes in RSS, and
one arena for all such layers would keep them until the last layer is
processed, at the load's peak. Regions and arenas are advised for
transparent huge pages (whole 2 MiB spans only), which makes first-touch
page faults (the dominant cost of copying a checkpoint into fresh memory)
much cheaper. Parameter objects are kept (only ``.data`` changes), so
``weight_loader`` attributes survive.
"""

from __future__ import annotations

import contextlib
import mmap

import torch
from torch import nn

from .._huge_pages import advise_fresh_huge_pages
from .._map_budget import region_budget
from .._mapped_parameters import mapping_enabled, min_map_bytes, own_region
from ..layers.quantization import QuantizeMethodBase

__all__ = ["materialize", "parameter_bytes"]

_ALIGN = 64  # bytes; every tensor starts on a cache line


def _tensors(model: nn.Module) -> list[tuple[list[tuple[nn.Module, str]], torch.Tensor, bool]]:
    """Each distinct parameter/buffer with every (module, attribute) that holds it (tied weights)."""
    index: dict[int, int] = {}
    found: list[tuple[list[tuple[nn.Module, str]], torch.Tensor, bool]] = []
    for module in model.modules():
        owned: list[tuple[str, torch.Tensor, bool]] = [
            (n, p, True) for n, p in module._parameters.items() if p is not None
        ]
        owned += [(n, b, False) for n, b in module._buffers.items() if b is not None]
        for name, tensor, is_param in owned:
            if id(tensor) in index:
                found[index[id(tensor)]][0].append((module, name))
            else:
                index[id(tensor)] = len(found)
                found.append(([(module, name)], tensor, is_param))
    return found


def parameter_bytes(model: nn.Module) -> int:
    """Bytes held by the model's (deduplicated) parameters and buffers.

    Buffers count because quantized layers keep scales and code tables there.
    """
    return sum(t.numel() * t.element_size() for _, t, _ in _tensors(model))


_HUGE_PAGE = 2 * 1024 * 1024


def _cpu_arena(nbytes: int) -> torch.Tensor:
    """Private anonymous memory, 2 MiB aligned, its whole 2 MiB spans advised for transparent huge pages
    (unless :func:`~loader._huge_pages.advise_fresh_huge_pages` says 4 KiB faults are faster here).

    Private, because the kernel ignores huge-page advice on shared memory where
    ``shmem_enabled`` is ``never`` (``mmap.mmap(-1, n)`` alone is ``MAP_SHARED``);
    aligned, so every 2 MiB of the arena can be one page. Only the spans the
    arena fills are advised, and the tail is advised against: a huge page
    faulted in for a few norm weights and rotary tables (the usual arena when
    large tensors are mapped, ~70 KiB for a 1 GB Llama) would add a whole
    2 MiB of zeroes to the resident set.
    """
    size = max(nbytes, 1) + _HUGE_PAGE
    flags = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    buffer = mmap.mmap(-1, size, flags=flags) if flags else mmap.mmap(-1, size)
    whole = torch.frombuffer(buffer, dtype=torch.uint8)  # keeps ``buffer`` alive
    skip = -whole.data_ptr() % _HUGE_PAGE
    advised = nbytes // _HUGE_PAGE * _HUGE_PAGE
    with contextlib.suppress(OSError):  # kernels without THP
        if advised and hasattr(mmap, "MADV_HUGEPAGE") and advise_fresh_huge_pages():
            buffer.madvise(mmap.MADV_HUGEPAGE, skip, advised)
        if hasattr(mmap, "MADV_NOHUGEPAGE") and size - skip - advised > 0:
            buffer.madvise(mmap.MADV_NOHUGEPAGE, skip + advised, size - skip - advised)
    return whole[skip:skip + max(nbytes, 1)]


def materialize(model: nn.Module, device: torch.device, *, arena: bool = True) -> None:
    """Give every ``meta`` parameter and buffer uninitialised storage on ``device``.

    Afterwards every module with an ``init_buffers(device)`` method is asked to
    recompute its buffers (rotary tables and the like).
    """
    entries = [e for e in _tensors(model) if e[1].device.type == "meta"]
    if device.type == "cpu" and arena and entries:
        # a 0-byte placeholder (GGUF keeps the blocks until post-processing) needs no memory, let alone a map
        for owners, tensor, is_param in (e for e in entries if e[1].numel() == 0):
            _assign(owners, tensor, _empty(tensor, device), is_param)
        entries = [e for e in entries if e[1].numel() > 0]
        if mapping_enabled():
            entries = _give_regions(entries)
        for group in _arena_groups(entries):
            _fill_arena(group)
    else:
        for owners, tensor, is_param in entries:
            _assign(owners, tensor, _empty(tensor, device), is_param)
    for module in model.modules():
        init = getattr(module, "init_buffers", None)
        if callable(init):
            init(device)


def _empty(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Uninitialised storage for the ``meta`` ``tensor`` on ``device``.

    Not ``torch.empty_like``: from a ``meta`` tensor it imports sympy and mpmath, a costly first import in a
    fresh process (benchmarks/RESULTS.md).
    """
    return torch.empty(tensor.shape, dtype=tensor.dtype, device=device)


def _post_processed(owners: list[tuple[nn.Module, str]]) -> bool:
    """Whether a quantize method that post-processes its layer owns the tensor (and so may drop it)."""

    for module, _ in owners:
        method = getattr(module, "quant_method", None)
        if isinstance(method, QuantizeMethodBase) and (
                type(method).process_weights_after_loading is not QuantizeMethodBase.process_weights_after_loading):
            return True
    return False


_Entry = tuple[list[tuple[nn.Module, str]], torch.Tensor, bool]


def _arena_groups(entries: list[_Entry]) -> list[list[_Entry]]:
    """The arenas' contents: the tensors kept as they are, then each post-processed layer's.

    Consecutive layers share an arena when there are more of them than
    :func:`~loader._map_budget.region_budget` allows maps for (a
    quantized mixture of experts can have tens of thousands of layers);
    modules are post-processed in this order, so such an arena is still
    released before the load ends.
    """
    kept: list[_Entry] = []
    layers: dict[int, list[_Entry]] = {}
    for entry in entries:
        if _post_processed(entry[0]):
            layers.setdefault(id(entry[0][0][0]), []).append(entry)
        else:
            kept.append(entry)
    groups = list(layers.values())
    per_arena = -(-len(groups) // max(1, region_budget())) if groups else 1
    merged = [[e for group in groups[i:i + per_arena] for e in group] for i in range(0, len(groups), per_arena)]
    return [kept, *merged]


def _fill_arena(entries: list[_Entry]) -> None:
    """Carve ``entries`` from one new arena, each on a cache line."""
    if not entries:
        return
    sizes = [t.numel() * t.element_size() for _, t, _ in entries]
    offsets, total = [], 0
    for size in sizes:
        offsets.append(total)
        total += (size + _ALIGN - 1) // _ALIGN * _ALIGN
    storage = _cpu_arena(total)
    for (owners, tensor, is_param), offset, size in zip(entries, offsets, sizes, strict=True):
        view = storage[offset:offset + size].view(tensor.dtype).view(tensor.shape)
        _assign(owners, tensor, view, is_param)


def _give_regions(entries: list[tuple[list[tuple[nn.Module, str]], torch.Tensor, bool]]
                  ) -> list[tuple[list[tuple[nn.Module, str]], torch.Tensor, bool]]:
    """Give the large tensors memory of their own (the largest first, within the budget); return the rest."""
    threshold = min_map_bytes()
    large = sorted((e for e in entries if e[1].numel() * e[1].element_size() >= threshold),
                   key=lambda e: e[1].numel() * e[1].element_size(), reverse=True)[:region_budget()]
    chosen = {id(e[1]) for e in large}
    for owners, tensor, is_param in large:
        _assign(owners, tensor, own_region(tensor.dtype, tuple(tensor.shape)), is_param)
    return [e for e in entries if id(e[1]) not in chosen]


def _assign(owners: list[tuple[nn.Module, str]], old: torch.Tensor, new: torch.Tensor, is_param: bool) -> None:
    """Put ``new`` wherever ``old`` was; a parameter keeps its attributes (``weight_loader``, ...)."""
    if is_param:
        param = nn.Parameter(new, requires_grad=old.requires_grad)
        param.__dict__.update(old.__dict__)
        if hasattr(new, "_loader_region"):  # memory of its own, which a checkpoint file may be mapped into
            param._loader_region = new._loader_region  # type: ignore[attr-defined]
        for module, name in owners:
            module._parameters[name] = param
    else:
        for module, name in owners:
            module._buffers[name] = new
