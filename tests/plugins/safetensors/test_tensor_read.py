"""Reading ``SafetensorsTensor`` handles: bit-exact values, narrowing, conversion, byte counts, paths."""

from __future__ import annotations

import json
import os
import struct
import time

import pytest
import torch
from safetensors.torch import load_file, save_file

from loader.errors import CheckpointFormatError, ShapeMismatchError
from loader.io import fused_reads_available
from loader.weights import ReadStats
from loader_plugin_safetensors import open_checkpoint_file, parallel_read, tensor_read


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(_bits(a), _bits(b))


def _all_dtypes() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    base = torch.randn(5, 7, generator=g) * 50
    tensors = {
        "f64": base.double(), "f32": base, "f16": base.half(), "bf16": base.bfloat16(),
        "i64": base.long() * 1_000_003, "i32": base.int(), "i16": base.short(), "i8": base.to(torch.int8),
        "u8": torch.randint(0, 256, (5, 7), generator=g, dtype=torch.uint8), "bool": base > 0,
        "f8e4m3": base.to(torch.float8_e4m3fn), "f8e5m2": base.to(torch.float8_e5m2),
        "u16": torch.randint(0, 2**16, (5, 7), generator=g).to(torch.uint16),
        "u32": torch.randint(0, 2**31, (5, 7), generator=g).to(torch.uint32),
        "c64": torch.complex(base, -base),
        "scalar": torch.tensor(3.5), "empty": torch.zeros(0, 4),
        "vector": torch.arange(11, dtype=torch.int16),
        "nan": torch.tensor([float("nan"), float("inf"), -0.0]),
    }
    return tensors


@pytest.fixture(scope="module")
def all_dtypes_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("st") / "all.safetensors"
    save_file(_all_dtypes(), str(path))
    return path


def test_every_dtype_reads_bit_equal_to_safetensors(all_dtypes_file):
    expected = load_file(str(all_dtypes_file))
    stats = ReadStats()
    checkpoint = open_checkpoint_file(all_dtypes_file, stats)
    assert set(checkpoint.names()) == set(expected)
    for name, handle in checkpoint.tensors():
        assert handle.dtype == expected[name].dtype and handle.shape == tuple(expected[name].shape)
        assert _same(handle.read(), expected[name]), name
    assert stats.bytes_read == sum(t.numel() * t.element_size() for t in expected.values())
    assert stats.tensors_read == len(expected)


@pytest.fixture
def matrix_file(tmp_path):
    g = torch.Generator().manual_seed(1)
    tensors = {"w": torch.randn(64, 48, generator=g).bfloat16(),
               "cube": torch.randn(6, 10, 12, generator=g),
               "ids": torch.arange(60, dtype=torch.int64).view(6, 10)}
    path = tmp_path / "m.safetensors"
    save_file(tensors, str(path))
    return path, tensors


@pytest.mark.parametrize(("dim", "start", "length"), [(0, 16, 16), (1, 24, 24), (1, 0, 1), (0, 63, 1)])
def test_narrow_reads_only_the_narrowed_bytes(matrix_file, dim, start, length):
    path, tensors = matrix_file
    stats = ReadStats()
    handle = open_checkpoint_file(path, stats).tensor("w").narrow(dim, start, length)
    got = handle.read()
    assert _same(got, tensors["w"].narrow(dim, start, length))
    assert stats.bytes_read == got.numel() * 2 == handle.nbytes
    assert stats.tensors_read == 1


def test_narrows_compose_on_several_dims(matrix_file):
    path, tensors = matrix_file
    stats = ReadStats()
    handle = open_checkpoint_file(path, stats).tensor("cube").narrow(2, 3, 6).narrow(0, 1, 4).narrow(1, 2, 5)
    assert _same(handle.read(), tensors["cube"][1:5, 2:7, 3:9])
    assert stats.bytes_read == 4 * 5 * 6 * 4


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
@pytest.mark.parametrize("narrow", [None, (0, 8, 20), (1, 5, 30)])
@pytest.mark.parametrize("fused_reads", ["1", "0"], indirect=True)
def test_read_into_converts_dtype_bit_exactly(fused_reads, matrix_file, dtype, narrow):
    path, tensors = matrix_file
    handle = open_checkpoint_file(path).tensor("w")
    source = tensors["w"]
    if narrow is not None:
        handle, source = handle.narrow(*narrow), source.narrow(*narrow)
    out = torch.full(handle.shape, 7.0, dtype=dtype)
    handle.read_into(out)
    assert _same(out, source.to(dtype))
    assert _same(handle.read(dtype), source.to(dtype))


