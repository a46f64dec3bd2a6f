"""Fuzzing the GGUF reader end to end: damaged files parse, configure and stream, or raise a LoadError.

A second harness moves the tensor table (offsets onto each other, shifted, swapped; the
alignment's value and type) of files written with ``general.alignment`` 32 and 1: what is
accepted must be laid out as ggml's ``gguf_init`` requires and read, bit for bit, as
gguf-py's ``GGUFReader`` reads it.

A third harness starts from the seed corpus: llama.cpp's handcrafted files (every
``HANDCRAFTED_*`` kind of ``tests/test-gguf.cpp``, :mod:`tests.helpers.gguf_reference_files`),
bytes overwritten and the tail cut; the reader accepts a consistent table or raises.

Each example damages a valid tiny Llama GGUF: extreme values written into its
counts, lengths, value types, tensor ranks, dims, types and offsets; random
bytes anywhere in the header; truncation. Then the plugin's header reader, its
config builder and its weight stream (every tensor read) must either succeed
with a consistent result or raise a :class:`~loader.errors.LoadError`.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from loader.errors import CheckpointFormatError, LoadError
from loader.weights import ReadStats
from loader_plugin_gguf.format.config import hf_config
from loader_plugin_gguf.format.dequantize import is_supported
from loader_plugin_gguf.format.header import read_header
from loader_plugin_gguf.format.tensors import GGUFTensor, MappedFile
from loader_plugin_gguf.format.weight_stream import iter_gguf_weights
from tests.helpers.gguf_reference_files import Kind, write_handcrafted
from tests.helpers.malformed_gguf import field_offsets, metadata_value_offset, write_llama_gguf
from tests.reliability.conftest import FUZZ_PROFILE
from tests.reliability.fuzz_values import EXTREME_INTS

FUZZ = settings(parent=settings.get_profile(FUZZ_PROFILE))
_NAMES = itertools.count()


def _reads_or_refuses_by_name(folder: Path, blob: bytes, read: Callable[[Path], None]) -> None:
    """Write ``blob`` as a GGUF file and ``read`` it: it reads, or fails with a ``LoadError`` naming the file."""
    path = folder / f"damaged-{next(_NAMES)}.gguf"  # a new name: the header cache keys on the file
    path.write_bytes(blob)
    try:
        read(path)
        event("accepted and read")
    except LoadError as exc:
        event(f"refused: {type(exc).__name__}")
        assert str(path) in str(exc)
    finally:
        path.unlink()


@pytest.fixture(scope="module")
def valid(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes, list[tuple[int, int]], int]:
    """The scratch folder, a valid file's bytes, its fields as (offset, width), and where its data starts."""
    folder = tmp_path_factory.mktemp("fuzz-gguf")
    path = write_llama_gguf(folder / "valid.gguf", extra_metadata={"test.values": [1, 2, 3]})
    blob = path.read_bytes()
    header = read_header(path)
    fields = [(8, 8), (16, 8)]
    for key in header.metadata:
        at = metadata_value_offset(blob, key)
        fields += [(at - 8 - len(key.encode()), 8), (at, 4), (at + 4, 8), (at + 4, 4)]
    for tensor in header.tensors:
        where = field_offsets(blob, tensor.name)
        fields += [(where.name, 8), (where.n_dims, 4), (where.dims, 8), (where.ggml_type, 4),
                   (where.data_offset, 8)]
    return folder, blob, fields, header.data_start


@st.composite
def damage(draw: st.DrawFn, valid: tuple[Path, bytes, list[tuple[int, int]], int]) -> bytes:
    _, blob, fields, data_start = valid
    out = bytearray(blob)
    for _ in range(draw(st.integers(1, 3))):
        if draw(st.booleans()):
            at, width = draw(st.sampled_from(fields))
            value = draw(EXTREME_INTS | st.integers(0, 64)) % (1 << (8 * width))
            out[at:at + width] = value.to_bytes(width, "little")
        else:
            at = draw(st.integers(0, data_start - 1))
            raw = draw(st.binary(min_size=1, max_size=8))
            out[at:at + len(raw)] = raw
    if draw(st.integers(0, 4)) == 0:
        out = out[: draw(st.integers(0, len(out)))]
    return bytes(out)


