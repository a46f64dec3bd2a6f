"""The compiled packing helpers: the bytes torch's packing writes, built once per machine and cached, and a
named fallback to torch wherever they cannot be had."""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from loader.kernels import NativeRepack, native_repack, native_repack_unavailable_reason
from loader.kernels.int4_layout import pack_codes_bytes
from loader.kernels.native_packing import SOURCE, build_library

COMPILER = shutil.which("cc")
needs_compiler = pytest.mark.skipif(COMPILER is None, reason="no C compiler (cc) here")


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):  # type: ignore[no-untyped-def]
    """An empty cache folder and no helpers looked up yet in this process (restored afterwards)."""
    monkeypatch.setenv("LOADER_CACHE_DIR", str(tmp_path))
    native_repack.cache_clear()
    yield tmp_path
    native_repack.cache_clear()


@pytest.fixture(params=["default", "scalar"])
def helpers(request: pytest.FixtureRequest, tmp_path: Path) -> NativeRepack:
    """The helpers as this machine's compiler builds them, and the portable loops a compiler without SSE2 gets."""
    if COMPILER is None:
        pytest.skip("no C compiler (cc) here")
    target = tmp_path / f"{request.param}.so"
    defines = ("LOADER_REPACK_SCALAR",) if request.param == "scalar" else ()
    build_library(COMPILER, SOURCE.read_bytes(), target, defines)
    built = NativeRepack(ctypes.CDLL(str(target)), target)
    if request.param == "scalar":
        assert not built.simd
    return built


