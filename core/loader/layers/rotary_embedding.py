"""Rotary position embedding in the half-split (GPT-NeoX) layout, with Llama 3, linear and NTK scaling.

Numerics follow ``transformers``: inverse frequencies in float32, angles as
``position * inv_freq`` in float32, cos/sin cast to the query's dtype before
rotating. Nothing is precomputed in ``__init__`` (models are built on the
``meta`` device); the frequencies are computed on first use for each device.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError, UnsupportedError

__all__ = ["ROPE_SCALING_FIELDS", "RotaryEmbedding", "get_rope"]

ROPE_SCALING_FIELDS: dict[str, tuple[str, ...]] = {
    "default": (),
    "linear": ("factor",),
    "dynamic": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
}
"""The scaling types :func:`get_rope` implements, each with the fields its mapping must hold."""


def _default_inv_freq(base: float, dim: int, device: torch.device | None = None) -> torch.Tensor:
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim
    return 1.0 / (base**exponents)


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: Mapping[str, Any]) -> torch.Tensor:
    """Llama 3.1's frequency-dependent interpolation: long wavelengths / factor, short ones kept."""
    factor = float(scaling["factor"])
    low = float(scaling["low_freq_factor"])
    high = float(scaling["high_freq_factor"])
    old_context = float(scaling["original_max_position_embeddings"])
    low_freq_wavelen = old_context / low
    high_freq_wavelen = old_context / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


