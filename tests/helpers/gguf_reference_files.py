"""The handcrafted GGUF files of llama.cpp's ``tests/test-gguf.cpp``, written by our own generator.

ggml's test writes one file per ``HANDCRAFTED_*`` kind and asks ``gguf_init_from_file`` for a
verdict (context or null). This module writes the same kinds of files, byte layout for byte
layout: the same stages (header; + key/value pairs; + tensor table; + tensor data), the same
damage per kind, the same names (``my_key_<i>``, ``my_tensor_<i>``), random values that include
non-UTF-8 string bytes as ggml's do, and data bytes equal to their position in the data section
mod 256. What differs is the random source (Python's ``random.Random`` instead of
``std::mt19937``) and the two random lists: one tensor of every ggml type (with smaller
dimensions) and one key of every value type and array item type, so each is covered in every
file and a file stays small.

Kinds keep ggml's numbers so the stage of a kind is read as ggml reads it: below 1000 a header
only, below 2000 key/value pairs too, below 3000 a tensor table without data, then data.
"""

from __future__ import annotations

import enum
import random
import struct
from pathlib import Path

import attrs
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

__all__ = [
    "GGML_BLOCK_SIZES",
    "GGML_MAX_NAME",
    "GGML_TYPE_COUNT",
    "ExpectedTensor",
    "Handcrafted",
    "Kind",
    "write_handcrafted",
]

GGML_MAX_NAME = 64
GGML_TYPE_COUNT = 43  # ggml.h: one past the last type (Q2_0 = 42)
GGUF_TYPE_COUNT = 13  # gguf.h: one past FLOAT64
DEFAULT_ALIGNMENT = 32
ALIGNMENT_KEY = "general.alignment"
_KV, _TENSORS, _DATA = 1000, 2000, 3000
GGML_BLOCK_SIZES: dict[int, tuple[int, int]] = {
    **{int(t): sizes for t, sizes in GGML_QUANT_SIZES.items()},
    # ggml-common.h, where gguf-py 0.19 differs: block_q8_1 holds two halves and 32 int8 (gguf-py
    # still lists the float d, s of an older layout), and Q2_0 (64 values in 18 bytes) it lacks
    int(GGMLQuantizationType.Q8_1): (32, 36),
    42: (64, 18),
}
"""Values per block and bytes per block of every ggml type a GGUF file may hold, as ggml computes them."""


