"""Attention against a naive softmax implementation: GQA, causal, sliding window, KV cache."""

from __future__ import annotations

import math

import pytest
import torch

from loader.layers import Attention, KVCache
from loader.layers.attention import attention_mask

masking_utils = pytest.importorskip("transformers.masking_utils")

HEADS, KV_HEADS, DIM = 4, 2, 8


def _hf_allowed(q_pos: int, kv_pos: int, window: int | None) -> bool:
    fn = (masking_utils.causal_mask_function if window is None
          else masking_utils.sliding_window_causal_mask_function(window))
    return bool(fn(torch.tensor(0), torch.tensor(0), torch.tensor(q_pos), torch.tensor(kv_pos)))


def _naive(q, k, v, window=None, offset=0, scale=None):
    """Loop-free but obviously-correct attention with masks from transformers' own mask functions."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    scale = scale if scale is not None else 1 / math.sqrt(q.shape[-1])
    scores = (q.double() @ k.double().transpose(-1, -2)) * scale
    allowed = torch.tensor([[_hf_allowed(offset + i, j, window) for j in range(k.shape[2])]
                            for i in range(q.shape[2])])
    scores = scores.masked_fill(~allowed, float("-inf"))
    out = scores.softmax(-1) @ v.double()
    b, h, s, d = out.shape
    return out.transpose(1, 2).reshape(b, s, h * d).float()


def _qkv(seq, batch=2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, HEADS, seq, DIM, generator=gen),
            torch.randn(batch, KV_HEADS, seq, DIM, generator=gen),
            torch.randn(batch, KV_HEADS, seq, DIM, generator=gen))


@pytest.mark.parametrize("window", [None, 3, 16])
def test_full_sequence_matches_naive(window):
    q, k, v = _qkv(7)
    out = Attention(HEADS, DIM, KV_HEADS, sliding_window=window)(q, k, v)
    assert out.shape == (2, 7, HEADS * DIM)
    torch.testing.assert_close(out, _naive(q, k, v, window), rtol=1e-5, atol=1e-5)


def test_sliding_window_differs_from_causal():
    q, k, v = _qkv(7)
    full = Attention(HEADS, DIM, KV_HEADS)(q, k, v)
    windowed = Attention(HEADS, DIM, KV_HEADS, sliding_window=3)(q, k, v)
    torch.testing.assert_close(full[:, :3], windowed[:, :3])  # the window does not cut yet
    assert not torch.allclose(full[:, 3:], windowed[:, 3:], atol=1e-3)


def test_custom_scaling_and_multi_query():
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(1, 4, 5, DIM, generator=gen)
    k, v = torch.randn(1, 1, 5, DIM, generator=gen), torch.randn(1, 1, 5, DIM, generator=gen)
    out = Attention(4, DIM, 1, scaling=0.5)(q, k, v)
    torch.testing.assert_close(out, _naive(q, k, v, scale=0.5), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("window", [None, 3])
def test_incremental_decoding_equals_full_pass(window):
    q, k, v = _qkv(10)
    attn = [Attention(HEADS, DIM, KV_HEADS, sliding_window=window, layer_idx=i) for i in range(2)]
    full = attn[0](q, k, v)
    cache = KVCache(2)
    pieces, start = [], 0
    for step in (5, 1, 1, 2, 1):  # a prompt, single decode steps and a two-token chunk
        sl = slice(start, start + step)
        assert cache.seq_len == start
        pieces.append(attn[0](q[:, :, sl], k[:, :, sl], v[:, :, sl], cache))
        attn[1](q[:, :, sl], k[:, :, sl], v[:, :, sl], cache)
        start += step
    assert cache.seq_len == 10 and cache.layer_len(1) == 10
    torch.testing.assert_close(torch.cat(pieces, 1), full, rtol=1e-5, atol=1e-5)
    # chunks are checked against the naive reference with their absolute offsets too
    torch.testing.assert_close(pieces[3], _naive(q[:, :, 7:9], k[:, :, :9], v[:, :, :9], window, offset=7),
                               rtol=1e-5, atol=1e-5)


def test_cache_keeps_layers_apart_and_resets():
    cache = KVCache(3)
    k = torch.zeros(1, 2, 4, 8)
    all_k, _ = cache.update(2, k, k)
    assert all_k.shape[-2] == 4 and cache.seq_len == 0 and cache.layer_len(2) == 4
    all_k, _ = cache.update(2, k[:, :, :1], k[:, :, :1])
    assert all_k.shape[-2] == 5
    cache.reset()
    assert cache.layer_len(2) == 0


@pytest.mark.parametrize("window", [None, 1, 2, 5])
def test_mask_matches_transformers_semantics(window):
    mask = attention_mask(3, 8, window, torch.device("cpu"))
    expected = torch.tensor([[_hf_allowed(5 + i, j, window) for j in range(8)] for i in range(3)])
    assert torch.equal(mask, expected)


def test_bad_head_counts_are_rejected():
    with pytest.raises(ValueError, match="num_heads=6 is not a multiple of num_kv_heads=4"):
        Attention(6, DIM, 4)
    with pytest.raises(ValueError, match="sliding_window must be positive"):
        Attention(4, DIM, 2, sliding_window=0)
