"""Scaled dot-product attention with grouped KV heads, causal and sliding-window masks, and a KV cache.

This is the reference-quality attention the loader's models run on one
device (no paged cache, no varlen batches): enough to check logits against
``transformers`` and to generate greedily with a cache.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Attention", "KVCache"]


class KVCache:
    """Keys and values of every layer seen so far, ``[batch, kv_heads, seq, head_dim]`` each.

    One per generation: create it with ``KVCache(num_layers)`` and pass it to
    every forward; each layer's :class:`Attention` appends its step.

    Each layer's positions live in a buffer with room to spare (the first
    step's length rounded up to :attr:`BLOCK` positions, doubled when full), so
    a decode step writes its one position in place; ``keys``/``values`` hold
    views of the filled part. Appending by ``torch.cat`` copied the whole cache
    of every layer on every token.
    """

    BLOCK = 256

    def __init__(self, num_layers: int) -> None:
        self.num_layers = num_layers
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers
        self._buffers: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * num_layers

    def layer_len(self, layer_idx: int) -> int:
        """Positions already cached for ``layer_idx``."""
        k = self.keys[layer_idx]
        return 0 if k is None else int(k.shape[-2])

    @property
    def seq_len(self) -> int:
        """Positions already cached (of layer 0, which a forward fills first)."""
        return self.layer_len(0) if self.num_layers else 0

    def update(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append this step's ``k``/``v`` for ``layer_idx``; return all cached keys and values."""
        start = self.layer_len(layer_idx)
        end = start + int(k.shape[-2])
        key_buffer, value_buffer = self._room(layer_idx, k, v, start, end)
        key_buffer[..., start:end, :].copy_(k)
        value_buffer[..., start:end, :].copy_(v)
        k, v = key_buffer[..., :end, :], value_buffer[..., :end, :]
        self.keys[layer_idx], self.values[layer_idx] = k, v
        return k, v

    def _room(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor, start: int,
              end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's buffers, reallocated (keeping ``[:start]``) when they cannot take ``end`` positions."""
        buffers = self._buffers[layer_idx]
        if buffers is not None:
            key_buffer, value_buffer = buffers
            if (end <= key_buffer.shape[-2] and key_buffer.shape[:-2] == k.shape[:-2]
                    and value_buffer.shape[:-2] == v.shape[:-2] and key_buffer.dtype == k.dtype
                    and value_buffer.dtype == v.dtype and key_buffer.device == k.device):
                return key_buffer, value_buffer
        capacity = -(-end // self.BLOCK) * self.BLOCK
        if buffers is not None:
            capacity = max(capacity, 2 * buffers[0].shape[-2])
        key_buffer = k.new_empty((*k.shape[:-2], capacity, k.shape[-1]))
        value_buffer = v.new_empty((*v.shape[:-2], capacity, v.shape[-1]))
        old_k, old_v = self.keys[layer_idx], self.values[layer_idx]
        if start and old_k is not None and old_v is not None:
            key_buffer[..., :start, :].copy_(old_k)
            value_buffer[..., :start, :].copy_(old_v)
        self._buffers[layer_idx] = (key_buffer, value_buffer)
        return key_buffer, value_buffer

    def reset(self) -> None:
        """Forget everything (start a new sequence)."""
        self.keys = [None] * self.num_layers
        self.values = [None] * self.num_layers
        self._buffers = [None] * self.num_layers


def _fp8_rounded(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x`` rounded to what an FP8 E4M3 cache under ``scale`` stores: ``fp8(clamp(x / scale)) * scale``."""
    limit = torch.finfo(torch.float8_e4m3fn).max
    scaled = torch.clamp(x / scale.to(x.dtype), -limit, limit)
    return (scaled.to(torch.float8_e4m3fn).to(torch.float32) * scale).to(x.dtype)


def attention_mask(
    num_queries: int, num_keys: int, sliding_window: int | None, device: torch.device
) -> torch.Tensor:
    """Boolean ``[num_queries, num_keys]`` mask, True where a query may attend.

    Queries sit at the last ``num_queries`` positions of the ``num_keys``
    keys. A query at position ``p`` sees keys ``j <= p``, and with a sliding
    window only ``j > p - sliding_window`` (itself and the ``sliding_window - 1``
    before it), the rule ``transformers``' sliding-window masks use.
    """
    q_pos = torch.arange(num_keys - num_queries, num_keys, device=device).unsqueeze(-1)
    k_pos = torch.arange(num_keys, device=device).unsqueeze(0)
    allowed = k_pos <= q_pos
    if sliding_window is not None:
        allowed &= k_pos > q_pos - sliding_window
    return allowed


class Attention(nn.Module):
    """Multi-head attention over this rank's heads, rotary already applied.

    ``forward(q, k, v, cache=None)`` takes ``q`` ``[batch, num_heads, seq,
    head_dim]`` and ``k``/``v`` ``[batch, num_kv_heads, seq, head_dim]``;
    returns ``[batch, seq, num_heads * head_dim]``. With a cache the new
    queries are the positions after the cached ones.
    """

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        num_kv_heads: int,
        *,
        scaling: float | None = None,
        sliding_window: int | None = None,
        layer_idx: int = 0,
    ) -> None:
        super().__init__()
        if num_kv_heads <= 0 or num_heads % num_kv_heads:
            raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")
        if sliding_window is not None and sliding_window <= 0:
            raise ValueError(f"sliding_window must be positive, got {sliding_window}")
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.num_kv_heads = num_kv_heads
        self.scaling = scaling if scaling is not None else head_dim**-0.5
        self.sliding_window = sliding_window
        self.layer_idx = layer_idx
        self.kv_fp8 = False

    def set_kv_cache_scales(self, k_scale: float, v_scale: float) -> None:
        """Keep keys and values at FP8 (E4M3) precision under these per-tensor scales, as an FP8 KV cache does.

        A checkpoint calibrated for an FP8 KV cache (compressed-tensors ``kv_cache_scheme``) was evaluated with
        each new key and value rounded to ``fp8(x / scale) * scale`` before it is cached; the same rounding here
        gives the logits its producer measured. The cache keeps the rounded values in the model's dtype (the
        memory an FP8 cache saves is not taken). The scales are buffers ``k_scale``/``v_scale`` (float32).
        """
        for name, value in (("k_scale", k_scale), ("v_scale", v_scale)):
            if not value > 0 or value == float("inf"):
                raise ValueError(f"{name} must be a positive finite number, got {value!r}")
            self.register_buffer(name, torch.tensor(float(value), dtype=torch.float32))
        self.kv_fp8 = True

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: KVCache | None = None
    ) -> torch.Tensor:
        batch, _, num_queries, _ = q.shape
        if self.kv_fp8:
            k, v = _fp8_rounded(k, self.get_buffer("k_scale")), _fp8_rounded(v, self.get_buffer("v_scale"))
        if cache is not None:
            k, v = cache.update(self.layer_idx, k, v)
        num_keys = k.shape[-2]
        # SDPA reads each KV head for its group of query heads itself (the same sums, bit for bit, as
        # repeating K and V first, without the two copies per layer and step).
        gqa = self.num_heads != self.num_kv_heads
        window_cuts = self.sliding_window is not None and self.sliding_window < num_keys
        if num_queries == num_keys and not window_cuts:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=num_queries > 1, scale=self.scaling,
                                                 enable_gqa=gqa)
        elif num_queries == 1 and not window_cuts:
            out = F.scaled_dot_product_attention(q, k, v, scale=self.scaling, enable_gqa=gqa)
        else:
            mask = attention_mask(num_queries, num_keys, self.sliding_window, q.device)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scaling, enable_gqa=gqa)
        return out.transpose(1, 2).reshape(batch, num_queries, self.num_heads * self.head_dim)

    def extra_repr(self) -> str:
        return (
            f"heads={self.num_heads}, kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
            f"sliding_window={self.sliding_window}, layer={self.layer_idx}" + (", kv_cache=fp8" if self.kv_fp8 else "")
        )
