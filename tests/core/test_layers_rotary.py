"""Rotary embedding against transformers' Llama rotary module, for every supported scaling."""

from __future__ import annotations

import pytest
import torch

from loader.errors import UnsupportedError
from loader.layers import get_rope

transformers = pytest.importorskip("transformers")
from transformers.models.llama.modeling_llama import (  # noqa: E402
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

HEAD_DIM, MAX_POS, THETA = 16, 32, 500.0

SCALINGS = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8},
}


def _reference(scaling):
    params = {"rope_type": "default", **(scaling or {}), "rope_theta": THETA}
    config = transformers.LlamaConfig(hidden_size=HEAD_DIM * 2, num_attention_heads=2, head_dim=HEAD_DIM,
                                      max_position_embeddings=MAX_POS, rope_parameters=params)
    return LlamaRotaryEmbedding(config)


def _qk(seq, dtype=torch.float32, batch=2):
    gen = torch.Generator().manual_seed(seq)
    q = torch.randn(batch, 4, seq, HEAD_DIM, generator=gen).to(dtype)
    k = torch.randn(batch, 2, seq, HEAD_DIM, generator=gen).to(dtype)
    return q, k


def _hf_apply(ref, positions, q, k):
    cos, sin = ref(q, positions)
    return apply_rotary_pos_emb(q, k, cos, sin)


