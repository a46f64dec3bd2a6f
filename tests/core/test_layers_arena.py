"""The load's arena: packed buffers carved from shared huge-page chunks inside a CPU load, plain
``torch.empty`` everywhere else."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from loader.layers import LoadArena, arena_empty, load_arena
from loader.layers.arena import CHUNK_BYTES


def _base(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def test_outside_a_load_arena_empty_is_torch_empty():
    t = arena_empty((3, 5, 2), torch.bfloat16)
    assert t.shape == (3, 5, 2) and t.dtype == torch.bfloat16 and t.is_contiguous()
    assert t.untyped_storage().nbytes() == 3 * 5 * 2 * 2  # its own storage, no chunk behind it


def test_inside_a_load_buffers_share_a_chunk_64_byte_aligned_and_disjoint():
    with load_arena("cpu") as arena:
        assert isinstance(arena, LoadArena)
        a = arena_empty((1000,), torch.uint8)
        b = arena_empty((7, 3, 2), torch.bfloat16)
        c = arena_empty((5,), torch.float32)
    assert _base(a) == _base(b) == _base(c)
    assert a.untyped_storage().nbytes() >= CHUNK_BYTES
    assert all(t.data_ptr() % 64 == 0 for t in (a, b, c))
    assert a.data_ptr() + 1000 <= b.data_ptr() and b.data_ptr() + 84 <= c.data_ptr()
    a.fill_(1), b.fill_(2), c.fill_(3)
    assert int(a.sum()) == 1000 and float(b.float().sum()) == 84 and float(c.sum()) == 15
    assert arena.carved_bytes == 1000 + 84 + 20
    d = arena_empty((4,), torch.uint8)  # after the block: torch.empty again
    assert d.untyped_storage().nbytes() == 4


def test_a_request_over_half_a_chunk_gets_its_own_buffer_and_a_full_chunk_starts_another():
    arena = LoadArena(chunk_bytes=1 << 20)
    big = arena.empty((600 * 1024,), torch.uint8)
    first = arena.empty((400 * 1024,), torch.uint8)
    second = arena.empty((400 * 1024,), torch.uint8)
    third = arena.empty((400 * 1024,), torch.uint8)
    assert len({_base(big), _base(first)}) == 2
    assert _base(first) == _base(second) != _base(third)


def test_a_chunk_is_freed_when_the_last_tensor_carved_from_it_is():
    with load_arena() as arena:
        assert arena is not None
        t = arena_empty((64,), torch.uint8)
    chunk = t._base  # the chunk's whole mapping, which keeps the memory
    assert chunk is not None
    alive = weakref.ref(chunk)
    del t, chunk
    gc.collect()
    assert alive() is None


def test_other_devices_and_nested_arenas():
    with load_arena("meta") as arena:
        assert arena is None
        assert arena_empty((2,), torch.float32, "meta").device.type == "meta"
    with load_arena() as outer:
        with load_arena() as inner:
            assert inner is not outer
            arena_empty((8,), torch.uint8)
        arena_empty((8,), torch.uint8)
    assert outer is not None and inner is not None
    assert outer.carved_bytes == 8 and inner.carved_bytes == 8


@pytest.mark.parametrize("shape", [(0,), (3, 0)])
def test_empty_shapes(shape):
    with load_arena():
        assert arena_empty(shape, torch.float32).shape == shape
