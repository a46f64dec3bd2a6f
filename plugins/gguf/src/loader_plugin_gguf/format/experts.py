"""llama.cpp's mixture-of-experts tensors as the per-expert tensors a Hugging Face checkpoint has.

llama.cpp stores each MoE layer's experts as three 3-D tensors, experts outermost
(``blk.N.ffn_gate_exps.weight`` ``[experts, intermediate, hidden]`` in torch order, ``ffn_up_exps`` alike,
``ffn_down_exps`` ``[experts, hidden, intermediate]``). Each expert's matrix is one contiguous run of whole
ggml rows, so :func:`split_experts` views it as a 2-D :class:`~.tensors.GGUFTensor` of its own, named as
``transformers`` names it (``...experts.3.gate_proj.weight``): the fused-experts layer then skips another
rank's experts unread (expert parallelism), narrows an expert's rows or columns (tensor parallelism) exactly
as for a dense GGUF matrix, and a packed method packs each expert from its own blocks.

Qwen2-MoE's shared-expert gate ``ffn_gate_inp_shexp`` is a one-row matrix ``[1, hidden]`` in the converter's
files; a file that stores it as a vector ``[hidden]`` (ggml does not tell the two apart when it computes)
gets :class:`RowVector`, which presents the vector as the model's one-row linear over the same bytes.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import torch

from loader.errors import ShapeMismatchError
from loader.weights import CheckpointTensor, FileSpan, ReadStats

from .header import TensorInfo
from .tensors import GGUFTensor, MappedFile

__all__ = ["EXPERT_TENSOR", "RowVector", "per_expert_name", "split_experts"]

EXPERT_TENSOR = re.compile(r"^blk\.\d+\.ffn_(gate|up|down)_exps\.weight$")
"""The GGUF names of 3-D tensors holding every expert of a layer."""

_PER_EXPERT = re.compile(r"\.experts\.([A-Za-z0-9_]+)\.weight$")


def per_expert_name(hf_name: str, expert: int) -> str:
    """``...experts.gate_proj.weight`` -> ``...experts.{expert}.gate_proj.weight`` (Mixtral: ``...w1.weight``)."""
    match = _PER_EXPERT.search(hf_name)
    if match is None:
        raise ValueError(f"{hf_name!r} is not the name of a tensor of every expert")
    return f"{hf_name[:match.start()]}.experts.{expert}.{match.group(1)}.weight"


def split_experts(info: TensorInfo, mapped: MappedFile, stats: ReadStats, hf_name: str,
                  expert_count: int | None) -> Iterator[tuple[str, GGUFTensor]]:
    """Each expert of the 3-D tensor ``info`` as ``(per-expert HF name, 2-D tensor)``; nothing is read.

    :param expert_count: the file's ``{arch}.expert_count`` (``None``: not stated).
    :raises ShapeMismatchError: the tensor is not 3-D, or its experts are not ``expert_count``.
    """
    where = f"tensor {info.name!r} ({hf_name}) in {mapped.path}"
    if len(info.shape) != 3:
        raise ShapeMismatchError(f"{where}: a tensor of every expert must be 3-D [experts, rows, columns], "
                                 f"found shape {info.shape}")
    experts, rows, cols = info.shape
    if expert_count is not None and experts != expert_count:
        raise ShapeMismatchError(f"{where}: holds {experts} experts along dim 0, but the metadata says "
                                 f"expert_count={expert_count}")
    per_expert = info.nbytes // experts if experts else 0
    for expert in range(experts):
        one = TensorInfo(info.name, (rows, cols), info.ggml_type, info.offset + expert * per_expert, per_expert)
        name = per_expert_name(hf_name, expert)
        yield name, GGUFTensor(one, mapped, stats, name)


class RowVector(CheckpointTensor):
    """A stored vector ``[n]`` seen as the one-row matrix ``[1, n]`` a model's linear layer holds."""

    def __init__(self, base: CheckpointTensor) -> None:
        if base.ndim != 1:
            raise ShapeMismatchError(f"{base.describe()}: expected a vector, found shape {tuple(base.shape)}")
        self.base = base
        self.name = base.name
        self.file = base.file

    @property
    def shape(self) -> tuple[int, ...]:
        return (1, *self.base.shape)

    @property
    def dtype(self) -> torch.dtype:
        return self.base.dtype

    @property
    def stored_type(self) -> str:
        return self.base.stored_type

    @property
    def nbytes(self) -> int:
        return self.base.nbytes

    def describe(self) -> str:
        return self.base.describe()

    def narrow(self, dim: int, start: int, length: int) -> CheckpointTensor:
        dim = self.check_narrow(dim, start, length)
        if dim == 0:
            return self
        return RowVector(self.base.narrow(0, start, length))

    def file_span(self) -> FileSpan | None:
        return self.base.file_span()

    def read(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        return self.base.read(dtype).reshape(self.shape)

    def read_into(self, out: torch.Tensor) -> None:
        self.check_destination(out)
        self.base.read_into(out.view(-1) if out.is_contiguous() else out[0])
