"""The files of the safetensors reference reader's own tests, written by our own encoder.

Each :class:`ReferenceFile` is one file a test of Hugging Face's ``safetensors`` feeds its reader:
the Rust crate's ``safetensors/src/tensor.rs`` tests (most give the bytes literally), and the
Python binding's tests that concern the file format (``bindings/python/tests``: what
``save``/``save_file`` writes for each dtype, the ``pread`` backend's refusals). ``accepted`` is
the reference's verdict (``SafeTensors::deserialize``: a value or an error), ``origin`` the test
it comes from. Files a test builds from tensors are written here by :func:`encode`, which lays a
file out as the reference writer does (header padded with spaces to a multiple of 8, tensors in
the order given, back to back).
"""

from __future__ import annotations

import json
import struct

import attrs
import torch

__all__ = ["ReferenceFile", "REFERENCE_FILES", "Stored", "encode", "reference_file"]


@attrs.frozen
class Stored:
    """One tensor as the file stores it: dtype code, shape, bytes."""

    dtype: str
    shape: tuple[int, ...]
    data: bytes


@attrs.frozen
class ReferenceFile:
    """A file from a reference test, the reference's verdict, and (when accepted) the tensors it holds."""

    id: str
    origin: str
    blob: bytes
    accepted: bool
    tensors: dict[str, Stored] = attrs.field(factory=dict)
    metadata: dict[str, str] | None = None


def _length_prefixed(header: bytes, data: bytes = b"", length: int | None = None) -> bytes:
    return struct.pack("<Q", len(header) if length is None else length) + header + data


def encode(tensors: dict[str, Stored], metadata: dict[str, str] | None = None) -> bytes:
    """A valid file of ``tensors`` (in that order), as the reference writer lays it out."""
    header: dict[str, object] = {"__metadata__": metadata} if metadata is not None else {}
    offset = 0
    for name, stored in tensors.items():
        header[name] = {"dtype": stored.dtype, "shape": list(stored.shape),
                        "data_offsets": [offset, offset + len(stored.data)]}
        offset += len(stored.data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return _length_prefixed(raw, b"".join(s.data for s in tensors.values()))


def _of(tensor: torch.Tensor, code: str) -> Stored:
    flat = tensor.contiguous().view(torch.uint8) if tensor.dim() else tensor.reshape(1).view(torch.uint8)
    return Stored(code, tuple(tensor.shape), flat.numpy().tobytes())


def _f32(*values: float) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def reference_file(id: str, origin: str, tensors: dict[str, Stored], metadata: dict[str, str] | None = None,
                   ) -> ReferenceFile:
    """An accepted file the reference test writes from ``tensors``."""
    return ReferenceFile(id, origin, encode(tensors, metadata), True, tensors, metadata)


def _refused(id: str, origin: str, blob: bytes) -> ReferenceFile:
    return ReferenceFile(id, origin, blob, False)


_I32_2X2 = b'{"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}}'
_ZEROS_I32 = {"test": Stored("I32", (2, 2), bytes(16))}
_ATTN = Stored("F32", (1, 2, 3), _f32(0, 1, 2, 3, 4, 5))


def _rust_literal_files() -> list[ReferenceFile]:
    """The tensor.rs tests that give their bytes literally (or build them from a one-line header)."""
    rs = "safetensors/src/tensor.rs::"
    attack = {f"weight_{i}": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]} for i in range(10)}
    return [
        ReferenceFile("deserialization", f"{rs}test_deserialization, test_lifetimes; python test_simple.py::"
                      "test_deserialization", _length_prefixed(_I32_2X2, bytes(16)), True, _ZEROS_I32),
        ReferenceFile("empty-shape", f"{rs}test_empty_shapes_allowed",
                      _length_prefixed(b'{"test":{"dtype":"I32","shape":[],"data_offsets":[0,4]}}', bytes(4)),
                      True, {"test": Stored("I32", (), bytes(4))}),
        ReferenceFile("zero-sized-tensor", f"{rs}test_zero_sized_tensor",
                      _length_prefixed(b'{"test":{"dtype":"I32","shape":[2,0],"data_offsets":[0, 0]}}'), True,
                      {"test": Stored("I32", (2, 0), b"")}),
        ReferenceFile("whitespace-after-header", f"{rs}test_whitespace_padded_header",
                      _length_prefixed(b"{}\r \t\n"), True),
        ReferenceFile("whitespace-before-header", f"{rs}test_whitespace_leading_padded_header",
                      _length_prefixed(b"\t\n{}\r "), True),
        _refused("json-attack-same-offsets", f"{rs}test_json_attack",
                 _length_prefixed(json.dumps(attack).encode(), bytes(16))),
        _refused("bytes-after-the-data", f"{rs}test_metadata_incomplete_buffer",
                 _length_prefixed(_I32_2X2, bytes(16) + b"extra_bogus_data_for_polyglot_file")),
        _refused("data-two-bytes-short", f"{rs}test_metadata_incomplete_buffer", _length_prefixed(_I32_2X2, bytes(14))),
        _refused("header-too-large", f"{rs}test_header_too_large",
                 b"<\x00\x00\x00\x00\xff\xff\xff" + _I32_2X2 + bytes(16)),
        _refused("header-too-small", f"{rs}test_header_too_small", b""),
        _refused("header-length-beyond-file", f"{rs}test_invalid_header_length", b"<" + bytes(7)),
        _refused("header-not-utf8", f"{rs}test_invalid_header_non_utf8", _length_prefixed(b"\xff")),
        _refused("header-not-json", f"{rs}test_invalid_header_not_json", _length_prefixed(b"{")),
        _refused("span-not-the-shape", f"{rs}test_invalid_info",
                 _length_prefixed(b'{"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0, 4]}}')),
        _refused("shape-overflows-elements", f"{rs}test_validation_overflow", _length_prefixed(
            b'{"test":{"dtype":"I32","shape":[2,18446744073709551614],"data_offsets":[0,16]}}', bytes(16))),
        _refused("shape-overflows-bytes", f"{rs}test_validation_overflow", _length_prefixed(
            b'{"test":{"dtype":"I32","shape":[2,9223372036854775807],"data_offsets":[0,16]}}', bytes(16))),
    ]


