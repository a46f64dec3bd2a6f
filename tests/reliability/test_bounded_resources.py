"""Bounded work for metadata: hostile headers and indexes fail fast, with memory in proportion to the file.

A GGUF header and a weight index are read whole before any weight; what they cost must
not be decided by a stranger. The limits (``docs/reliability.md``): GGUF arrays of arrays
are refused (ggml's ``gguf_init`` refuses them too), at most ``MAX_METADATA_KEYS`` metadata
keys, ``MAX_TENSORS`` tensors and ``MAX_METADATA_STRINGS`` strings per file; an index names
at most ``MAX_INDEX_FILES`` files, each checked once however many tensors name it.
"""

from __future__ import annotations

import json
import struct
import tracemalloc
from pathlib import Path

import pytest
from gguf import GGUFValueType

from loader._pipeline import prepare
from loader.errors import CheckpointFormatError
from loader_plugin_gguf.format import header as gguf_header
from loader_plugin_gguf.format.header import MAX_METADATA_KEYS, MAX_TENSORS, read_header
from tests.helpers.malformed import INDEX_NAME, write_llama_checkpoint
from tests.helpers.malformed_gguf import write_llama_gguf
from tests.reliability.corpus import Built, CorpusCase, assert_load_refused, case_params

NESTED_BYTES = 8_000_000


def _with_raw_keys(folder: Path, keys: int, raw: bytes, tail: int = 0) -> Path:
    """The tiny Llama GGUF with ``keys`` more metadata keys (``raw``, encoded) and ``tail`` zero bytes appended."""
    path = write_llama_gguf(folder / "model" / "model.gguf")
    base = path.read_bytes()
    tensors, kvs = struct.unpack_from("<QQ", base, 8)
    path.write_bytes(base[:8] + struct.pack("<QQ", tensors, kvs + keys) + raw + base[24:] + bytes(tail))
    return path


def _key(name: str, vtype: int) -> bytes:
    return struct.pack("<Q", len(name)) + name.encode() + struct.pack("<I", vtype)


def _nested_empty_arrays(folder: Path) -> Built:
    """One key holding ~670k empty int32 arrays (8 MB): 30x its size in Python lists, before."""
    count = NESTED_BYTES // 12
    raw = (_key("test.nested", GGUFValueType.ARRAY) + struct.pack("<IQ", GGUFValueType.ARRAY, count)
           + struct.pack("<IQ", GGUFValueType.INT32, 0) * count)
    path = _with_raw_keys(folder, 1, raw)
    return Built(path, (str(path), "'test.nested'", "array of arrays"))


def _many_keys(folder: Path) -> Built:
    count = MAX_METADATA_KEYS + 1
    raw = b"".join(_key(f"k.{i}", GGUFValueType.UINT8) + b"\x00" for i in range(count))
    path = _with_raw_keys(folder, count, raw)
    return Built(path, (str(path), "metadata keys", f"at most {MAX_METADATA_KEYS}"))


def _many_tensors(folder: Path) -> Built:
    """The tensor count raised past the limit, with the bytes such a table would need appended."""
    path = write_llama_gguf(folder / "model" / "model.gguf")
    blob = bytearray(path.read_bytes())
    struct.pack_into("<Q", blob, 8, MAX_TENSORS + 1)
    path.write_bytes(bytes(blob) + bytes(40 * (MAX_TENSORS + 1)))
    return Built(path, (str(path), f"{MAX_TENSORS + 1} tensors", f"at most {MAX_TENSORS}"))


def _index_of_many_files(folder: Path) -> Built:
    model = folder / "model"
    write_llama_checkpoint(model)
    index = json.loads((model / INDEX_NAME).read_text())
    count = prepare.MAX_INDEX_FILES + 1
    index["weight_map"].update({f"unused.{i}": f"part-{i}.safetensors" for i in range(count)})
    (model / INDEX_NAME).write_text(json.dumps(index))
    return Built(model, (str(model / INDEX_NAME), f"{count + 2} different files"))


CASES: list[CorpusCase] = [
    CorpusCase("gguf-nested-empty-arrays", _nested_empty_arrays, CheckpointFormatError),
    CorpusCase("gguf-too-many-metadata-keys", _many_keys, CheckpointFormatError),
    CorpusCase("gguf-too-many-tensors", _many_tensors, CheckpointFormatError),
    CorpusCase("index-names-too-many-files", _index_of_many_files, CheckpointFormatError),
]


@pytest.mark.parametrize("case", case_params(CASES))
def test_metadata_past_its_limits_is_refused(case: CorpusCase, tmp_path: Path) -> None:
    assert_load_refused(case, tmp_path)


def test_nested_arrays_are_refused_before_they_cost_memory(tmp_path: Path) -> None:
    """Peak Python memory while refusing the 8 MB file stays well under the file's size (was ~30x it)."""
    path = _nested_empty_arrays(tmp_path).source
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointFormatError, match="array of arrays"):
            read_header(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < NESTED_BYTES // 4, f"peak {peak} bytes"


def test_strings_past_the_limit_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Strings cost ~6x their bytes as Python objects: the header may hold ``MAX_METADATA_STRINGS`` in all."""
    monkeypatch.setattr(gguf_header, "MAX_METADATA_STRINGS", 100)
    raw = (_key("test.words", GGUFValueType.ARRAY) + struct.pack("<IQ", GGUFValueType.STRING, 101)
           + (struct.pack("<Q", 2) + b"ab") * 101)
    path = _with_raw_keys(tmp_path, 1, raw)
    with pytest.raises(CheckpointFormatError, match=r"'test\.words' holds 101 strings, past the 100 a GGUF header "
                                                    r"may hold in all"):
        read_header(path)


def test_an_index_checks_each_file_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """100,000 unused entries naming the two shards: two files checked, not 100,002 (30 s for a million)."""
    model = tmp_path / "model"
    write_llama_checkpoint(model)
    index = json.loads((model / INDEX_NAME).read_text())
    shards = sorted(set(index["weight_map"].values()))
    index["weight_map"].update({f"unused.{i}.weight": shards[i % 2] for i in range(100_000)})
    (model / INDEX_NAME).write_text(json.dumps(index))
    checked: list[Path] = []
    real_is_file = Path.is_file

    def counting_is_file(self: Path) -> bool:
        checked.append(self)
        return real_is_file(self)

    monkeypatch.setattr(Path, "is_file", counting_is_file)
    from loader.checkpoint import Source, WeightFormat

    files = tuple(str(model / s) for s in shards)
    kept = prepare.filter_weight_files(Source(str(model), model),
                                       WeightFormat("safetensors", files, index=str(model / INDEX_NAME)))
    assert kept.files == files
    assert len(checked) <= 10, len(checked)