def _read_everything(path: Path) -> None:
    header = read_header(path)
    for info in header.tensors:
        assert header.data_start <= info.offset and info.offset + info.nbytes <= header.file_size
    config = hf_config(header)
    assert isinstance(config["hidden_size"], int)
    for name, tensor in iter_gguf_weights([str(path)], ReadStats()):
        values = tensor.read()
        assert tuple(values.shape) == tuple(tensor.shape), name


@FUZZ
@given(st.data())
def test_damaged_gguf_reads_or_raises_load_error(valid, data: st.DataObject) -> None:
    folder = valid[0]
    _reads_or_refuses_by_name(folder, data.draw(damage(valid)), _read_everything)


def test_the_fuzz_base_reads_whole(valid) -> None:
    folder, blob, _, _ = valid
    path = folder / "base-copy.gguf"
    path.write_bytes(blob)
    _read_everything(path)
    assert struct.unpack_from("<Q", blob, 8)[0] == 2 + 9 * 2 + 1


def test_zero_length_dimension_moves_the_next_tensor_and_is_refused(valid) -> None:
    """A zero dimension is valid (ggml reads an empty tensor: test_reference_gguf.py), but zeroing one in a
    written file leaves the next tensor where the old size put it, which ggml's layout refuses."""
    folder, blob, _, _ = valid
    path = folder / "zero-dim.gguf"
    out = bytearray(blob)
    where = field_offsets(blob, "output_norm.weight")
    out[where.dims:where.dims + 8] = (0).to_bytes(8, "little")
    path.write_bytes(bytes(out))
    with pytest.raises(CheckpointFormatError, match=r"tensor 'output.weight' starts at data offset \d+; ggml requires"):
        dict(iter_gguf_weights([str(path)], ReadStats()))


# -- the tensor table: offsets and alignment, against gguf-py's reader --------------------------------------

TABLE_ALIGNMENTS = [0, 1, 2, 3, 4, 8, 16, 31, 32, 64, 128, 4096, 1 << 31, (1 << 32) - 1]


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[tuple[bytes, list[int], int]]]:
    """Valid files written with ``general.alignment`` 32 and 1: bytes, each tensor's offset field, the alignment's."""
    folder = tmp_path_factory.mktemp("fuzz-gguf-table")
    bases = []
    for alignment in (32, 1):
        path = write_llama_gguf(folder / f"aligned-{alignment}.gguf", alignment=alignment)
        blob = path.read_bytes()
        offsets = [field_offsets(blob, t.name).data_offset for t in read_header(path).tensors]
        bases.append((blob, offsets, metadata_value_offset(blob, "general.alignment")))
    return folder, bases


@st.composite
def moved_table(draw: st.DrawFn, bases: list[tuple[bytes, list[int], int]]) -> bytes:
    """Offsets moved onto each other, shifted, swapped; the alignment's value or type changed; the tail cut."""
    blob, fields, alignment_at = draw(st.sampled_from(bases))
    out = bytearray(blob)
    offset_of = [int.from_bytes(blob[at:at + 8], "little") for at in fields]
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["onto", "shift", "swap", "extreme", "alignment", "alignment-type"]))
        i, j = draw(st.integers(0, len(fields) - 1)), draw(st.integers(0, len(fields) - 1))
        if kind == "onto":
            value = offset_of[j]
        elif kind == "shift":
            value = max(0, offset_of[i] + draw(st.sampled_from([-64, -32, -4, -1, 1, 2, 4, 32, 64])))
        elif kind == "swap":
            value = offset_of[j]
            out[fields[j]:fields[j] + 8] = offset_of[i].to_bytes(8, "little")
        elif kind == "extreme":
            value = draw(EXTREME_INTS) % (1 << 64)
        if kind == "alignment":
            out[alignment_at + 4:alignment_at + 8] = draw(st.sampled_from(TABLE_ALIGNMENTS)).to_bytes(4, "little")
        elif kind == "alignment-type":
            out[alignment_at:alignment_at + 4] = draw(st.integers(0, 13)).to_bytes(4, "little")
        else:
            out[fields[i]:fields[i] + 8] = value.to_bytes(8, "little")
    if draw(st.integers(0, 5)) == 0:
        out = out[: len(out) - draw(st.integers(1, 64))]
    return bytes(out)