def _rust_written_files() -> list[ReferenceFile]:
    """The tensor.rs tests that serialize tensors (and the proptest round trip, on fixed dtypes and shapes)."""
    rs = "safetensors/src/tensor.rs::"
    every_dtype = {f"t.{code}": Stored(code, (2, 3), bytes(range(6 * size)))
                   for code, size in (("BOOL", 1), ("U8", 1), ("I8", 1), ("F8_E5M2", 1), ("F8_E4M3", 1),
                                      ("I16", 2), ("U16", 2), ("F16", 2), ("BF16", 2), ("I32", 4), ("U32", 4),
                                      ("F32", 4), ("C64", 8), ("F64", 8), ("I64", 8), ("U64", 8))}
    every_dtype["t.BOOL"] = Stored("BOOL", (2, 3), bytes([0, 1, 1, 0, 1, 0]))
    return [
        reference_file("serialization", f"{rs}test_serialization, test_slicing", {"attn.0": _ATTN}),
        reference_file("forced-alignment", f"{rs}test_serialization_forced_alignement",
                       {"attn0": Stored("F32", (1, 1, 2, 3), _ATTN.data)}),
        reference_file("empty", f"{rs}test_empty", {}),
        reference_file("empty-with-metadata", f"{rs}test_empty", {}, {"framework": "pt"}),
        reference_file("roundtrip-every-byte-dtype", f"{rs}test_roundtrip, test_indexing", every_dtype),
        reference_file("fp4", f"{rs}test_serialization_fp4", {"attn.0": Stored("F4", (1, 2), b"\x00")}),
        reference_file("roundtrip-f6", f"{rs}test_roundtrip (F6_E2M3, F6_E3M2)",
                       {"a": Stored("F6_E2M3", (4,), bytes(3)), "b": Stored("F6_E3M2", (2, 4), bytes(6))}),
        _refused("fp4-odd-count", f"{rs}test_serialization_fp4_misaligned",
                 encode({"attn.0": Stored("F4", (1, 3), b"\x00\x01")})),
        _refused("fp4-span-too-long", f"{rs}test_serialization_fp4_invalid",
                 encode({"attn.0": Stored("F4", (1, 2), b"\x00\x01")})),
    ]


