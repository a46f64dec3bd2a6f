"""Dequantization: bit-equal to gguf-py's numpy reference for every supported ggml type, any target dtype."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from loader_plugin_gguf.format.dequantize import SUPPORTED_TYPES, dequantize, dequantize_into
from tests.helpers.gguf_files import K_QUANTS, QUANTIZABLE, Q, encode, random_blocks

ROWS, COLS = 24, 512  # two K super-blocks per row; chunking is exercised via a patched chunk size


def stored(qtype: Q, seed: int = 0) -> np.ndarray:
    """``[ROWS, row_bytes]`` storage of ``qtype``: quantized normals, or valid random blocks for K-quants."""
    if qtype in K_QUANTS:
        block, _ = gguf.GGML_QUANT_SIZES[qtype]
        return random_blocks(qtype, ROWS * COLS // block, seed).reshape(ROWS, -1)
    values = np.random.default_rng(seed).standard_normal((ROWS, COLS)).astype(np.float32)
    return encode(values, qtype).view(np.uint8).reshape(ROWS, -1)


def reference(raw: np.ndarray, qtype: Q) -> np.ndarray:
    if qtype == Q.F16:
        return raw.view(np.float16).astype(np.float32)
    if qtype == Q.F32:
        return raw.view(np.float32)
    return gguf.quants.dequantize(raw, qtype).reshape(ROWS, COLS)


@pytest.mark.parametrize("qtype", [*QUANTIZABLE, *K_QUANTS], ids=lambda q: q.name)
def test_float32_values_are_bit_equal_to_gguf_py(qtype, monkeypatch):
    import loader_plugin_gguf.format.dequantize as module

    monkeypatch.setattr(module, "CHUNK_VALUES", 4096)  # several chunks per tensor
    raw = stored(qtype)
    got = dequantize(torch.from_numpy(raw.copy()), qtype, (ROWS, COLS), torch.float32)
    expected = reference(raw, qtype)
    assert got.dtype == torch.float32
    assert np.array_equal(got.numpy().view(np.uint32), expected.view(np.uint32))


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q6_K, Q.BF16], ids=lambda q: q.name)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_targets_round_the_float32_values(qtype, dtype):
    raw = torch.from_numpy(stored(qtype, seed=1).copy())
    full = dequantize(raw, qtype, (ROWS, COLS), torch.float32)
    out = torch.empty(ROWS, COLS, dtype=dtype)
    dequantize_into(raw, qtype, out)
    assert torch.equal(out, full.to(dtype))


def test_natural_dtype_of_float_types_is_the_stored_one():
    raw = torch.from_numpy(stored(Q.F16).copy())
    assert dequantize(raw, Q.F16, (ROWS, COLS)).dtype == torch.float16
    assert dequantize(torch.from_numpy(stored(Q.Q8_0).copy()), Q.Q8_0, (ROWS, COLS)).dtype == torch.float32


def test_supported_types_are_the_ones_the_issue_lists():
    assert set(SUPPORTED_TYPES) == {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                                    "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"}


def test_kernels_contain_no_per_block_python_loop(monkeypatch):
    """A tensor of many blocks costs a constant number of torch calls, not one per block."""
    import loader_plugin_gguf.format.kernels_legacy as legacy

    calls = 0
    original = legacy.half_at

    def counting(blocks, start):
        nonlocal calls
        calls += 1
        return original(blocks, start)

    monkeypatch.setattr(legacy, "half_at", counting)
    raw = torch.from_numpy(stored(Q.Q4_1).copy())  # 384 blocks, one chunk
    dequantize(raw, Q.Q4_1, (ROWS, COLS))
    assert calls == 2  # d and m, once each for the whole chunk