def _check_against_gguf_py(path: Path) -> None:
    """An accepted table is laid out as ggml requires, and every tensor reads as gguf-py's reader reads it."""
    import gguf

    header = read_header(path)
    alignment = int(header.metadata.get("general.alignment", 32))
    expected = header.data_start
    for info in header.tensors:
        assert info.offset == expected, info.name
        expected += -(-info.nbytes // alignment) * alignment
    reference = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
    stats = ReadStats()
    for info in header.tensors:
        assert reference[info.name].data_offset == info.offset, info.name
        got = GGUFTensor(info, MappedFile(path), stats).read()
        expected = np.ascontiguousarray(reference[info.name].data, dtype=np.float32)
        assert got.numpy().tobytes() == expected.tobytes(), info.name  # bit for bit: shifted bytes can be NaN


@FUZZ
@given(st.data())
def test_moved_tensor_table_reads_as_gguf_py_or_raises_load_error(tables, data: st.DataObject) -> None:
    folder, bases = tables
    path = folder / f"moved-{next(_NAMES)}.gguf"
    path.write_bytes(data.draw(moved_table(bases)))
    try:
        try:
            _check_against_gguf_py(path)
        except LoadError:
            raise
        except BaseException as e:
            print("DEBUG", type(e).__name__, str(e)[:150])
            raise
        event("accepted, equal to gguf-py")
    except LoadError as exc:
        event(f"refused: {type(exc).__name__}")
        assert str(path) in str(exc)
    finally:
        path.unlink()


# -- the seed corpus: llama.cpp's handcrafted files, damaged -----------------------------------------------


@pytest.fixture(scope="module")
def handcrafted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[bytes]]:
    """Every kind of ggml's handcrafted files (seeds 0 and 1), as bytes."""
    folder = tmp_path_factory.mktemp("fuzz-gguf-handcrafted")
    return folder, [write_handcrafted(folder / f"{kind.name}-{seed}.gguf", kind, seed).path.read_bytes()
                    for kind in Kind for seed in (0, 1)]


def _read_table(path: Path) -> None:
    """The header reader's promise: every tensor lies inside the file and reads in its own shape."""
    header = read_header(path)
    mapped = MappedFile(path)
    for info in header.tensors:
        assert header.data_start <= info.offset and info.offset + info.nbytes <= header.file_size
        if is_supported(info.ggml_type):
            assert tuple(GGUFTensor(info, mapped, ReadStats()).read().shape) == info.shape


@FUZZ
@given(st.data())
def test_damaged_handcrafted_files_read_or_raise_load_error(handcrafted, data: st.DataObject) -> None:
    folder, seeds = handcrafted
    out = bytearray(data.draw(st.sampled_from(seeds)))
    for _ in range(data.draw(st.integers(0, 3))):
        at = data.draw(st.integers(0, max(len(out) - 1, 0)))
        value = data.draw(EXTREME_INTS | st.integers(0, 64)) % (1 << 64)
        out[at:at + 8] = value.to_bytes(8, "little")
    if data.draw(st.integers(0, 4)) == 0:
        out = out[: data.draw(st.integers(0, len(out)))]
    _reads_or_refuses_by_name(folder, bytes(out), _read_table)
