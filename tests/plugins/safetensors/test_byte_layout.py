"""``layout_of``: a narrowed view's bytes as one grid of equal segments."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from loader_plugin_safetensors.byte_layout import ByteLayout, layout_of


def _full(shape):
    return tuple((0, s) for s in shape)


def test_whole_tensor_is_one_range():
    assert layout_of(100, (4, 8), 2, _full((4, 8))) == ByteLayout(100, 64)


def test_dim0_narrow_is_one_range():
    assert layout_of(100, (4, 8), 2, ((1, 2), (0, 8))) == ByteLayout(100 + 16, 32)


def test_dim1_narrow_is_one_segment_per_row():
    assert layout_of(0, (4, 8), 2, ((0, 4), (2, 3))) == ByteLayout(4, 6, ((4, 16),))


def test_single_row_of_an_inner_narrow_is_one_range():
    assert layout_of(0, (4, 8), 2, ((2, 1), (2, 3))) == ByteLayout(2 * 16 + 4, 6)


def test_whole_middle_dims_merge_into_one_grid_axis():
    # (3, 4, 5) narrowed on the last dim: 12 rows of 2 elements, one regular stride
    assert layout_of(0, (3, 4, 5), 1, ((0, 3), (0, 4), (1, 2))) == ByteLayout(1, 2, ((12, 5),))


def test_narrowed_middle_dim_keeps_two_grid_axes():
    assert layout_of(0, (3, 4, 5), 1, ((0, 3), (1, 2), (0, 5))) == ByteLayout(5, 10, ((3, 20),))
    assert layout_of(0, (3, 4, 5), 1, ((0, 3), (1, 2), (1, 1))) == ByteLayout(6, 1, ((3, 20), (2, 5)))


def test_empty_view_has_no_bytes():
    layout = layout_of(7, (4, 8), 2, ((0, 0), (0, 8)))
    assert layout.nbytes == 0 and layout.end == layout.offset


def test_scalar():
    assert layout_of(9, (), 4, ()) == ByteLayout(9, 4)


@st.composite
def _views(draw):
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=4)))
    view = []
    for size in shape:
        start = draw(st.integers(0, size - 1))
        view.append((start, draw(st.integers(1, size - start))))
    return shape, tuple(view), draw(st.sampled_from([1, 2, 4]))


@settings(max_examples=150, deadline=None)
@given(_views())
def test_segments_enumerate_exactly_the_view_bytes(case):
    shape, view, itemsize = case
    numel = int(np.prod(shape))
    data = np.arange(numel * itemsize, dtype=np.int64).reshape(*shape, itemsize)
    expected = data[tuple(slice(s, s + n) for s, n in view)].reshape(-1)
    layout = layout_of(0, shape, itemsize, view)
    offsets = [layout.offset + sum(parts) for parts in itertools.product(
        *[range(0, count * stride, stride) for count, stride in layout.grid])]
    got = np.concatenate([np.arange(o, o + layout.segment) for o in offsets])
    assert np.array_equal(got, expected)
    assert layout.nbytes == expected.size
    assert layout.end == expected.max() + 1
