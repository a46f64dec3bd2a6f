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


def _cat_cache_reference(steps):  # type: ignore[no-untyped-def]
    """What appending with ``torch.cat`` (the cache before preallocation) holds after ``steps``."""
    k = torch.cat([s[0] for s in steps], dim=-2)
    v = torch.cat([s[1] for s in steps], dim=-2)
    return k, v


def test_cache_grows_past_its_buffer_and_keeps_every_position():
    cache = KVCache(1)
    gen = torch.Generator().manual_seed(3)
    steps = [(torch.randn(1, 2, n, 8, generator=gen), torch.randn(1, 2, n, 8, generator=gen))
             for n in (KVCache.BLOCK - 3, 1, 1, 1, 5, 1, KVCache.BLOCK + 7, 1)]
    capacities = []
    for i, (k, v) in enumerate(steps):
        all_k, all_v = cache.update(0, k, v)
        ref_k, ref_v = _cat_cache_reference(steps[:i + 1])
        assert torch.equal(all_k, ref_k) and torch.equal(all_v, ref_v)
        capacities.append(cache._buffers[0][0].shape[-2])  # type: ignore[index]
    assert capacities[0] == KVCache.BLOCK  # room for the decode steps after the prompt
    assert capacities[-1] >= cache.seq_len and len(set(capacities)) == 3  # doubled, then grown to fit


def test_cache_follows_a_new_dtype_and_batch():
    cache = KVCache(1)
    cache.update(0, torch.ones(1, 2, 3, 8), torch.ones(1, 2, 3, 8))
    all_k, _ = cache.update(0, torch.full((1, 2, 1, 8), 2.0, dtype=torch.float64),
                            torch.zeros(1, 2, 1, 8, dtype=torch.float64))
    assert all_k.dtype == torch.float64 and all_k[0, 0, :, 0].tolist() == [1.0, 1.0, 1.0, 2.0]


@pytest.mark.parametrize(("num_queries", "window"), [(6, None), (1, None), (2, None), (1, 3), (6, 3)])
def test_grouped_heads_are_bit_equal_to_repeated_kv(num_queries, window):
    """SDPA's own GQA (``enable_gqa``) gives exactly what repeating K/V to every query head gave."""
    import torch.nn.functional as F

    q, k, v = _qkv(6)
    q = q[:, :, -num_queries:]
    attn = Attention(HEADS, DIM, KV_HEADS, sliding_window=window)
    ours = attn(q, k, v)
    groups = HEADS // KV_HEADS
    rk, rv = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    if window is None and num_queries in (1, 6):
        ref = F.scaled_dot_product_attention(q, rk, rv, is_causal=num_queries > 1, scale=attn.scaling)
    else:
        mask = attention_mask(num_queries, 6, window, q.device)
        ref = F.scaled_dot_product_attention(q, rk, rv, attn_mask=mask, scale=attn.scaling)
    assert torch.equal(ours, ref.transpose(1, 2).reshape(ours.shape))


def test_fp8_kv_scales_round_keys_and_values_as_an_fp8_cache_stores_them():
    q, k, v = _qkv(6)
    attn = Attention(HEADS, DIM, KV_HEADS)
    attn.set_kv_cache_scales(0.01, 0.02)
    k8 = (k / 0.01).clamp(-448, 448).to(torch.float8_e4m3fn).float() * 0.01
    v8 = (v / 0.02).clamp(-448, 448).to(torch.float8_e4m3fn).float() * 0.02
    assert not torch.equal(k8, k)
    torch.testing.assert_close(attn(q, k, v), _naive(q, k8, v8), rtol=1e-5, atol=1e-5)
    assert float(attn.k_scale) == pytest.approx(0.01) and "kv_cache=fp8" in repr(attn)
    cache = KVCache(1)
    out = torch.cat([attn(q[:, :, i:i + 1], k[:, :, i:i + 1], v[:, :, i:i + 1], cache) for i in range(6)], dim=1)
    torch.testing.assert_close(cache.keys[0], k8)
    torch.testing.assert_close(out, attn(q, k, v), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scale", [0.0, -1.0, float("inf"), float("nan")])
def test_a_kv_scale_that_is_not_positive_and_finite_is_refused(scale):
    with pytest.raises(ValueError, match=rf"k_scale must be a positive finite number, got {scale}"):
        Attention(HEADS, DIM, KV_HEADS).set_kv_cache_scales(scale, 1.0)