def _blocks(rows: int, groups: int, size: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 256, (rows, groups, size), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("block_n", [32, 64])
@pytest.mark.parametrize(("rows", "groups", "size", "lead"), [
    (64, 1, 18, 2),  # Q4_0 blocks: 18 bytes, so every other row starts at an odd address
    (128, 18, 20, 4),  # Q4_1, SmolLM2's K = 576
    (192, 5, 16, 0),  # bare codes, contiguous
])
def test_half_split_codes_pack_to_the_bytes_of_packing_the_unpacked_codes(helpers, block_n, rows, groups, size, lead):
    qs = _blocks(rows, groups, size, rows + groups)[:, :, lead:lead + 16]
    codes = torch.cat((qs & 0x0F, qs >> 4), dim=2).reshape(rows, groups * 32)
    out = torch.empty(rows * groups * 16, dtype=torch.uint8)
    helpers.int4pack_half_split(qs, block_n, out)
    assert torch.equal(out.view(rows, -1), pack_codes_bytes(codes, block_n))


@pytest.mark.parametrize("block_n", [32, 64])
@pytest.mark.parametrize(("rows", "groups", "size"), [(64, 2, 34), (128, 18, 34), (64, 3, 32)])
def test_int8_codes_split_into_the_two_planes_torch_packs(helpers, block_n, rows, groups, size):
    """High plane ``(c >> 4) + 8`` (arithmetic shift) over the low plane ``c & 15``, both in torch's layout."""
    codes = _blocks(rows, groups, size, rows * groups)[:, :, size - 32:]
    flat = codes.reshape(rows, groups * 32).view(torch.int8)
    high, low = ((flat >> 4) + 8).to(torch.uint8), (flat & 15).to(torch.uint8)
    out = torch.empty(2 * rows * groups * 16, dtype=torch.uint8)
    helpers.int8_planes(codes, block_n, out)
    assert torch.equal(out.view(2 * rows, -1), pack_codes_bytes(torch.cat((high, low)), block_n))


def _float16_fields(rows: int, groups: int, size: int) -> torch.Tensor:
    """Blocks whose float16 fields cover zero, -0, subnormals, the largest values, infinities and random bits."""
    blocks = _blocks(rows, groups, size, 5)
    specials = torch.tensor([0.0, -0.0, 6e-8, -6e-8, 3e-5, 65504.0, -65504.0, float("inf"), float("-inf"), 1.0,
                             -2.5, 0.1], dtype=torch.float16)
    halves = blocks[:, :, :4].contiguous().view(torch.float16)  # [rows, groups, 2]
    halves.view(-1)[: specials.numel()] = specials
    halves.view(-1)[-specials.numel():] = specials.flip(0)
    blocks[:, :, :4] = halves.view(torch.uint8)
    return blocks


@pytest.mark.parametrize("has_min", [False, True])
def test_scales_and_zeros_are_torch_s_float32_sums_rounded_to_bfloat16(helpers, has_min):
    rows, groups = 48, 7
    blocks = _float16_fields(rows, groups, 20)
    halves = blocks[:, :, :4].contiguous().view(torch.float16).to(torch.float32)  # [rows, groups, 2]
    d, m = halves[..., 0].t(), halves[..., 1].t()
    expected = torch.zeros(groups, rows + 16, 2, dtype=torch.bfloat16)
    expected[:, 16:, 0] = d.to(torch.bfloat16)
    expected[:, 16:, 1] = (m + 8 * d).to(torch.bfloat16) if has_min else 0
    out = torch.zeros(groups, rows + 16, 2, dtype=torch.bfloat16)
    helpers.q4_scales_bf16(blocks, has_min, out, 16)  # rows 16: of a fused layer's scales
    nan = expected.isnan()  # NaN fields (random bytes hold some) stay NaN; their bits differ between torch builds
    assert bool(nan.any()) and torch.equal(out.isnan(), nan)
    assert torch.equal(out.view(torch.int16)[~nan], expected.view(torch.int16)[~nan])


def _interleaved_order(rows: int, head_dim: int) -> torch.Tensor:
    """llama.cpp's q/k row interleave undone: each head's even rows, then its odd ones."""
    heads = torch.arange(rows).view(rows // head_dim, head_dim // 2, 2)
    return heads.transpose(1, 2).reshape(-1).contiguous()


@pytest.mark.parametrize("block_n", [32, 64])
@pytest.mark.parametrize("head_dim", [32, 64, 128])
def test_rows_in_another_order_pack_as_those_rows_copied_out_first(helpers, block_n, head_dim):
    """The row order is read in place (llama.cpp's interleaved q/k rows are not copied out before packing)."""
    blocks = _blocks(256, 18, 20, head_dim)
    order = _interleaved_order(256, head_dim)
    qs = blocks[:, :, 4:]
    in_place, copied = (torch.empty(256 * 18 * 16, dtype=torch.uint8) for _ in range(2))
    helpers.int4pack_half_split(qs, block_n, in_place, order)
    helpers.int4pack_half_split(qs.index_select(0, order), block_n, copied)
    assert torch.equal(in_place, copied)
    scales_in_place, scales_copied = (torch.zeros(18, 300, 2, dtype=torch.bfloat16) for _ in range(2))
    helpers.q4_scales_bf16(blocks, True, scales_in_place, 44, order)
    helpers.q4_scales_bf16(blocks.index_select(0, order), True, scales_copied, 44)
    assert torch.equal(scales_in_place.view(torch.int16), scales_copied.view(torch.int16))


def test_a_row_order_can_pick_some_of_the_stored_rows(helpers):
    """A tensor-parallel rank's q rows: a window of the stored rows, in its own order."""
    blocks = _blocks(96, 4, 20, 9)
    order = torch.arange(95, 31, -1)  # 64 of the 96 rows, last first
    out, expected = (torch.empty(64 * 4 * 16, dtype=torch.uint8) for _ in range(2))
    helpers.int4pack_half_split(blocks[:, :, 4:], 64, out, order)
    helpers.int4pack_half_split(blocks[:, :, 4:].index_select(0, order), 64, expected)
    assert torch.equal(out, expected)


def test_a_row_order_outside_the_stored_rows_is_refused_by_name(helpers):
    qs = torch.zeros(64, 2, 16, dtype=torch.uint8)
    out = torch.empty(64 * 2 * 16, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"a row order indexes rows 1\.\.64 of 64 stored rows"):
        helpers.int4pack_half_split(qs, 64, out, torch.arange(1, 65))
    with pytest.raises(ValueError, match=r"a row order indexes rows -1\.\.62 of 64 stored rows"):
        helpers.q4_scales_bf16(torch.zeros(64, 2, 20, dtype=torch.uint8), True,
                               torch.zeros(2, 64, 2, dtype=torch.bfloat16), 0, torch.arange(-1, 63))
    with pytest.raises(ValueError, match=r"a row order must be contiguous int64 \[rows\] on the CPU, not torch.int32"):
        helpers.int4pack_half_split(qs, 64, out, torch.arange(64, dtype=torch.int32))


def test_what_the_helpers_refuse_is_named(helpers):
    qs = torch.zeros(64, 2, 16, dtype=torch.uint8)
    out = torch.empty(64 * 2 * 16, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"80 rows are not whole blocks of 64 rows \(one of \[32, 64\]\)"):
        helpers.int4pack_half_split(torch.zeros(80, 2, 16, dtype=torch.uint8), 64, out)
    with pytest.raises(ValueError, match=r"codes must be uint8 \[rows, groups, 16\] on the CPU, not torch.int32"):
        helpers.int4pack_half_split(qs.int(), 64, out)
    with pytest.raises(ValueError, match=r"are not groups of 32 contiguous bytes"):
        helpers.int8_planes(qs, 64, out)
    with pytest.raises(ValueError, match=r"the output must be 2048 contiguous uint8 bytes on the CPU, "
                                         r"not torch.uint8 \(100,\)"):
        helpers.int4pack_half_split(qs, 64, torch.empty(100, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"scales and zeros torch.float32 \(2, 64, 2\) cannot take 64 rows "
                                         r"of 2 groups"):
        helpers.q4_scales_bf16(torch.zeros(64, 2, 20, dtype=torch.uint8), True, torch.zeros(2, 64, 2), 0)
    with pytest.raises(ValueError, match=r"cannot take 64 rows of 2 groups at row 8"):
        helpers.q4_scales_bf16(torch.zeros(64, 2, 20, dtype=torch.uint8), True,
                               torch.zeros(2, 64, 2, dtype=torch.bfloat16), 8)


def _codes_of_words(words: torch.Tensor, along: str, shifts: tuple[int, ...]) -> torch.Tensor:
    """The codes ``[K, N]`` of int32 words, unpacked with int64 shifts (the reference for ``int4pack_words``)."""
    wide = words.to(torch.int64) & 0xFFFFFFFF
    by_shift = torch.stack([(wide >> shift) & 15 for shift in shifts], dim=-1)  # [rows, cols, 8]
    if along == "input":  # [K / 8, N, 8] -> [K, N]
        return by_shift.permute(0, 2, 1).reshape(-1, words.shape[1]).to(torch.uint8)
    return by_shift.reshape(words.shape[0], -1).to(torch.uint8)  # [K, N / 8, 8] -> [K, N]


@pytest.mark.parametrize("block_n", [32, 64])
@pytest.mark.parametrize("n", [16, 80, 208])  # no whole block, whole blocks and a tail, more of both
@pytest.mark.parametrize(("layout", "shifts"), [
    ("input", tuple(range(0, 32, 4))),  # GPTQ qweight [K / 8, N]
    ("input-transposed", tuple(range(0, 32, 4))),  # compressed-tensors weight_packed [N, K / 8], seen transposed
    ("output", (0, 16, 4, 20, 8, 24, 12, 28)),  # AWQ qweight [K, N / 8], its interleave
])
def test_int32_words_pack_to_the_bytes_of_packing_their_codes(helpers, block_n, n, layout, shifts):
    k = 64
    generator = torch.Generator().manual_seed(n + block_n)
    shape = (k // 8, n) if layout == "input" else (n, k // 8) if layout == "input-transposed" else (k, n // 8)
    words = torch.randint(-2**31, 2**31 - 1, shape, dtype=torch.int32, generator=generator)
    seen = words.t() if layout == "input-transposed" else words
    along = "output" if layout == "output" else "input"
    out = torch.empty(n * k // 2, dtype=torch.uint8)
    helpers.int4pack_words(seen, along, shifts, block_n, out)
    expected = pack_codes_bytes(_codes_of_words(seen, along, shifts).t(), block_n)
    assert torch.equal(out.view(n, k // 2), expected)


def test_what_the_word_packer_refuses_is_named(helpers):
    words = torch.zeros(8, 64, dtype=torch.int32)
    out = torch.empty(64 * 32, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"words must be int32 \[rows, columns\] on the CPU, not torch.int64"):
        helpers.int4pack_words(words.long(), "input", tuple(range(0, 32, 4)), 64, out)
    with pytest.raises(ValueError, match=r"codes lie along 'input' or 'output' at eight 4-bit shifts, not 'rows'"):
        helpers.int4pack_words(words, "rows", tuple(range(0, 32, 4)), 64, out)
    with pytest.raises(ValueError, match=r"words \(8, 40\) \(strides \(40, 1\)\) do not hold \[64, 40\] codes with N "
                                         r"a multiple of 16"):
        helpers.int4pack_words(torch.zeros(8, 40, dtype=torch.int32), "input", tuple(range(0, 32, 4)), 64, out)
    with pytest.raises(ValueError, match=r"the row block 16 is not one of \[32, 64\]"):
        helpers.int4pack_words(words, "input", tuple(range(0, 32, 4)), 16, out)
    with pytest.raises(ValueError, match=r"the output must be 2048 contiguous uint8 bytes"):
        helpers.int4pack_words(words, "input", tuple(range(0, 32, 4)), 64, out[:100])


@needs_compiler
def test_the_library_is_built_once_into_the_cache_folder_and_reused(fresh):
    first = native_repack()
    assert first is not None and native_repack_unavailable_reason() is None
    assert first.path.parent == fresh / "native" and first.path.is_file()
    built_at = first.path.stat().st_mtime_ns
    assert not [p for p in first.path.parent.iterdir() if p.name.startswith(".build-")]  # no scratch left behind
    native_repack.cache_clear()
    again = native_repack()
    assert again is not None and again.path == first.path and again.path.stat().st_mtime_ns == built_at


def test_switched_off_torch_packs_and_the_reason_says_so(fresh, monkeypatch):
    monkeypatch.setenv("LOADER_NATIVE_REPACK", "0")
    assert native_repack() is None
    assert native_repack_unavailable_reason() == "LOADER_NATIVE_REPACK=0"
    assert not (fresh / "native").exists()


def test_without_a_compiler_torch_packs_and_a_warning_names_it(fresh, monkeypatch, caplog):
    monkeypatch.setenv("CC", "no-such-compiler-here")
    with caplog.at_level(logging.WARNING, logger="loader.kernels.native_packing"):
        assert native_repack() is None
    assert native_repack_unavailable_reason() == "no C compiler (no-such-compiler-here) on PATH"
    assert "packing with torch only (slower loads): no C compiler (no-such-compiler-here) on PATH" in caplog.text


def test_a_compiler_that_fails_leaves_no_library_and_torch_packs(fresh, monkeypatch, tmp_path_factory, caplog):
    fake = tmp_path_factory.mktemp("bin") / "broken-cc"
    fake.write_text("#!/bin/sh\necho 'broken-cc: cannot compile' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    with caplog.at_level(logging.WARNING, logger="loader.kernels.native_packing"):
        assert native_repack() is None
    reason = native_repack_unavailable_reason()
    assert reason is not None and f"{fake} exited with 3: broken-cc: cannot compile" in reason
    assert not list((fresh / "native").glob("*.so"))
    assert "packing with torch only" in caplog.text


@needs_compiler
def test_a_damaged_cached_library_is_built_again(fresh):
    first = native_repack()
    assert first is not None
    first.path.unlink()  # as a crash or a full disk could leave it; this process keeps its loaded copy
    first.path.write_bytes(b"not a shared library")
    code = ("from loader.kernels import native_repack, native_repack_unavailable_reason as why; "
            "print(native_repack() is not None, why())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**os.environ, "LOADER_CACHE_DIR": str(fresh)})
    assert done.stdout.split() == ["True", "None"]
    assert first.path.read_bytes()[:4] == b"\x7fELF"


def test_a_cache_folder_that_cannot_be_written_leaves_torch_packing(fresh, monkeypatch):
    blocked = fresh / "not-a-folder"
    blocked.write_text("a file where the cache folder would go")
    monkeypatch.setenv("LOADER_CACHE_DIR", str(blocked))
    assert native_repack() is None
    reason = native_repack_unavailable_reason()
    assert reason is not None and reason.startswith("the native repack helpers could not be built or loaded: ")