class Kind(enum.IntEnum):
    """ggml's ``handcrafted_file_type``: what one file gets wrong (or, ``*_SUCCESS``, right)."""

    HEADER_BAD_MAGIC = 10
    HEADER_BAD_VERSION_0 = 15
    HEADER_BAD_VERSION_1 = 20
    HEADER_BAD_VERSION_FUTURE = 30
    HEADER_BAD_N_TENSORS = 40
    HEADER_BAD_N_KV = 50
    HEADER_EMPTY = 800
    KV_BAD_KEY_SIZE = _KV + 10
    KV_EMPTY_KEY = _KV + 15
    KV_BAD_TYPE = _KV + 20
    KV_DUPLICATE_KEY = _KV + 40
    KV_BAD_ALIGN = _KV + 50
    KV_WRONG_TYPE_ALIGN = _KV + 55
    KV_SUCCESS = _KV + 800
    TENSORS_BAD_NAME_SIZE = _TENSORS + 10
    TENSORS_BAD_N_DIMS = _TENSORS + 20
    TENSORS_BAD_SHAPE = _TENSORS + 30
    TENSORS_ZERO_DIM = _TENSORS + 35
    TENSORS_NE_TOO_BIG = _TENSORS + 40
    TENSORS_NBYTES_TOO_BIG = _TENSORS + 45
    TENSORS_BAD_TYPE = _TENSORS + 50
    TENSORS_BAD_OFFSET = _TENSORS + 60
    TENSORS_DUPLICATE_NAME = _TENSORS + 70
    TENSORS_BAD_ALIGN = _TENSORS + 75
    TENSORS_INCONSISTENT_ALIGN = _TENSORS + 80
    TENSORS_SUCCESS = _TENSORS + 800
    TENSORS_CUSTOM_ALIGN = _TENSORS + 810
    DATA_NOT_ENOUGH_DATA = _DATA + 10
    DATA_BAD_ALIGN = _DATA + 15
    DATA_INCONSISTENT_ALIGN = _DATA + 20
    DATA_MEM_SIZE_OVERFLOW = _DATA + 30
    DATA_SUCCESS = _DATA + 800
    DATA_CUSTOM_ALIGN = _DATA + 810

    @property
    def has_kv(self) -> bool:
        return self >= _KV

    @property
    def has_tensors(self) -> bool:
        return self >= _TENSORS

    @property
    def has_data(self) -> bool:
        return self >= _DATA

    @property
    def ggml_accepts(self) -> bool:
        """ggml's ``expect_context_not_null``: the ``*_SUCCESS``/``*_CUSTOM_ALIGN`` kinds, and a zero dim."""
        if self is Kind.TENSORS_ZERO_DIM:
            return True
        stage = (self // _KV) * _KV if self >= _KV else 0
        return self - stage >= 800


_CUSTOM_ALIGNMENT_KINDS = {Kind.KV_BAD_ALIGN, Kind.KV_WRONG_TYPE_ALIGN, Kind.TENSORS_BAD_ALIGN,
                           Kind.TENSORS_CUSTOM_ALIGN, Kind.DATA_BAD_ALIGN, Kind.DATA_CUSTOM_ALIGN}
_SCALAR_SIZES = {GGUFValueType.UINT8: 1, GGUFValueType.INT8: 1, GGUFValueType.UINT16: 2, GGUFValueType.INT16: 2,
                 GGUFValueType.UINT32: 4, GGUFValueType.INT32: 4, GGUFValueType.FLOAT32: 4, GGUFValueType.BOOL: 1,
                 GGUFValueType.UINT64: 8, GGUFValueType.INT64: 8, GGUFValueType.FLOAT64: 8}


@attrs.frozen
class ExpectedTensor:
    """One tensor as ggml would report it: ``shape`` in torch order (the reverse of ggml's ``ne``)."""

    name: str
    ggml_type: int
    shape: tuple[int, ...]
    offset: int  # relative to the data section
    nbytes: int


@attrs.frozen
class Handcrafted:
    """A written file: its kind, the key/value pairs and tensors it declares, and its alignment."""

    path: Path
    kind: Kind
    kv: tuple[tuple[str, int, int | None], ...]  # key, value type, array item type
    tensors: tuple[ExpectedTensor, ...]
    alignment: int

    @property
    def n_kv(self) -> int:
        return len(self.kv) + (1 if self.kind in _CUSTOM_ALIGNMENT_KINDS else 0)


def _pad(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def _row_bytes(ggml_type: int, elements: int) -> int:
    block, size = GGML_BLOCK_SIZES[ggml_type]
    return elements // block * size


def _tensor_configs(rng: random.Random) -> list[tuple[int, list[int]]]:
    """One tensor per ggml type, in a shuffled order, 1 to 4 dims of 1-3 (rows: 1-3 blocks)."""
    types = sorted(GGML_BLOCK_SIZES)
    rng.shuffle(types)
    configs = []
    for ggml_type in types:
        block, _ = GGML_BLOCK_SIZES[ggml_type]
        ne = [rng.randint(1, 3) * block, 1, 1, 1]
        for i in range(1, rng.randint(1, 4)):
            ne[i] = rng.randint(1, 3)
        configs.append((ggml_type, ne))
    return configs


def _kv_types(rng: random.Random) -> list[tuple[int, int | None]]:
    """Every value type once and an array of every item type but arrays, shuffled (ggml draws 100 at random)."""
    scalars: list[tuple[int, int | None]] = [(int(t), None) for t in GGUFValueType if t != GGUFValueType.ARRAY]
    arrays: list[tuple[int, int | None]] = [(int(GGUFValueType.ARRAY), item) for item, _ in scalars]
    kinds = scalars + arrays
    rng.shuffle(kinds)
    return kinds


class _Writer:
    def __init__(self) -> None:
        self.out = bytearray()

    def put(self, fmt: str, *values: int | float) -> None:
        self.out += struct.pack("<" + fmt, *values)

    def raw(self, data: bytes) -> None:
        self.out += data

    def pad_to(self, alignment: int) -> None:
        self.out += bytes(-len(self.out) % alignment)


def _random_words(rng: random.Random, stringy: bool) -> bytes:
    """ggml's ``uint32_t data[16]``: random, with no zero byte where it becomes a string (any other byte may)."""
    words = [rng.getrandbits(32) | (0x01010101 if stringy else 0) for _ in range(16)]
    return struct.pack("<16I", *words)


def _write_kv(w: _Writer, rng: random.Random, kind: Kind, kv: list[tuple[int, int | None]]) -> None:
    for i, (vtype, item) in enumerate(kv):
        if kind is Kind.KV_BAD_TYPE:
            vtype, item = GGUF_TYPE_COUNT, GGUF_TYPE_COUNT
        key = b"" if kind is Kind.KV_EMPTY_KEY else f"my_key_{i // 2 if kind is Kind.KV_DUPLICATE_KEY else i}".encode()
        w.put("Q", 2**64 - 1 if kind is Kind.KV_BAD_KEY_SIZE else len(key))
        w.raw(key)
        w.put("i", vtype)
        data = _random_words(rng, GGUFValueType.STRING in (vtype, item))
        if vtype == GGUFValueType.STRING:
            n = rng.randrange(len(data))
            w.put("Q", n)
            w.raw(data[:n])
        elif vtype == GGUFValueType.ARRAY and item == GGUFValueType.STRING:
            w.put("i", item)
            count = rng.randint(0, 16)
            w.put("Q", count)
            for s in range(count):
                n = rng.randint(0, 4)
                w.put("Q", n)
                w.raw(data[4 * s:4 * s + n])
        elif vtype == GGUFValueType.ARRAY:
            assert item is not None
            w.put("i", item)
            count = rng.randrange(len(data)) // _SCALAR_SIZES[GGUFValueType(item)]
            w.put("Q", count)
            w.raw(data[:count * _SCALAR_SIZES[GGUFValueType(item)]])
        else:
            w.raw(data[:1 if kind is Kind.KV_BAD_TYPE else _SCALAR_SIZES[GGUFValueType(vtype)]])


def _dims(kind: Kind, ggml_type: int, ne: list[int], n_dims: int) -> list[int]:
    """The ``ne`` the table declares (ggml order): the kind's damage, else the config's own."""
    if kind is Kind.TENSORS_BAD_SHAPE:
        return [-1] * n_dims
    if kind is Kind.TENSORS_ZERO_DIM:
        return [ne[0], 0]
    if kind is Kind.TENSORS_NE_TOO_BIG:
        return [4 * (2**31 - 1)] * n_dims
    if kind is Kind.TENSORS_NBYTES_TOO_BIG:
        big_ne = (2**64 - 1) // GGML_BLOCK_SIZES[ggml_type][1]
        return [int(1.01 * big_ne ** (1 / n_dims)) + 1] * n_dims
    return ne[:n_dims]


def _write_tensor_table(w: _Writer, kind: Kind, configs: list[tuple[int, list[int]]],
                        alignment: int) -> list[ExpectedTensor]:
    offset = 0
    tensors = []
    for i, (config_type, ne) in enumerate(configs):
        ggml_type = int(GGMLQuantizationType.I64) if kind is Kind.TENSORS_NBYTES_TOO_BIG else config_type
        name = "my_tensor" if kind is Kind.TENSORS_DUPLICATE_NAME else f"my_tensor_{i}"
        if kind is Kind.TENSORS_BAD_NAME_SIZE:
            name += "_with_a_very_long_name_which_is_longer_than_what_is_allowed_for_ggml_tensors"
        w.put("Q", len(name))
        w.raw(name.encode())
        n_dims = 2 if kind in (Kind.TENSORS_NE_TOO_BIG, Kind.TENSORS_NBYTES_TOO_BIG) else 1
        n_dims = 2 if kind is Kind.TENSORS_ZERO_DIM else max([n_dims] + [d + 1 for d in range(1, 4) if ne[d] != 1])
        w.put("I", 4 + 1 if kind is Kind.TENSORS_BAD_N_DIMS else n_dims)
        dims = _dims(kind, ggml_type, ne, n_dims)
        w.put(f"{len(dims)}q", *dims)
        w.put("i", GGML_TYPE_COUNT if kind is Kind.TENSORS_BAD_TYPE else ggml_type)
        w.put("Q", 2**64 - 1 if kind is Kind.TENSORS_BAD_OFFSET else offset)
        elements = 0 if kind is Kind.TENSORS_ZERO_DIM else ne[0] * ne[1] * ne[2] * ne[3]
        nbytes = _row_bytes(ggml_type, elements)
        tensors.append(ExpectedTensor(name, ggml_type, tuple(reversed(dims)), offset, nbytes))
        offset += _pad(nbytes, alignment)
    return tensors


def write_handcrafted(path: Path, kind: Kind, seed: int = 0) -> Handcrafted:
    """Write ``kind``'s file at ``path`` as ggml's ``get_handcrafted_file`` lays it out; say what it declares."""
    rng = random.Random(seed)
    w = _Writer()
    w.raw(b"FUGG" if kind is Kind.HEADER_BAD_MAGIC else b"GGUF")
    versions = {Kind.HEADER_BAD_VERSION_0: 0, Kind.HEADER_BAD_VERSION_1: 1, Kind.HEADER_BAD_VERSION_FUTURE: 4}
    w.put("I", versions.get(kind, 3))
    configs = _tensor_configs(rng) if kind.has_tensors else []
    if kind is Kind.DATA_MEM_SIZE_OVERFLOW:
        configs = [(int(GGMLQuantizationType.I8), [0x7FFFFFFFFFFFFFC0, 1, 1, 1])] * 2
    w.put("Q", 2**64 - 1 if kind is Kind.HEADER_BAD_N_TENSORS else len(configs))
    kv = _kv_types(rng) if kind.has_kv else []
    n_kv = len(kv) + (1 if kind in _CUSTOM_ALIGNMENT_KINDS else 0)
    w.put("Q", 2**64 - 1 if kind is Kind.HEADER_BAD_N_KV else n_kv)
    alignment = DEFAULT_ALIGNMENT
    if kind.has_kv:
        _write_kv(w, rng, kind, kv)
    if kind in _CUSTOM_ALIGNMENT_KINDS:
        w.put("Q", len(ALIGNMENT_KEY))
        w.raw(ALIGNMENT_KEY.encode())
        w.put("i", GGUFValueType.INT32 if kind is Kind.KV_WRONG_TYPE_ALIGN else GGUFValueType.UINT32)
        alignment = 1 if kind.ggml_accepts else 13
        w.put("I", alignment)
    tensors: list[ExpectedTensor] = []
    if kind.has_tensors:
        if kind in (Kind.TENSORS_INCONSISTENT_ALIGN, Kind.DATA_INCONSISTENT_ALIGN):
            alignment = 1  # the offsets are laid out for 1 while the file says 32
        tensors = _write_tensor_table(w, kind, configs, alignment)
    w.pad_to(alignment)
    if kind.has_data:
        size = sum(_pad(t.nbytes, alignment) for t in tensors)
        size = {Kind.DATA_NOT_ENOUGH_DATA: size - 1, Kind.DATA_MEM_SIZE_OVERFLOW: 32}.get(kind, size)
        w.raw(bytes(i % 256 for i in range(size)))
    path.write_bytes(bytes(w.out))
    declared = tuple((f"my_key_{i}", vtype, item) for i, (vtype, item) in enumerate(kv))
    return Handcrafted(path, kind, declared, tuple(tensors), alignment)