_SHARED_TABLES: dict[tuple[object, ...], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
"""Per rotary setting and dtype: the last positions tensor rotated by, its cos and signed sin. The static
frequencies depend on the settings alone, so modules with equal settings may share them."""


class RotaryEmbedding(nn.Module):
    """Rotates the first ``rotary_dim`` features of each q/k head by position.

    ``forward(positions, q, k)`` takes ``q``/``k`` as ``[batch, heads, seq,
    head_size]`` and ``positions`` as ``[batch, seq]`` or ``[seq]``.
    ``scaling_type`` is one of ``default``, ``linear``, ``dynamic``, ``llama3``.
    """

    def __init__(
        self,
        head_size: int,
        rotary_dim: int,
        max_position: int,
        base: float,
        scaling_type: str = "default",
        scaling: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if rotary_dim % 2 or not 0 < rotary_dim <= head_size:
            raise UnsupportedError(f"rotary_dim={rotary_dim} must be even and within head_dim={head_size}")
        self.head_size = head_size
        self.rotary_dim = rotary_dim
        self.max_position = max_position
        self.base = float(base)
        self.scaling_type = scaling_type
        self.scaling = dict(scaling or {})
        self._inv_freq: dict[torch.device, torch.Tensor] = {}
        # dynamic NTK state, as transformers keeps it: grows past max_position, resets below it
        self._max_seq_len_cached = max_position

    def init_buffers(self, device: torch.device | str) -> None:
        """Forget computed frequencies (called by the pipeline after materializing the model)."""
        self._inv_freq.clear()
        self._max_seq_len_cached = self.max_position

    def _static_inv_freq(self, device: torch.device) -> torch.Tensor:
        inv_freq = _default_inv_freq(self.base, self.rotary_dim, device)
        if self.scaling_type == "linear":
            inv_freq = inv_freq / float(self.scaling["factor"])
        elif self.scaling_type == "llama3":
            inv_freq = _llama3_inv_freq(inv_freq, self.scaling)
        return inv_freq

    def _dynamic_inv_freq(self, seq_len: torch.Tensor, device: torch.device) -> torch.Tensor:
        factor = float(self.scaling["factor"])
        seq_len = torch.maximum(seq_len, torch.tensor(self.max_position, dtype=seq_len.dtype, device=device))
        dim = self.rotary_dim
        base = self.base * ((factor * seq_len / self.max_position) - (factor - 1)) ** (dim / (dim - 2))
        exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim
        return 1.0 / (base**exponents)

    def inv_freq(self, device: torch.device, positions: torch.Tensor | None = None) -> torch.Tensor:
        """The float32 inverse frequencies for ``device`` (for dynamic NTK, for these positions)."""
        cached = self._inv_freq.get(device)
        if cached is None:
            cached = self._static_inv_freq(device)
            self._inv_freq[device] = cached
        if self.scaling_type != "dynamic" or positions is None or positions.numel() == 0:
            return cached
        seq_len = positions.max() + 1
        if int(seq_len) > self._max_seq_len_cached:
            cached = self._dynamic_inv_freq(seq_len.to(device), device)
            self._inv_freq[device] = cached
            self._max_seq_len_cached = int(seq_len)
        elif int(seq_len) < self.max_position < self._max_seq_len_cached:
            cached = self._static_inv_freq(device)
            self._inv_freq[device] = cached
            self._max_seq_len_cached = self.max_position
        return cached

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos``/``sin`` of shape ``positions.shape + (rotary_dim,)`` in ``dtype``."""
        inv_freq = self.inv_freq(positions.device, positions)
        freqs = positions[..., None].float() * inv_freq.to(device=positions.device, dtype=torch.float)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def _tables(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos`` and the half-negated ``sin`` for ``positions``, shared by the layers of one forward.

        Every decoder layer has its own rotary module but rotates by the same ``positions`` tensor, so the
        first layer's tables are kept (keyed on that very tensor object and this module's settings) and the
        others reuse them: per token this saves ~7 small ops in each layer. ``sin``'s first half is negated
        so that :meth:`_rotate` needs no ``rotate_half`` (``cat(-x2, x1) * sin`` is ``roll(x) * signed_sin``
        element for element: ``-x2 * s == x2 * -s`` exactly, so results are bit-equal). Dynamic NTK
        derives its frequencies from the positions and is never shared.
        """
        key = (self.head_size, self.rotary_dim, self.base, self.scaling_type, repr(sorted(self.scaling.items())),
               dtype)
        shared = _SHARED_TABLES.get(key) if self.scaling_type != "dynamic" else None
        if shared is not None and shared[0] is positions:
            return shared[1], shared[2]
        cos, sin = self.cos_sin(positions, dtype)
        half = self.rotary_dim // 2
        signed_sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
        if positions.ndim == 2:  # [batch, seq, d] -> [batch, 1, seq, d] to broadcast over heads
            cos, signed_sin = cos.unsqueeze(1), signed_sin.unsqueeze(1)
        if self.scaling_type != "dynamic":
            _SHARED_TABLES[key] = (positions, cos, signed_sin)
        return cos, signed_sin

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self._tables(positions, q.dtype)
        if k.dtype != q.dtype:
            return self._rotate(q, cos, sin), self._rotate(k, *self._tables(positions, k.dtype))
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin)

    def rotate(self, positions: torch.Tensor, heads: torch.Tensor) -> torch.Tensor:
        """One ``[batch, heads, seq, head_size]`` tensor rotated — q and k heads stacked, say: what
        :meth:`forward` does to each, in half the ops (every head rotates by the same tables)."""
        return self._rotate(heads, *self._tables(positions, heads.dtype))

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
        """``x * cos + rotate_half(x) * sin``, as ``x * cos + roll(x, half) * signed_sin``."""
        half = self.rotary_dim // 2
        if self.rotary_dim == self.head_size:
            return (x * cos) + (x.roll(half, dims=-1) * signed_sin)
        rot, rest = x[..., : self.rotary_dim], x[..., self.rotary_dim :]
        return torch.cat(((rot * cos) + (rot.roll(half, dims=-1) * signed_sin), rest), dim=-1)

    def extra_repr(self) -> str:
        return (
            f"head_size={self.head_size}, rotary_dim={self.rotary_dim}, base={self.base}, "
            f"scaling={self.scaling_type}"
        )


def get_rope(
    head_size: int,
    max_position: int,
    base: float,
    rope_scaling: Mapping[str, Any] | None,
    *,
    rotary_dim: int | None = None,
    partial_rotary_factor: float = 1.0,
) -> RotaryEmbedding:
    """The rotary embedding a config asks for.

    ``rope_scaling`` is the config's ``rope_scaling`` (or ``rope_parameters``)
    mapping; both ``rope_type`` and the legacy ``type`` key are read. The
    explicit ``base`` wins over any ``rope_theta`` inside the mapping.
    Raises :class:`~loader.errors.UnsupportedError` for scaling types other
    than default, linear, dynamic and llama3, and for missing fields.
    """
    scaling = dict(rope_scaling or {})
    scaling_type = str(scaling.get("rope_type", scaling.get("type", "default")) or "default")
    if scaling_type not in ROPE_SCALING_FIELDS:
        raise UnsupportedError(
            f"rope_scaling type {scaling_type!r} is not supported "
            f"(supported: {', '.join(ROPE_SCALING_FIELDS)})"
        )
    missing = [key for key in ROPE_SCALING_FIELDS[scaling_type] if key not in scaling]
    if missing:
        raise UnsupportedError(f"rope_scaling of type {scaling_type!r} lacks {', '.join(missing)}")
    if rotary_dim is None:
        factor = scaling.get("partial_rotary_factor", partial_rotary_factor)
        if isinstance(factor, bool) or not isinstance(factor, int | float) or not 0 < factor <= 1:
            # also NaN and Infinity, which json reads: int(head_size * inf) is a bare OverflowError
            raise ConfigError(f"rope_scaling field 'partial_rotary_factor' must be a number in (0, 1], "
                              f"found {factor!r}")
        rotary_dim = int(head_size * factor)
    return RotaryEmbedding(head_size, rotary_dim, max_position, base, scaling_type, scaling)