def test_read_into_a_strided_view_of_a_parameter(matrix_file):
    path, tensors = matrix_file
    param = torch.nn.Parameter(torch.zeros(48, 64, dtype=torch.bfloat16))
    handle = open_checkpoint_file(path).tensor("w")
    handle.read_into(param.t())  # a transposed view: not contiguous, same dtype
    assert _same(param.detach().t().contiguous(), tensors["w"])
    fused = torch.nn.Parameter(torch.zeros(70, 48, dtype=torch.bfloat16))
    handle.narrow(0, 0, 32).read_into(fused[5:37])  # a row slice of a fused parameter: contiguous
    assert _same(fused.detach()[5:37], tensors["w"][:32])
    assert fused.detach()[:5].abs().sum() == 0 and fused.detach()[37:].abs().sum() == 0


def test_read_into_checks_the_shape(matrix_file):
    path, _ = matrix_file
    handle = open_checkpoint_file(path).tensor("w")
    expected = r"tensor 'w' in .*m\.safetensors: expected shape \(48, 64\)"
    with pytest.raises(ShapeMismatchError, match=expected):
        handle.read_into(torch.empty(48, 64, dtype=torch.bfloat16))


def test_narrow_outside_the_tensor_is_refused(matrix_file):
    path, _ = matrix_file
    handle = open_checkpoint_file(path).tensor("w")
    expected = r"tensor 'w'.*slice \[60, 70\) is outside dim 0 of size 64"
    with pytest.raises(CheckpointFormatError, match=expected):
        handle.narrow(0, 60, 10)
    with pytest.raises(CheckpointFormatError, match="cannot narrow dim 2"):
        handle.narrow(2, 0, 1)


def test_missing_tensor_name(matrix_file):
    path, _ = matrix_file
    with pytest.raises(CheckpointFormatError, match=r"m\.safetensors: no tensor named 'nope'"):
        open_checkpoint_file(path).tensor("nope")


@pytest.fixture
def fused_reads(request, monkeypatch):
    """``LOADER_FUSED_READS``: "1" the compiled one-pass reads (where a compiler is), "0" the bounce buffers."""
    monkeypatch.setenv("LOADER_FUSED_READS", request.param)
    return request.param


@pytest.fixture
def small_thresholds(monkeypatch):
    """Shrink every size threshold so tiny tensors take the parallel, segmented and chunked paths."""
    monkeypatch.setattr(parallel_read, "PARALLEL_MIN_BYTES", 64)
    monkeypatch.setattr(parallel_read, "CHUNK_BYTES", 40)
    monkeypatch.setattr(parallel_read, "SEGMENT_PREAD_MIN_BYTES", 16)
    monkeypatch.setattr(tensor_read, "STAGING_CHUNK_BYTES", 100)


@pytest.mark.parametrize("threads", ["1", "2", "3"])
@pytest.mark.parametrize("narrow", [None, (0, 3, 50), (1, 4, 9), (1, 40, 3)])
@pytest.mark.parametrize("fused_reads", ["1", "0"], indirect=True)
def test_all_read_paths_agree(fused_reads, matrix_file, small_thresholds, monkeypatch, threads, narrow):
    """One contiguous range split over the pool, one pread per segment, the memory-map gather,
    and chunked conversion all give the same bits and count the same bytes."""
    monkeypatch.setenv("LOADER_READ_THREADS", threads)
    path, tensors = matrix_file
    stats = ReadStats()
    handle = open_checkpoint_file(path, stats).tensor("w")
    source = tensors["w"]
    if narrow is not None:
        handle, source = handle.narrow(*narrow), source.narrow(*narrow)
    assert _same(handle.read(), source)
    assert _same(handle.read(torch.float32), source.float())
    assert stats.bytes_read == 2 * handle.nbytes


def test_paths_are_the_ones_intended(matrix_file, small_thresholds):
    path, _ = matrix_file
    handle = open_checkpoint_file(path).tensor("w")
    assert handle.layout().contiguous and handle.nbytes > parallel_read.PARALLEL_MIN_BYTES
    wide = handle.narrow(1, 4, 9).layout()  # 18-byte segments: one pread each
    assert wide.segment >= parallel_read.SEGMENT_PREAD_MIN_BYTES and not wide.contiguous
    narrow = handle.narrow(1, 40, 3).layout()  # 6-byte segments: gathered
    assert narrow.segment < parallel_read.SEGMENT_PREAD_MIN_BYTES


