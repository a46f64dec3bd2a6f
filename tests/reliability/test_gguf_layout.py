"""GGUF data layout: any valid ``general.alignment`` loads exactly; a tensor table ggml refuses is refused.

``gguf_init`` (ggml/src/gguf.cpp) is the reference: ``general.alignment`` must be a uint32
power of two (1 and 2 included: gguf-py writes and reads them), the data section starts
at the header's end padded to it, and tensor *i* must start exactly where tensor *i-1*
ended, padded to the alignment -- so tensors never overlap, never leave gaps, and come
in table order. Fixtures are written by ``gguf.GGUFWriter``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from gguf import GGUFValueType

import loader
from loader.errors import CheckpointFormatError
from tests.helpers.malformed_gguf import field_offsets, patch, write_llama_gguf
from tests.reliability.corpus import Built, CorpusCase, assert_load_refused, case_params

ALIGNMENT = "general.alignment"


@pytest.fixture(scope="module")
def aligned_state(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], dict[str, torch.Tensor]]:
    """The default-aligned file loaded in a dtype (float32: dequantized; bfloat16: blocks kept packed)."""
    path = write_llama_gguf(tmp_path_factory.mktemp("gguf-32") / "model.gguf")
    cache: dict[str, dict[str, torch.Tensor]] = {}

    def state(dtype: str) -> dict[str, torch.Tensor]:
        if dtype not in cache:
            loaded = loader.load_model(str(path), dtype=dtype).state_dict()
            cache[dtype] = {k: v.clone() for k, v in loaded.items()}
        return cache[dtype]

    return state


@pytest.mark.parametrize("alignment", [1, 2, 8])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("mapped", ["0", "1"])
def test_any_power_of_two_alignment_loads_exactly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, aligned_state,
                                                  alignment: int, dtype: str, mapped: str) -> None:
    """Tensors at odd file offsets (alignment 1 or 2) are copied where a view of the map is impossible."""
    monkeypatch.setenv("LOADER_MAP_WEIGHTS", mapped)
    path = write_llama_gguf(tmp_path / "model.gguf", alignment=alignment)
    state = loader.load_model(str(path), dtype=dtype).state_dict()
    expected_state = aligned_state(dtype)
    assert state.keys() == expected_state.keys()
    for name, expected in expected_state.items():
        assert torch.equal(state[name], expected), name


def _typed_alignment(value: object, vtype: GGUFValueType, *fragments: str) -> Callable[[Path], Built]:
    def build(folder: Path) -> Built:
        path = write_llama_gguf(folder / "model" / "model.gguf", typed_metadata={ALIGNMENT: (value, vtype)})
        return Built(path, (str(path), repr(ALIGNMENT), *fragments))

    return build


def _offsets(change: Callable[[dict[str, int]], dict[str, int]], *fragments: str,
             grow: int = 0) -> Callable[[Path], Built]:
    """Rewrite tensor-table offsets (name -> data offset) and append ``grow`` bytes to the file."""

    def build(folder: Path) -> Built:
        path = write_llama_gguf(folder / "model" / "model.gguf")
        blob = path.read_bytes()
        fields = {name: field_offsets(blob, name).data_offset for name in TENSORS}
        now = {name: int.from_bytes(blob[at:at + 8], "little") for name, at in fields.items()}
        for name, offset in change(now).items():
            patch(path, fields[name], "<Q", offset)
        if grow:
            with path.open("ab") as fh:
                fh.write(bytes(grow))
        return Built(path, (str(path), *fragments))

    return build


TENSORS = ("token_embd.weight", "blk.0.attn_q.weight", "blk.0.attn_output.weight", "output.weight")
"""Enough of the tiny Llama's tensor table: embedding and output are 8192 bytes, q and o 4096, o after q."""

CASES: list[CorpusCase] = [
    CorpusCase("gguf-alignment-not-power-of-two", _typed_alignment(3, GGUFValueType.UINT32, "is 3",
                                                                   "expected a power of two"),
               CheckpointFormatError),
    CorpusCase("gguf-alignment-zero", _typed_alignment(0, GGUFValueType.UINT32, "is 0", "expected a power of two"),
               CheckpointFormatError),
    CorpusCase("gguf-alignment-int32", _typed_alignment(32, GGUFValueType.INT32, "INT32", "UINT32"),
               CheckpointFormatError),
    CorpusCase("gguf-alignment-uint64", _typed_alignment(32, GGUFValueType.UINT64, "UINT64", "UINT32"),
               CheckpointFormatError),
    CorpusCase("gguf-alignment-float32", _typed_alignment(32.0, GGUFValueType.FLOAT32, "FLOAT32", "UINT32"),
               CheckpointFormatError),
    CorpusCase("gguf-alignment-string", _typed_alignment("32", GGUFValueType.STRING, "STRING", "UINT32"),
               CheckpointFormatError),
    CorpusCase("gguf-tensors-share-bytes",
               _offsets(lambda o: {"output.weight": o["token_embd.weight"]}, "tensor 'output.weight'",
                        "overlaps tensor 'token_embd.weight'"), CheckpointFormatError),
    CorpusCase("gguf-offsets-out-of-table-order",
               _offsets(lambda o: {"blk.0.attn_q.weight": o["blk.0.attn_output.weight"],
                                   "blk.0.attn_output.weight": o["blk.0.attn_q.weight"]},
                        "tensor 'blk.0.attn_q.weight'", "ggml requires 8320"), CheckpointFormatError),
    CorpusCase("gguf-gap-before-a-tensor", _offsets(lambda o: {"output.weight": o["output.weight"] + 32},
                                                    "tensor 'output.weight'", "ggml requires 82560", grow=32),
               CheckpointFormatError),
]


@pytest.mark.parametrize("case", case_params(CASES))
def test_a_layout_ggml_refuses_is_refused(case: CorpusCase, tmp_path: Path) -> None:
    assert_load_refused(case, tmp_path)
