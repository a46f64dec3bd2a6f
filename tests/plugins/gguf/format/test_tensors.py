"""GGUFTensor: lazy reads, narrowing before dequantization, byte accounting, refusals by name."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from loader.errors import ShapeMismatchError, UnsupportedError
from loader.weights import ReadStats, interleaved_to_half_rotary
from loader_plugin_gguf.format.header import read_header
from loader_plugin_gguf.format.tensors import GGUFTensor, MappedFile
from tests.helpers.gguf_files import Q, encode, random_blocks

ROWS, COLS = 16, 512


def _write_types(path: Path, alignment: int | None = None) -> dict[str, np.ndarray]:
    """One tensor per interesting type; each one's reference float32 values.

    With ``alignment`` 1, a 3-byte int8 tensor first puts every later tensor at an odd offset.
    """
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), "llama")
    expected: dict[str, np.ndarray] = {}
    if alignment is not None:
        writer.add_custom_alignment(alignment)
        writer.add_tensor("odd.byte", np.arange(3, dtype=np.int8))
        one_block = rng.standard_normal(32).astype(np.float32)
        writer.add_tensor("one_block.weight", gguf.quants.quantize(one_block, Q.Q8_0), raw_dtype=Q.Q8_0)
        expected["one_block.weight"] = gguf.quants.dequantize(gguf.quants.quantize(one_block, Q.Q8_0), Q.Q8_0)
    values = rng.standard_normal((ROWS, COLS)).astype(np.float32)
    for qtype in (Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q5_1, Q.Q8_0):
        data = encode(values, qtype)
        writer.add_tensor(f"{qtype.name}.weight", data, raw_dtype=None if qtype in (Q.F32, Q.F16) else qtype)
        expected[f"{qtype.name}.weight"] = gguf.quants.dequantize(data.view(np.uint8) if qtype != Q.F32 else data,
                                                                  qtype).reshape(ROWS, COLS)
    for qtype in (Q.Q4_K, Q.Q6_K, Q.IQ4_NL):
        block, _ = gguf.GGML_QUANT_SIZES[qtype]
        blocks = random_blocks(qtype, ROWS * COLS // block).reshape(ROWS, -1)
        writer.add_tensor(f"{qtype.name}.weight", blocks, raw_dtype=qtype)
        if qtype != Q.IQ4_NL:
            expected[f"{qtype.name}.weight"] = gguf.quants.dequantize(blocks, qtype).reshape(ROWS, COLS)
    writer.add_tensor("norm.weight", values[0].copy())
    expected["norm.weight"] = values[0].copy()
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory) -> tuple[Path, dict[str, np.ndarray]]:
    """A file with one tensor per interesting type, and each one's reference float32 values."""
    path = tmp_path_factory.mktemp("tensors") / "t.gguf"
    return path, _write_types(path)


def test_reads_at_odd_offsets_match_gguf_py(tmp_path):
    """``general.alignment`` 1: no tensor starts where a float view could; each is copied, every value equal."""
    path = tmp_path / "odd.gguf"
    expected = _write_types(path, alignment=1)
    header = read_header(path)
    assert {t.offset % 2 for t in header.tensors if t.name != "odd.byte"} == {1}
    for name, values in expected.items():
        for dtype in (torch.float32, torch.bfloat16):
            got = handle(path, name).read(dtype)
            assert torch.equal(got, torch.from_numpy(values.reshape(got.shape)).to(dtype)), (name, dtype)


def handle(path: Path, name: str, stats: ReadStats | None = None) -> GGUFTensor:
    header = read_header(path)
    info = next(t for t in header.tensors if t.name == name)
    return GGUFTensor(info, MappedFile(path), stats or ReadStats(), hf_name=f"hf.{name}")


@pytest.mark.parametrize("name", ["F32.weight", "F16.weight", "BF16.weight", "Q4_0.weight", "Q5_1.weight",
                                  "Q8_0.weight", "Q4_K.weight", "Q6_K.weight", "norm.weight"])
def test_read_matches_gguf_py(gguf_file, name):
    path, expected = gguf_file
    got = handle(path, name).read(torch.float32)
    assert np.array_equal(got.numpy(), expected[name])


@pytest.mark.parametrize("name", ["F16.weight", "Q4_0.weight", "Q6_K.weight"])
def test_rows_and_block_aligned_columns_narrow_before_reading(gguf_file, name):
    path, expected = gguf_file
    stats = ReadStats()
    full = handle(path, name, stats)
    block = 256 if "K" in name else (32 if name.startswith("Q") else 1)
    part = full.narrow(0, 4, 8).narrow(1, block, COLS - block)
    assert part.shape == (8, COLS - block)
    got = part.read(torch.float32)
    assert np.array_equal(got.numpy(), expected[name][4:12, block:])
    assert stats.bytes_read == part.nbytes
    assert part.nbytes == full.nbytes * 8 // ROWS * (COLS - block) // COLS
    assert stats.tensors_read == 1


