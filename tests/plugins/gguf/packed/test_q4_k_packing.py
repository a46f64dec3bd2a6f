"""Q4_K super-blocks packed by the compiled helpers: the codes and scales the general torch path writes."""

from __future__ import annotations

import ctypes
import shutil

import pytest
import torch

import loader
from loader.kernels import NativeRepack, native_repack, pack_int4
from loader.kernels.native_packing import SOURCE, build_library
from loader_plugin_gguf.packed import q4_k_packing
from loader_plugin_gguf.packed.q4_blocks import Q, decode_q4
from tests.helpers.gguf_files import Q as GQ

COMPILER = shutil.which("cc")


@pytest.fixture(params=["default", "scalar"])
def helpers(request: pytest.FixtureRequest, tmp_path) -> NativeRepack:  # type: ignore[no-untyped-def]
    """The helpers as this machine's compiler builds them, and the portable loops a compiler without SSE2 gets."""
    if COMPILER is None:
        pytest.skip("no C compiler (cc) here")
    target = tmp_path / f"{request.param}.so"
    build_library(COMPILER, SOURCE.read_bytes(), target, ("LOADER_REPACK_SCALAR",) if request.param == "scalar" else ())
    return NativeRepack(ctypes.CDLL(str(target)), target)


def _q4_k_blocks(rows: int, superblocks: int, seed: int) -> torch.Tensor:
    """Random but valid Q4_K super-blocks ``[rows, superblocks, 144]``: finite float16 ``d``/``dmin`` (some
    subnormal), every other byte random."""
    generator = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (rows, superblocks, 144), dtype=torch.uint8, generator=generator)
    fields = torch.randn(rows, superblocks, 2, generator=generator) * torch.tensor([1e-2, 1e-3])
    fields[0, 0] = torch.tensor([3e-7, 2e-6])  # float16 subnormals
    blocks[:, :, :4] = fields.to(torch.float16).view(torch.uint8).reshape(rows, superblocks, 4)
    return blocks


def _reference(blocks: torch.Tensor, rows: torch.Tensor | None, dtype: torch.dtype, block_n: int):  # type: ignore[no-untyped-def]
    picked = blocks if rows is None else blocks[rows]
    decoded = decode_q4(picked.reshape(picked.shape[0], -1), Q.Q4_K)
    return pack_int4(decoded.codes, decoded.scales, decoded.biases, 32, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("block_n", [32, 64])
@pytest.mark.parametrize(("rows", "superblocks", "order"), [
    (64, 1, False), (128, 3, False), (128, 2, True),  # a row order: llama.cpp's q/k rows read in place
])
def test_q4_k_blocks_pack_to_the_general_path_s_codes_and_scales(helpers, monkeypatch, dtype, block_n, rows,
                                                                 superblocks, order):
    monkeypatch.setattr("loader.kernels.int4_cpu.torch_int4_block_n", lambda: block_n)
    blocks = _q4_k_blocks(rows, superblocks, rows + superblocks)[:, :, :]  # strided rows of a wider view below
    wide = torch.zeros(rows, superblocks + 1, 144, dtype=torch.uint8)
    wide[:, :superblocks] = blocks
    view = wide[:, :superblocks]
    row_order = torch.randperm(rows, generator=torch.Generator().manual_seed(1)) if order else None
    expected = _reference(blocks, row_order, dtype, block_n)
    data = torch.empty(rows * superblocks * 128, dtype=torch.uint8)
    helpers.int4pack_q4_k(view, block_n, data, row_order)
    assert torch.equal(data.view(rows, -1), expected.data)
    scales = torch.empty(superblocks * 8, rows + 16, 2, dtype=dtype)  # written at row 16 of a wider table
    helpers.q4_k_scales(view, scales, 16, row_order)
    assert torch.equal(scales[:, 16:], expected.scales_and_zeros)


def test_what_the_q4_k_helpers_refuse_is_named(helpers):
    blocks = _q4_k_blocks(64, 1, 0)
    with pytest.raises(ValueError, match=r"Q4_K blocks \(64, 1, 140\) \(strides \(144, 144, 1\)\) are not 144 "):
        helpers.int4pack_q4_k(blocks[:, :, :140], 64, torch.empty(64 * 128, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"scales and zeros torch.float16 \(8, 64, 2\) cannot take 64 rows of 8 "):
        helpers.q4_k_scales(blocks, torch.empty(8, 64, 2, dtype=torch.float16), 0)


def test_a_q4_k_load_packs_the_same_bytes_compiled_and_with_torch_alone(tiny_gguf, monkeypatch):
    """A whole model (fused q/k/v and gate/up of whole row blocks, q/k rows in llama.cpp's order): the layers the
    compiled path takes hold the bytes the torch-only load (``LOADER_NATIVE_REPACK=0``) packs."""
    if native_repack() is None:
        pytest.skip("no compiled packing helpers here")
    path, _ = tiny_gguf("llama", GQ.Q4_K, hidden_size=256, intermediate_size=512, num_attention_heads=4,
                        num_key_value_heads=4, vocab_size=320, tie_word_embeddings=False)
    taken = []
    real = q4_k_packing.pack_q4_k_parts

    def counting(parts, dtype):  # type: ignore[no-untyped-def]
        packed = real(parts, dtype)
        taken.append(packed is not None)
        return packed

    monkeypatch.setattr("loader_plugin_gguf.packed.linear_packing.pack_q4_k_parts", counting)
    compiled = {n: t.clone() for n, t in loader.load_model(str(path), quantization="gguf").state_dict().items()}
    assert any(taken)
    head = []
    monkeypatch.setattr("loader_plugin_gguf.packed.embedding_store.pack_q4_k_parts",
                        lambda parts, dtype: head.append(real(parts, dtype)) or head[-1])
    assert _same(loader.load_model(str(path), quantization="gguf").state_dict(), compiled)
    assert head and head[0] is not None  # the untied Q4_K head (320 rows) packed by the helpers too
    monkeypatch.setenv("LOADER_NATIVE_REPACK", "0")
    native_repack.cache_clear()
    try:
        alone = loader.load_model(str(path), quantization="gguf").state_dict()
    finally:
        native_repack.cache_clear()
    assert _same(alone, compiled)


def _same(got, expected) -> bool:  # type: ignore[no-untyped-def]
    assert got.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor), name
    return True
