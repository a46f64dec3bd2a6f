"""Hypothesis strategies shared by the fuzz harnesses: arbitrary JSON and hostile numbers and names."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

__all__ = ["EXTREME_INTS", "json_values", "path_like_names", "small_json"]

EXTREME_INTS = st.sampled_from([0, 1, -1, 2, 3, 7, 8, 31, 32, 64, 255, 256, 1 << 31, (1 << 32) - 1, 1 << 32,
                                (1 << 63) - 1, 1 << 63, (1 << 64) - 1, 1 << 64, 10**30, -(1 << 63)])
"""Boundaries of the integer widths file formats use, and just past them."""


def json_values(max_leaves: int = 8) -> st.SearchStrategy[Any]:
    """Any JSON value: scalars (including extreme integers and non-finite floats) and small containers."""
    scalars = (st.none() | st.booleans() | st.integers() | EXTREME_INTS
               | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12))
    return st.recursive(
        scalars,
        lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
        max_leaves=max_leaves,
    )


small_json = json_values(4)


def path_like_names() -> st.SearchStrategy[str]:
    """File names a hostile index could hold: traversal, absolute, odd bytes, very long."""
    return st.one_of(
        st.sampled_from(["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "",
                         ".", "..", "../outside.safetensors", "/etc/passwd", "sub/../model-00001-of-00002.safetensors",
                         "./model-00001-of-00002.safetensors", "a\x00b.safetensors", "link.safetensors",
                         "missing.safetensors", "dir", "\\..\\x", "~/x"]),
        st.text(min_size=1, max_size=20),
        st.builds(lambda n: "x" * n, st.integers(200, 5000)),
        st.builds(lambda parts: "/".join(parts), st.lists(st.sampled_from(["..", ".", "sub", "dir", "x"]),
                                                          min_size=1, max_size=6)),
    )