def test_column_narrow_inside_blocks_reads_the_enclosing_blocks(gguf_file):
    path, expected = gguf_file
    stats = ReadStats()
    full = handle(path, "Q4_K.weight", stats)
    part = full.narrow(1, 100, 300).narrow(0, 3, 2)  # columns 100..399 span both super-blocks
    assert part.nbytes == full.nbytes * 2 // ROWS
    assert np.array_equal(part.read(torch.float32).numpy(), expected["Q4_K.weight"][3:5, 100:400])
    out = torch.empty(2, 300, dtype=torch.bfloat16)
    part.read_into(out)
    assert torch.equal(out, torch.from_numpy(expected["Q4_K.weight"][3:5, 100:400]).to(torch.bfloat16))
    assert stats.bytes_read == 2 * part.nbytes
    inner = handle(path, "Q4_0.weight").narrow(1, 40, 8)  # inside one 32-value block
    assert inner.nbytes == ROWS * 18
    assert np.array_equal(inner.read().numpy(), expected["Q4_0.weight"][:, 40:48])


def test_read_into_half_precision_and_strided_outputs(gguf_file):
    path, expected = gguf_file
    tensor = handle(path, "Q8_0.weight")
    out = torch.empty(ROWS, COLS, dtype=torch.bfloat16)
    tensor.read_into(out)
    assert torch.equal(out, torch.from_numpy(expected["Q8_0.weight"]).to(torch.bfloat16))
    strided = torch.empty(COLS, ROWS).t()
    tensor.read_into(strided)
    assert torch.equal(strided, torch.from_numpy(expected["Q8_0.weight"]))


def test_read_into_wrong_shape_names_the_tensor(gguf_file):
    path, _ = gguf_file
    with pytest.raises(ShapeMismatchError, match=r"tensor 'Q8_0\.weight' \(hf\.Q8_0\.weight\) in .*: "
                                                 r"expected shape \(3, 3\), found \(16, 512\)"):
        handle(path, "Q8_0.weight").read_into(torch.empty(3, 3))


def test_unsupported_type_is_refused_naming_tensor_and_type(gguf_file):
    path, _ = gguf_file
    with pytest.raises(UnsupportedError, match=r"tensor 'IQ4_NL\.weight' .* ggml type IQ4_NL cannot be "
                                               r"dequantized; supported: F32, F16, BF16, Q4_0"):
        handle(path, "IQ4_NL.weight").read()


def test_rotary_permutation_reads_only_the_narrowed_heads(gguf_file):
    path, expected = gguf_file
    stats = ReadStats()
    permuted = interleaved_to_half_rotary(handle(path, "Q8_0.weight", stats), n_heads=4)
    second_head = permuted.narrow(0, 4, 4).read(torch.float32)
    rows = expected["Q8_0.weight"][4:8]
    assert np.array_equal(second_head.numpy(), rows[[0, 2, 1, 3]])
    assert stats.bytes_read == handle(path, "Q8_0.weight").nbytes // 4


def test_nothing_is_read_until_asked(gguf_file):
    path, _ = gguf_file
    stats = ReadStats()
    tensor = handle(path, "Q4_0.weight", stats).narrow(0, 0, 2)
    assert (tensor.shape, tensor.dtype, stats.bytes_read) == ((2, COLS), torch.float32, 0)
    assert handle(path, "F16.weight").dtype == torch.float16


@pytest.mark.parametrize("name", ["Q5_1.weight", "Q4_K.weight", "Q6_K.weight", "BF16.weight"])
def test_non_cpu_destination_gets_packed_bytes_and_device_kernels(gguf_file, name):
    """On the meta device every kernel op runs shape-only: no CPU constant leaks into device kernels."""
    path, _ = gguf_file
    stats = ReadStats()
    out = torch.empty(8, COLS - 256, device="meta")
    handle(path, name, stats).narrow(0, 8, 8).narrow(1, 256, COLS - 256).read_into(out)
    assert stats.bytes_read == handle(path, name).nbytes // 4


@pytest.mark.parametrize("name", ["F32.weight", "F16.weight", "BF16.weight", "norm.weight"])
def test_file_span_of_float_rows_is_their_stored_bytes(gguf_file, name):
    path, _ = gguf_file
    full = handle(path, name)
    raw = path.read_bytes()
    rows = full if full.ndim == 1 else full.narrow(0, 4, 8)
    span = rows.file_span()
    assert span is not None and span.path == str(path)
    stored = torch.frombuffer(bytearray(raw[span.offset:span.offset + span.nbytes]), dtype=rows.dtype)
    assert torch.equal(stored.view(rows.shape), rows.read())


@pytest.mark.parametrize(("name", "narrow"), [("Q8_0.weight", False), ("Q4_K.weight", False),
                                              ("F16.weight", True)])
def test_blocks_and_column_windows_have_no_file_span(gguf_file, name, narrow):
    path, _ = gguf_file
    tensor = handle(path, name)
    assert (tensor.narrow(1, 0, COLS // 2) if narrow else tensor).file_span() is None