@pytest.mark.parametrize("kind", list(SCALINGS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_transformers(kind, dtype):
    rope = get_rope(HEAD_DIM, MAX_POS, THETA, SCALINGS[kind])
    ref = _reference(SCALINGS[kind])
    q, k = _qk(12, dtype)
    positions = torch.arange(5, 17).expand(2, -1)
    ours, theirs = rope(positions, q, k), _hf_apply(ref, positions, q, k)
    for a, b in zip(ours, theirs, strict=True):
        assert a.dtype == dtype
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6 if dtype == torch.float32 else 0)


def test_scaling_changes_the_result():
    q, k = _qk(4)
    positions = torch.arange(20, 24).expand(2, -1)
    plain = get_rope(HEAD_DIM, MAX_POS, THETA, None)(positions, q, k)[0]
    for kind in ("linear", "llama3"):
        scaled = get_rope(HEAD_DIM, MAX_POS, THETA, SCALINGS[kind])(positions, q, k)[0]
        assert not torch.allclose(plain, scaled, atol=1e-3), kind


def test_dynamic_ntk_grows_and_resets_like_transformers():
    rope = get_rope(HEAD_DIM, MAX_POS, THETA, SCALINGS["dynamic"])
    ref = _reference(SCALINGS["dynamic"])
    plain = get_rope(HEAD_DIM, MAX_POS, THETA, None)
    # within range, beyond it (recomputed), one decode step further, back to a short prompt (reset)
    steps = [torch.arange(0, 10), torch.arange(0, 48), torch.arange(48, 49), torch.arange(0, 6)]
    for i, pos in enumerate(steps):
        positions = pos.expand(1, -1)
        q, k = _qk(len(pos), batch=1)
        ours, theirs = rope(positions, q, k), _hf_apply(ref, positions, q, k)
        torch.testing.assert_close(ours[0], theirs[0], rtol=0, atol=1e-6)
        torch.testing.assert_close(ours[1], theirs[1], rtol=0, atol=1e-6)
        same_as_plain = torch.allclose(ours[0], plain(positions, q, k)[0], atol=1e-6)
        assert same_as_plain == (i in (0, 3)), i


def test_legacy_type_key_and_one_dimensional_positions():
    legacy = get_rope(HEAD_DIM, MAX_POS, THETA, {"type": "linear", "factor": 4.0})
    modern = get_rope(HEAD_DIM, MAX_POS, THETA, SCALINGS["linear"])
    q, k = _qk(6, batch=1)
    pos = torch.arange(6)
    torch.testing.assert_close(legacy(pos, q, k)[0], modern(pos[None], q, k)[0], rtol=0, atol=0)
    assert legacy.scaling_type == "linear"
    explicit_default = get_rope(HEAD_DIM, MAX_POS, THETA, {"rope_type": "default", "rope_theta": 1.0})
    assert explicit_default.scaling_type == "default" and explicit_default.base == THETA


def test_partial_rotary_leaves_the_tail_alone():
    rope = get_rope(HEAD_DIM, MAX_POS, THETA, None, partial_rotary_factor=0.5)
    narrow = get_rope(HEAD_DIM // 2, MAX_POS, THETA, None)
    assert rope.rotary_dim == HEAD_DIM // 2
    q, k = _qk(5)
    pos = torch.arange(3, 8)
    out_q, _ = rope(pos, q, k)
    torch.testing.assert_close(out_q[..., HEAD_DIM // 2:], q[..., HEAD_DIM // 2:], rtol=0, atol=0)
    expect_q, _ = narrow(pos, q[..., : HEAD_DIM // 2].contiguous(), k[..., : HEAD_DIM // 2].contiguous())
    torch.testing.assert_close(out_q[..., : HEAD_DIM // 2], expect_q, rtol=0, atol=0)
    assert get_rope(HEAD_DIM, MAX_POS, THETA, None, rotary_dim=4).rotary_dim == 4


def test_built_on_meta_device_then_used_on_cpu():
    with torch.device("meta"):
        rope = get_rope(HEAD_DIM, MAX_POS, THETA, SCALINGS["llama3"])
    rope.init_buffers(torch.device("cpu"))
    q, k = _qk(3)
    pos = torch.arange(3).expand(2, -1)
    ours = rope(pos, q, k)
    torch.testing.assert_close(ours[0], _hf_apply(_reference(SCALINGS["llama3"]), pos, q, k)[0],
                               rtol=0, atol=1e-6)


def test_unknown_scaling_type_is_named():
    with pytest.raises(UnsupportedError, match=r"rope_scaling type 'longrope' is not supported"):
        get_rope(HEAD_DIM, MAX_POS, THETA, {"rope_type": "longrope", "factor": 2.0})


def test_missing_scaling_fields_are_named():
    with pytest.raises(UnsupportedError, match=r"'llama3' lacks low_freq_factor, high_freq_factor"):
        get_rope(HEAD_DIM, MAX_POS, THETA, {"rope_type": "llama3", "factor": 8.0,
                                            "original_max_position_embeddings": 8})


def _rotate_half_reference(rope, positions, x):  # type: ignore[no-untyped-def]
    """The rotation as written before tables were shared: ``x * cos + rotate_half(x) * sin``."""
    cos, sin = rope.cos_sin(positions, x.dtype)
    if positions.ndim == 2:
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    rot, rest = x[..., :rope.rotary_dim], x[..., rope.rotary_dim:]
    half = rope.rotary_dim // 2
    rotated = torch.cat((-rot[..., half:], rot[..., :half]), dim=-1)
    return torch.cat(((rot * cos) + (rotated * sin), rest), dim=-1)


@pytest.mark.parametrize("rotary_dim", [HEAD_DIM, HEAD_DIM // 2])
@pytest.mark.parametrize("scaling", list(SCALINGS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotation_is_bit_equal_to_rotate_half(rotary_dim, scaling, dtype):  # type: ignore[no-untyped-def]
    rope = get_rope(HEAD_DIM, MAX_POS, THETA, SCALINGS[scaling], rotary_dim=rotary_dim)
    gen = torch.Generator().manual_seed(5)
    for positions in (torch.arange(7), torch.arange(3, 5).unsqueeze(0), torch.tensor([40])):
        q = torch.randn(1, 3, positions.shape[-1], HEAD_DIM, generator=gen).to(dtype)
        k = torch.randn(1, 1, positions.shape[-1], HEAD_DIM, generator=gen).to(dtype)
        ours_q, ours_k = rope(positions, q, k)
        assert torch.equal(ours_q, _rotate_half_reference(rope, positions, q))
        assert torch.equal(ours_k, _rotate_half_reference(rope, positions, k))
        # q and k heads stacked (how a decoder without q/k norms rotates them): the same values, bit for bit
        stacked = rope.rotate(positions, torch.cat((q, k), dim=1))
        assert torch.equal(stacked, torch.cat((ours_q, ours_k), dim=1))


def test_layers_share_tables_only_with_equal_settings():
    positions = torch.arange(4)
    q = torch.randn(1, 2, 4, HEAD_DIM)
    first, same, other = (get_rope(HEAD_DIM, MAX_POS, base, None) for base in (THETA, THETA, 10000.0))
    a, _ = first(positions, q, q)
    b, _ = same(positions, q, q)
    c, _ = other(positions, q, q)  # same positions tensor, different base: must not reuse the tables
    assert torch.equal(a, b)
    assert torch.equal(c, _rotate_half_reference(other, positions, q))
    assert not torch.equal(a, c)
    later = torch.arange(4, 8)  # a new positions tensor (the next forward) is never served old tables
    d, _ = same(later, q, q)
    assert torch.equal(d, _rotate_half_reference(same, later, q))