def _python_binding_files() -> list[ReferenceFile]:
    """The Python binding's tests that pin bytes or dtypes of a file."""
    py = "bindings/python/tests/"
    one_at_1_1 = torch.zeros(2, 2, dtype=torch.int32)
    one_at_1_1[1, 1] = 1
    complex_value = torch.zeros(2, 2, dtype=torch.complex64)
    complex_value[1, 1] = torch.tensor(complex(-1.0, 1.0))
    pread = {"fp32_2d": _of(torch.arange(12, dtype=torch.float32).reshape(3, 4), "F32"),
             "bf16_2d": _of(torch.arange(8, dtype=torch.bfloat16).reshape(2, 4), "BF16"),
             "fp16_3d": _of(torch.arange(24, dtype=torch.float16).reshape(2, 3, 4), "F16"),
             "scalar_fp32": _of(torch.tensor(7.5), "F32"), "empty_2d": Stored("F16", (0, 5), b""),
             "i64_1d": _of(torch.arange(5), "I64"), "fp8_e4m3fn": _of(torch.zeros(8, dtype=torch.float8_e4m3fn),
                                                                       "F8_E4M3")}
    pread_blob = encode(pread, {"foo": "bar"})
    lying = b'{"liar":{"dtype":"F32","shape":[1024,1024],"data_offsets":[0,4194304]}}'
    return [
        reference_file("py-serialization", f"{py}test_simple.py::test_serialization", {"test": _of(one_at_1_1, "I32")}),
        reference_file("py-metadata", f"{py}test_simple.py::test_deserialization_metadata, test_serialization_metadata",
                       {"test1": Stored("I32", (2, 2), bytes(16))}, {"framework": "pt"}),
        reference_file("py-forces-alignment", f"{py}test_simple.py::test_serialization_forces_alignment",
                       {"test1": Stored("I32", (2, 2), bytes(16)), "test2": Stored("F16", (2, 2), bytes(8))}),
        reference_file("py-bf16", f"{py}test_pt_comparison.py::test_serialization",
                       {"test": Stored("BF16", (2, 2), b"\x10@\x80?\x80?\x80?")}),
        reference_file("py-complex", f"{py}test_pt_comparison.py::test_complex", {"test": _of(complex_value, "C64")}),
        reference_file("py-odd-dtypes", f"{py}test_pt_comparison.py::test_odd_dtype, test_simple.py::test_numpy_bool", {
            "test": _of(torch.tensor([[1.5, -2.0], [0.25, 3.0]], dtype=torch.bfloat16), "BF16"),
            "test2": _of(torch.tensor([[1.5, -2.0], [0.25, 3.0]], dtype=torch.float16), "F16"),
            "test3": _of(torch.tensor([[True, False], [False, False]]), "BOOL"),
            "test4": _of(torch.zeros(2, 2, dtype=torch.complex64), "C64")}),
        reference_file("py-fp8", f"{py}test_pt_comparison.py::test_odd_dtype_fp8_*", {
            "e4m3fn": _of(torch.tensor([-0.5], dtype=torch.float8_e4m3fn), "F8_E4M3"),
            "e5m2": _of(torch.tensor([-0.5], dtype=torch.float8_e5m2), "F8_E5M2"),
            "e8m0": _of(torch.tensor([0.5], dtype=torch.float8_e8m0fnu), "F8_E8M0"),
            "e4m3fnuz": _of(torch.tensor([0.5], dtype=torch.float8_e4m3fnuz), "F8_E4M3FNUZ"),
            "e5m2fnuz": _of(torch.tensor([0.5], dtype=torch.float8_e5m2fnuz), "F8_E5M2FNUZ")}),
        reference_file("py-fp4", f"{py}test_pt_comparison.py::test_odd_dtype_fp4", {
            "test1": _of(torch.tensor([0.0], dtype=torch.float8_e8m0fnu), "F8_E8M0"),
            "test2": Stored("F4", (2, 4), bytes(4))}),
        reference_file("py-zero-sized", f"{py}test_pt_comparison.py::test_zero_sized, test_multiple_zero_sized",
                       {"test": Stored("F32", (2, 0), b""), "test2": Stored("F32", (2, 0), b"")}),
        ReferenceFile("py-pread-round-trip", f"{py}test_pread_backend.py::test_*_round_trip", pread_blob, True,
                      pread, {"foo": "bar"}),
        _refused("py-pread-truncated-header", f"{py}test_pread_backend.py::test_truncated_header_is_rejected",
                 pread_blob[:8 + struct.unpack_from("<Q", pread_blob)[0] // 2]),
        _refused("py-pread-lying-offsets", f"{py}test_pread_backend.py::test_data_offset_overflow_is_rejected",
                 _length_prefixed(lying, b"\x00")),
    ]


REFERENCE_FILES: list[ReferenceFile] = [*_rust_literal_files(), *_rust_written_files(), *_python_binding_files()]
"""Every file of the reference tests ported here, with the reference's verdict."""
