"""Checkpoint tensors: narrowing before reading, permuted rows, the rotary layout helper."""

from __future__ import annotations

import pytest
import torch

from loader.errors import CheckpointFormatError, ShapeMismatchError
from loader.weights import EagerTensor, ReadStats, RowPermutedTensor, interleaved_to_half_rotary


class RecordingTensor(EagerTensor):
    """An eager tensor that remembers which rows of the original were read."""

    def __init__(self, tensor: torch.Tensor, rows: range | None = None, log: list[range] | None = None) -> None:
        super().__init__(tensor, "w", "f.bin")
        self.rows = rows if rows is not None else range(tensor.shape[0])
        self.log = log if log is not None else []

    def narrow(self, dim: int, start: int, length: int) -> RecordingTensor:
        dim = self.check_narrow(dim, start, length)
        rows = self.rows[start:start + length] if dim == 0 else self.rows
        return RecordingTensor(self.tensor.narrow(dim, start, length), rows, self.log)

    def read(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        self.log.append(self.rows)
        return super().read(dtype)


def test_eager_narrow_and_read_into_converts_dtype() -> None:
    t = torch.randn(6, 4)
    out = torch.empty(2, 4, dtype=torch.bfloat16)
    EagerTensor(t).narrow(0, 2, 2).read_into(out)
    assert torch.equal(out, t[2:4].to(torch.bfloat16))


def test_read_into_checks_shape() -> None:
    with pytest.raises(ShapeMismatchError, match=r"tensor 'w' in f.bin: expected shape \(3, 4\), found \(2, 4\)"):
        EagerTensor(torch.zeros(2, 4), "w", "f.bin").read_into(torch.empty(3, 4))


def test_narrow_out_of_range_names_tensor() -> None:
    with pytest.raises(CheckpointFormatError, match=r"tensor 'w' in f.bin: slice \[3, 7\) is outside dim 0 of size 6"):
        EagerTensor(torch.zeros(6, 2), "w", "f.bin").narrow(0, 3, 4)


def test_row_permuted_reads_only_the_span_it_needs() -> None:
    base = RecordingTensor(torch.arange(16.0).view(8, 2))
    perm = torch.tensor([1, 0, 3, 2, 5, 4, 7, 6])
    permuted = RowPermutedTensor(base, perm)
    half = permuted.narrow(0, 4, 4)
    assert torch.equal(half.read(), torch.arange(16.0).view(8, 2)[perm[4:]])
    assert base.log == [range(4, 8)]
    assert half.nbytes == 4 * 2 * 4


def test_interleaved_to_half_rotary_undoes_hf_permute() -> None:
    n_heads, head_dim, dim = 3, 8, 5
    hf = torch.randn(n_heads * head_dim, dim)
    # what llama.cpp's converter (and Meta's original layout) does to HF rows
    interleaved = hf.view(n_heads, 2, head_dim // 2, dim).transpose(1, 2).reshape(n_heads * head_dim, dim)
    restored = interleaved_to_half_rotary(EagerTensor(interleaved), n_heads)
    assert torch.equal(restored.read(), hf)
    # narrowing whole heads commutes with the permutation
    assert torch.equal(restored.narrow(0, head_dim, head_dim).read(), hf[head_dim:2 * head_dim])


def test_interleaved_to_half_rotary_rejects_bad_head_count() -> None:
    with pytest.raises(ShapeMismatchError, match="12 rows cannot be split into 5 rotary heads"):
        interleaved_to_half_rotary(EagerTensor(torch.zeros(12, 2), "q", "f"), 5)


def test_read_stats_adds_up() -> None:
    stats = ReadStats()
    stats.add(10, tensors=1)
    stats.add(5)
    assert (stats.bytes_read, stats.tensors_read) == (15, 1)