@pytest.mark.skipif(not fused_reads_available(), reason="no C compiler here")
def test_widening_and_gathering_reads_take_the_compiled_one_pass_path(matrix_file, monkeypatch):
    """bf16 into a contiguous float32 destination: widened in C; short row slices: gathered in C; the
    setting turns both back to the bounce buffers."""
    calls: list[str] = []
    for module, name in ((tensor_read, "read_widening"), (parallel_read, "gather_rows")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _real=real, _name=name, **k: (calls.append(_name), _real(*a, **k)))
    path, tensors = matrix_file
    handle = open_checkpoint_file(path).tensor("w")
    assert _same(handle.read(torch.float32), tensors["w"].float())
    assert _same(handle.narrow(1, 40, 3).read(), tensors["w"][:, 40:43])
    assert calls == ["read_widening", "gather_rows"]
    assert _same(handle.read(torch.float64), tensors["w"].double())  # another width: the bounce buffer
    assert _same(handle.narrow(1, 40, 3).read(torch.float32), tensors["w"][:, 40:43].float())  # gather, convert
    monkeypatch.setenv("LOADER_FUSED_READS", "0")
    assert _same(handle.read(torch.float32), tensors["w"].float())
    assert _same(handle.narrow(1, 40, 3).read(), tensors["w"][:, 40:43])
    assert calls == ["read_widening", "gather_rows", "gather_rows"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("narrow", "segment_pread_min"), [
    (None, 1 << 20), ((1, 0, 2), 1 << 20), ((1, 0, 40), 1 << 20), ((1, 0, 40), 16)])
@pytest.mark.parametrize("fused_reads", ["1", "0"], indirect=True)
def test_truncated_after_the_header_was_read(fused_reads, matrix_file, monkeypatch, narrow, segment_pread_min, dtype):
    """Every path (pread, per-segment pread, map gather, map convert) reports truncation, no SIGBUS."""
    monkeypatch.setattr(parallel_read, "SEGMENT_PREAD_MIN_BYTES", segment_pread_min)
    path, _ = matrix_file
    handle = open_checkpoint_file(path).tensor("w")
    if narrow is not None:
        handle = handle.narrow(*narrow)
    layout = handle.layout()
    os.truncate(path, layout.end - 1)
    expected = r"m\.safetensors: tensor 'w': file ends at byte .* truncated"
    with pytest.raises(CheckpointFormatError, match=expected):
        handle.read(dtype)


def _misaligned_file(path, values: torch.Tensor):
    """A bf16 tensor whose data starts at an odd file offset (no writer does this; the format allows it)."""
    header = json.dumps({"w": {"dtype": "BF16", "shape": list(values.shape),
                               "data_offsets": [0, values.numel() * 2]}}).encode()
    if (8 + len(header)) % 2 == 0:
        header += b" "
    path.write_bytes(struct.pack("<Q", len(header)) + header + _bits(values).numpy().tobytes())
    return path


@pytest.mark.parametrize("narrow", [None, (0, 2, 5), (1, 3, 4)])
@pytest.mark.parametrize("fused_reads", ["1", "0"], indirect=True)
def test_misaligned_data_converts_through_chunked_staging(fused_reads, tmp_path, small_thresholds, narrow):
    values = torch.randn(9, 10, generator=torch.Generator().manual_seed(3)).bfloat16()
    stats = ReadStats()
    handle = open_checkpoint_file(_misaligned_file(tmp_path / "odd.safetensors", values), stats).tensor("w")
    assert handle.info.begin % 2 == 1
    if narrow is not None:
        handle, values = handle.narrow(*narrow), values.narrow(*narrow)
    assert _same(handle.read(torch.float32), values.float())
    assert _same(handle.read(), values)
    assert stats.bytes_read == 2 * handle.nbytes


def test_conversions_and_gathers_never_map_the_file(matrix_file, monkeypatch):
    """A map read past a file cut short by another process is a SIGBUS: reads go through positioned reads."""
    import mmap

    def no_map(*args, **kwargs):
        raise AssertionError("a read mapped the checkpoint file")

    monkeypatch.setattr(mmap, "mmap", no_map)
    monkeypatch.setattr(tensor_read, "BOUNCE_CHUNK_BYTES", 100)  # several chunks, double-buffered
    path, tensors = matrix_file
    checkpoint = open_checkpoint_file(path)
    out = torch.empty(6, 12, 5, dtype=torch.float64).transpose(1, 2)  # strided destination, other dtype
    checkpoint.tensor("cube").narrow(1, 2, 5).read_into(out)
    assert _same(out.contiguous(), tensors["cube"][:, 2:7].double())
    gathered = checkpoint.tensor("w").narrow(1, 8, 16).read()  # short segments: the gather path
    assert _same(gathered, tensors["w"][:, 8:24])
    converted = checkpoint.tensor("w").narrow(0, 3, 40).read(torch.float32)
    assert _same(converted, tensors["w"][3:43].float())


