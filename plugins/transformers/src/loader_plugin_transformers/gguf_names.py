"""GGUF tensor names and values -> a transformers model's own, as transformers' GGUF loading maps them.

The names come from gguf-py's ``TensorNameMap`` for the file's architecture,
asked for every ``state_dict`` name of the built model, as transformers'
``get_gguf_hf_weights_map`` does (a name is also tried relative to each
submodule, since llama.cpp may have converted a base model). Values are
rewritten where transformers' tensor processor for the architecture rewrites
them: Gemma 2/3 norms are stored by llama.cpp with the ``+1`` folded in, GPT-2's
``Conv1D`` weights transposed and its head as ``output.weight``. Reads stay
lazy: a rewritten tensor is still narrowed before its bytes are read.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from loader.errors import UnexpectedWeightError
from loader.weights import CheckpointTensor

from .transposed import TransposedTensor, WrappedTensor

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = ["ShiftedTensor", "gguf_to_hf_names", "rename_gguf_weights"]

_GPT2_TRANSPOSED = ("attn_qkv.weight", "ffn_down.weight", "ffn_up.weight", "attn_output.weight")
_GEMMA = ("gemma2", "gemma3")
_SKIPPED = ("rope_freqs.weight",)  # precomputed rotary tables: the model computes its own


class ShiftedTensor(WrappedTensor):
    """``inner + offset``, computed in float32 (as transformers does on the dequantized values)."""

    def __init__(self, inner: CheckpointTensor, offset: float) -> None:
        super().__init__(inner)
        self.offset = offset

    def describe(self) -> str:
        return f"{self.inner.describe()} (shifted by {self.offset:+g}, llama.cpp's norm convention)"

    def narrow(self, dim: int, start: int, length: int) -> CheckpointTensor:
        dim = self.check_narrow(dim, start, length)
        return ShiftedTensor(self.inner.narrow(dim, start, length), self.offset)

    def read(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        import torch

        values = self.inner.read(torch.float32) + self.offset
        return values.to(dtype or self.inner.dtype)


def _gguf_arch_member(arch: str) -> object:
    from gguf import MODEL_ARCH_NAMES

    for member, name in MODEL_ARCH_NAMES.items():
        if name == arch:
            return member
    raise UnexpectedWeightError(f"GGUF architecture {arch!r} is unknown to the installed gguf-py")


def gguf_to_hf_names(hf_model: nn.Module, arch: str, num_layers: int) -> dict[str, str]:
    """``GGUF tensor name -> state_dict name`` for ``hf_model`` (the first match wins, outermost first)."""
    from gguf import get_tensor_name_map

    table = get_tensor_name_map(_gguf_arch_member(arch), num_layers)  # type: ignore[arg-type]
    names = list(hf_model.state_dict())
    mapping: dict[str, str] = {}
    depth = 0
    while True:
        tried = False
        for hf_name in names:
            parts = hf_name.split(".")
            if len(parts) <= depth + 1:
                continue
            tried = True
            relative = ".".join(parts[depth:])
            stem, suffix = relative, ""
            if relative.endswith((".weight", ".bias")):
                stem, _, leaf = relative.rpartition(".")
                suffix = f".{leaf}"
            gguf_name = table.get_name(stem)
            if gguf_name is not None:
                mapping.setdefault(gguf_name + suffix, hf_name)
        if not tried:
            return mapping
        depth += 1


def _rewritten(arch: str, gguf_name: str, tensor: CheckpointTensor) -> CheckpointTensor:
    if arch in _GEMMA and gguf_name.endswith("norm.weight"):
        return ShiftedTensor(tensor, -1.0)
    if arch == "gpt2" and gguf_name.endswith(_GPT2_TRANSPOSED) and gguf_name != "output.weight":
        return TransposedTensor(tensor)
    return tensor


def rename_gguf_weights(weights: Iterable[tuple[str, CheckpointTensor]], names: dict[str, str], *, arch: str,
                        label: str) -> Iterator[tuple[str, CheckpointTensor]]:
    """Each GGUF tensor under its transformers name, rewritten as transformers rewrites it."""
    for gguf_name, tensor in weights:
        if gguf_name in _SKIPPED:
            continue
        if arch == "gpt2" and gguf_name == "output.weight":
            yield "lm_head.weight", tensor
            continue
        hf_name = names.get(gguf_name)
        if hf_name is None:
            raise UnexpectedWeightError(f"{tensor.describe()}: GGUF tensor {gguf_name!r} has no place in {label} "
                                        f"(gguf-py's {arch!r} names map no parameter of it to this name)")
        yield hf_name, _rewritten(arch, gguf_name, tensor)
