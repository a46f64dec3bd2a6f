"""Malformed GGUF files through ``loader.load_model``: refused naming the file, key or tensor.

Each case writes a valid tiny Llama GGUF and patches one field of its bytes.
The plugin's own unit tests feed its header reader hand-built bytes; these
go end to end (detection, config from metadata, weight stream) and through the CLI.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import pytest

import loader
from loader.errors import CheckpointFormatError, ConfigError, UnknownArchitectureError, UnsupportedError
from tests.helpers.malformed_gguf import field_offsets, metadata_value_offset, patch, write_llama_gguf
from tests.reliability.corpus import Built, CorpusCase, assert_load_refused, case_params

ARRAY_KEY = "test.values"


def _gguf(folder: Path) -> Path:
    return write_llama_gguf(folder / "model" / "model.gguf", extra_metadata={ARRAY_KEY: [1, 2, 3]})


def _patched(where: Callable[[bytes], int], fmt: str, value: int | bytes, *fragments: str,
             folder_source: bool = False) -> Callable[[Path], Built]:
    """Patch the field at ``where(file bytes)``; load the file (or its folder)."""

    def build(folder: Path) -> Built:
        path = _gguf(folder)
        patch(path, where(path.read_bytes()), fmt, value)
        return Built(path.parent if folder_source else path, (str(path), *fragments))

    return build


def _truncated(fraction: float, *fragments: str) -> Callable[[Path], Built]:
    def build(folder: Path) -> Built:
        path = _gguf(folder)
        blob = path.read_bytes()
        path.write_bytes(blob[: int(len(blob) * fraction)])
        return Built(path, (str(path), *fragments))

    return build


def _metadata_string(key: str, old: str, new: str, *fragments: str) -> Callable[[Path], Built]:
    """Replace a metadata string value of the same length (so no offset moves)."""
    assert len(old) == len(new)

    def build(folder: Path) -> Built:
        path = _gguf(folder)
        blob = path.read_bytes()
        at = metadata_value_offset(blob, key) + 4 + 8
        assert blob[at:at + len(old)] == old.encode()
        patch(path, at, "", new.encode())
        return Built(path, (str(path), *fragments))

    return build


def _key_renamed(key: str, new: str, *fragments: str) -> Callable[[Path], Built]:
    """Rename a metadata key (same length), as if the file lacked it."""
    assert len(key) == len(new)

    def build(folder: Path) -> Built:
        path = _gguf(folder)
        blob = path.read_bytes()
        patch(path, blob.index(key.encode()), "", new.encode())
        return Built(path, (str(path), *fragments))

    return build


def _array_count(blob: bytes) -> int:
    return metadata_value_offset(blob, ARRAY_KEY) + 4 + 4


CASES = [
    CorpusCase("gguf-wrong-magic", _patched(lambda b: 0, "", b"GGUX", "not a GGUF file", "b'GGUX'",
                                            folder_source=True), CheckpointFormatError),
    CorpusCase("gguf-unsupported-version", _patched(lambda b: 4, "<I", 99, "GGUF version 99 is not supported"),
               UnsupportedError),
    CorpusCase("gguf-absurd-tensor-count", _patched(lambda b: 8, "<Q", 1 << 60, f"tensor count {1 << 60}"),
               CheckpointFormatError),
    CorpusCase("gguf-absurd-metadata-count", _patched(lambda b: 16, "<Q", 1 << 62, f"metadata count {1 << 62}"),
               CheckpointFormatError),
    CorpusCase("gguf-absurd-string-length", _patched(lambda b: 24, "<Q", 1 << 62,
                                                     f"claims a string of {1 << 62} bytes"), CheckpointFormatError),
    CorpusCase("gguf-absurd-array-length", _patched(_array_count, "<Q", 1 << 61, repr(ARRAY_KEY),
                                                    f"claims an array of {1 << 61} items"), CheckpointFormatError),
    CorpusCase("gguf-tensor-data-past-the-end", _patched(lambda b: field_offsets(b, "output.weight").data_offset,
                                                         "<Q", 1 << 40, "'output.weight'", "past the end"),
               CheckpointFormatError),
    CorpusCase("gguf-truncated-in-data", _truncated(0.6, "data runs past the end of the file"),
               CheckpointFormatError),
    CorpusCase("gguf-truncated-in-header", _truncated(0.005, "truncated"), CheckpointFormatError),
    CorpusCase("gguf-unknown-ggml-type", _patched(lambda b: field_offsets(b, "output.weight").ggml_type, "<I", 250,
                                                  "'output.weight'", "ggml type 250"), UnsupportedError),
    CorpusCase("gguf-too-many-dims", _patched(lambda b: field_offsets(b, "output.weight").n_dims, "<I", 9,
                                              "'output.weight' has 9 dimensions"), CheckpointFormatError),
    CorpusCase("gguf-misaligned-offset", _patched(lambda b: field_offsets(b, "output.weight").data_offset, "<Q",
                                                  4, "'output.weight' starts at data offset 4"),
               CheckpointFormatError),
    CorpusCase("gguf-unknown-architecture", _metadata_string("general.architecture", "llama", "gpt99",
                                                             "GGUF architecture 'gpt99' is not supported"),
               UnknownArchitectureError),
    CorpusCase("gguf-missing-metadata-key", _key_renamed("llama.block_count", "llama.block_cnt__",
                                                         "'llama.block_count' is missing"), ConfigError),
    CorpusCase("gguf-absurd-metadata-value", _patched(
        lambda b: metadata_value_offset(b, "llama.embedding_length") + 4, "<I", 1 << 31,
        "'llama.embedding_length'", str(1 << 31)), ConfigError),
]


@pytest.mark.parametrize("case", case_params(CASES))
def test_malformed_gguf_is_refused_naming_the_culprit(case: CorpusCase, tmp_path: Path) -> None:
    assert_load_refused(case, tmp_path)


def test_the_undamaged_gguf_base_loads(tmp_path: Path) -> None:
    path = _gguf(tmp_path)
    model = loader.load_model(str(path), dtype="float32")
    assert model.config.num_hidden_layers == 2
    assert struct.unpack_from("<I", path.read_bytes(), 4)[0] == 3