def test_huge_page_hint_keeps_contents():
    from loader_plugin_safetensors.memory_hints import MIN_HINT_BYTES, advise_huge_pages

    big = torch.arange(MIN_HINT_BYTES // 4 * 2, dtype=torch.int32)
    before = big.clone()
    assert isinstance(advise_huge_pages(big), bool)
    assert torch.equal(big, before)
    assert advise_huge_pages(torch.zeros(16)) is False
    assert advise_huge_pages(big.view(2, -1).t()) is False


def test_empty_and_scalar_tensors(all_dtypes_file):
    stats = ReadStats()
    checkpoint = open_checkpoint_file(all_dtypes_file, stats)
    assert checkpoint.tensor("empty").read().shape == (0, 4)
    out = torch.zeros((), dtype=torch.float64)
    checkpoint.tensor("scalar").read_into(out)
    assert out.item() == 3.5
    assert stats.bytes_read == 4 and stats.tensors_read == 2


def test_reads_reopen_and_close_the_file(matrix_file):
    path, tensors = matrix_file
    checkpoint = open_checkpoint_file(path)
    handle = checkpoint.tensor("ids")
    assert not handle.descriptor.is_open
    assert _same(handle.read(), tensors["ids"])
    assert not handle.descriptor.is_open
    with checkpoint:
        assert handle.descriptor.is_open
        assert _same(handle.narrow(1, 2, 3).read(), tensors["ids"][:, 2:5])
    assert not handle.descriptor.is_open


def test_a_forked_child_reads_with_its_own_pool(matrix_file, small_thresholds, monkeypatch):
    monkeypatch.setenv("LOADER_READ_THREADS", "2")
    path, tensors = matrix_file
    handle = open_checkpoint_file(path).tensor("w")
    assert _same(handle.read(), tensors["w"])  # the parent's pool now exists
    assert parallel_read.read_pool() is not None
    pid = os.fork()
    if pid == 0:  # child: a read that needs the pool must not wait on the parent's threads
        ok = False
        try:
            ok = _same(handle.read(), tensors["w"])
        finally:
            os._exit(0 if ok else 1)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail("the forked child hung reading through the parent's pool")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("narrow", [None, (0, 3, 50), (1, 4, 9)])
def test_read_into_cuda_through_pinned_double_buffers(matrix_file, small_thresholds, dtype, narrow):
    path, tensors = matrix_file
    stats = ReadStats()
    handle = open_checkpoint_file(path, stats).tensor("w")
    source = tensors["w"]
    if narrow is not None:
        handle, source = handle.narrow(*narrow), source.narrow(*narrow)
    out = torch.full(handle.shape, 5.0, dtype=dtype, device="cuda")
    handle.read_into(out)
    assert _same(out.cpu(), source.to(dtype))
    strided = torch.zeros(handle.shape[1], handle.shape[0], dtype=dtype, device="cuda").t()
    handle.read_into(strided)
    assert _same(strided.cpu().contiguous(), source.to(dtype))
    assert stats.bytes_read == 2 * handle.nbytes and stats.tensors_read == 2


def test_file_span_is_the_bytes_of_a_whole_tensor_or_a_leading_dim_narrow(matrix_file):
    path, tensors = matrix_file
    stats = ReadStats()
    handle = open_checkpoint_file(path, stats).tensor("cube")
    cube = tensors["cube"]
    raw = path.read_bytes()

    def span_bytes(span):
        return raw[span.offset:span.offset + span.nbytes]

    whole, rows = handle.file_span(), handle.narrow(0, 2, 3).file_span()
    one_row_part = handle.narrow(0, 2, 1).narrow(1, 4, 6).file_span()  # inside one dim-0 slice: still one run

    assert whole is not None and rows is not None and one_row_part is not None
    assert whole.path == str(path) and whole.stats is stats
    assert span_bytes(whole) == cube.numpy().tobytes()
    assert span_bytes(rows) == cube[2:5].numpy().tobytes()
    assert span_bytes(one_row_part) == cube[2:3, 4:10].numpy().tobytes()
    assert handle.narrow(1, 4, 6).file_span() is None  # rows of 6 out of 10: strided
    assert handle.narrow(2, 0, 6).file_span() is None
